"""Backend selection: ``auto`` takes the GPU when CuPy and a CUDA device are present."""

from __future__ import annotations

from bigknn.backends.base import Backend, ShardPart

BACKENDS = ("auto", "cpu", "cuda")

__all__ = ["BACKENDS", "Backend", "ShardPart", "get_backend"]


def get_backend(name: str = "auto", gpu_mem_bytes: int | None = None) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name in ("auto", "cuda"):
        from bigknn.backends.cuda import CudaBackend, cuda_available

        if cuda_available():
            return CudaBackend(gpu_mem_bytes=gpu_mem_bytes)
        if name == "cuda":
            raise RuntimeError("backend 'cuda' needs CuPy and a CUDA device; none found (try --backend cpu)")
    from bigknn.backends.cpu import CpuBackend

    return CpuBackend()
