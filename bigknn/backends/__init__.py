"""Backend selection through the registry (registry.py): ``auto`` takes the GPU(s) when CuPy and a CUDA
device are present, else the CPU."""

from __future__ import annotations

from bigknn.backends import registry
from bigknn.backends.base import Backend, CallShape, MemoryModel
from bigknn.backends.registry import Entry, register
from bigknn.core.errors import BadInput

register(Entry("cuda", "bigknn.backends.cuda", memory_model="bigknn.backends.cuda.memory",
               missing="needs CuPy and a CUDA device; none found (install bigknn[gpu-cuda12] or [gpu-cuda13], "
                       "or use --backend cpu)"))
register(Entry("cpu", "bigknn.backends.cpu", missing="cannot run here"))

BACKENDS = registry.names()

__all__ = ["BACKENDS", "Backend", "CallShape", "MemoryModel", "device_memory_model", "get_backend", "get_backends",
           "takes_device"]

device_memory_model = registry.device_memory_model
takes_device = registry.takes_device


def get_backends(name: str = "auto", gpus: str | None = None, gpu_mem_bytes: int | None = None,
                 threads: int | None = None) -> list[Backend]:
    """One backend per worker: one per selected GPU (``gpus``: "all" or "0,1"; default the first GPU),
    or a single CPU worker on ``threads`` cores (None: all)."""
    registry.check_name(name)
    chosen = _gpu_list(gpus)  # checked even where no GPU will be used
    return registry.make(name, chosen, gpu_mem_bytes, threads)


def get_backend(name: str = "auto", gpu_mem_bytes: int | None = None) -> Backend:
    """The backend of a single worker (evaluation, one-off calls)."""
    return get_backends(name, None, gpu_mem_bytes)[0]


def _gpu_list(gpus: str | None) -> registry.Gpus:
    """``--gpus`` parsed: None (GPU 0), "all", or device ids."""
    if gpus is None or gpus == "all":
        return gpus
    try:
        return [int(g) for g in gpus.split(",")]
    except ValueError:
        raise BadInput(f"--gpus {gpus}", "takes 'all' or device ids like 0,1") from None
