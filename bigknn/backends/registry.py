"""The backends this installation knows: each registers its name, whether it can run here, how to make its
workers, and (a device backend) the memory model the planner sizes shards with. Nothing outside
bigknn/backends/ names a backend or imports its package: callers ask the registry or the Backend
contract (base.py), never ``backend.name``.

Entries load their package only when asked (the CUDA package is imported to check for a device, never CuPy
at import), and ``auto`` takes the first available entry in preference order: a device before the CPU.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from bigknn.backends.base import Backend, MemoryModel
from bigknn.core.errors import BadInput

Gpus = list[int] | str | None  # ``--gpus`` parsed: None (the first device), "all", or device ids
# (gpus, gpu_mem_bytes, threads) -> one backend per worker
Factory = Callable[[Gpus, "int | None", "int | None"], list[Backend]]


@dataclass(frozen=True)
class Entry:
    """One backend: ``module`` holds ``available() -> bool`` and ``make_backends(gpus, gpu_mem_bytes,
    threads)``; a device backend's ``memory_model`` module answers the MemoryModel contract (importable
    without the device's libraries). ``missing``: why it cannot run, said when it is asked for by name."""

    name: str
    module: str
    missing: str
    memory_model: str | None = None

    def available(self) -> bool:
        return bool(importlib.import_module(self.module).available())

    def factory(self) -> Factory:
        return importlib.import_module(self.module).make_backends

    @property
    def device(self) -> bool:
        """Whether its workers compute on a device (and one per device is made)."""
        return self.memory_model is not None


_ENTRIES: list[Entry] = []  # in preference order: ``auto`` takes the first available


def register(entry: Entry) -> None:
    if any(e.name == entry.name for e in _ENTRIES) or entry.name == "auto":
        raise ValueError(f"backend {entry.name!r} is registered twice")
    _ENTRIES.append(entry)


def names() -> tuple[str, ...]:
    """The ``--backend`` choices: ``auto`` and every registered backend, by name."""
    return ("auto", *sorted(e.name for e in _ENTRIES))


def check_name(name: str) -> None:
    """BadInput unless ``name`` is ``auto`` or a registered backend."""
    if name not in names():
        raise BadInput(f"--backend {name}", f"unknown backend; choose one of {', '.join(names())}")


def resolve(name: str) -> Entry:
    """The entry ``name`` picks here: itself (BadInput when it cannot run here), or for ``auto`` the first
    available."""
    check_name(name)
    if name == "auto":
        return next(e for e in _ENTRIES if e.available())
    entry = next(e for e in _ENTRIES if e.name == name)
    if not entry.available():
        raise BadInput(f"--backend {name}", entry.missing)
    return entry


def takes_device(name: str) -> bool:
    """Whether ``--backend name`` runs on a device here (its workers must each be given their own)."""
    if name not in names():
        return False
    return any(e.device and e.available() for e in _ENTRIES if name in ("auto", e.name))


def make(name: str, gpus: Gpus, gpu_mem_bytes: int | None, threads: int | None) -> list[Backend]:
    """One backend per worker of the backend ``name`` picks."""
    return resolve(name).factory()(gpus, gpu_mem_bytes, threads)


def device_memory_model() -> MemoryModel:
    """The memory model of the preferred device backend, whether or not a device is present: what a plan made
    here for a device elsewhere sizes its shards with."""
    entry = next(e for e in _ENTRIES if e.memory_model is not None)
    return importlib.import_module(entry.memory_model)
