"""CUDA backend (CuPy + CUDA C++ kernels). Importing this package never imports CuPy."""

from __future__ import annotations

from bigknn.backends.cuda.backend import CudaBackend
from bigknn.core.errors import BadInput

__all__ = ["CudaBackend", "available", "cuda_available", "make_backends"]


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy
    except Exception:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


available = cuda_available  # the registry's availability check (bigknn/backends/registry.py)


def make_backends(gpus: list[int] | str | None, gpu_mem_bytes: int | None, threads: int | None) -> list[CudaBackend]:
    """One backend per chosen GPU (``gpus``: None for GPU 0, "all", or device ids); ``threads`` is the CPU's."""
    return [CudaBackend(gpu_mem_bytes=gpu_mem_bytes, device=d) for d in _devices(gpus)]


def _devices(chosen: list[int] | str | None) -> list[int]:
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    if chosen is None:
        return [0]
    if chosen == "all":
        return list(range(count))
    bad = [g for g in chosen if not 0 <= g < count]
    if bad:
        raise BadInput(f"--gpus {','.join(map(str, chosen))}", f"no device {bad[0]} (this machine has {count})")
    return chosen
