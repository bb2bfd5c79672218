"""CUDA backend (CuPy + CUDA C++ kernels). Importing this package never imports CuPy."""

from __future__ import annotations

from bigknn.backends.cuda.backend import CudaBackend

__all__ = ["CudaBackend", "cuda_available"]


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
