"""Backend selection: ``auto`` takes the GPU(s) when CuPy and a CUDA device are present."""

from __future__ import annotations

from bigknn.backends.base import Backend

BACKENDS = ("auto", "cpu", "cuda")

__all__ = ["BACKENDS", "Backend", "get_backend", "get_backends"]


def get_backends(name: str = "auto", gpus: str | None = None, gpu_mem_bytes: int | None = None) -> list[Backend]:
    """One backend per worker: one per selected GPU (``gpus``: "all" or "0,1"; default the first GPU),
    or a single CPU worker."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name in ("auto", "cuda"):
        from bigknn.backends.cuda import CudaBackend, cuda_available

        if cuda_available():
            return [CudaBackend(gpu_mem_bytes=gpu_mem_bytes, device=d) for d in _devices(gpus)]
        if name == "cuda":
            raise RuntimeError("backend 'cuda' needs CuPy and a CUDA device; none found (try --backend cpu)")
    from bigknn.backends.cpu import CpuBackend

    return [CpuBackend()]


def get_backend(name: str = "auto", gpu_mem_bytes: int | None = None) -> Backend:
    """The backend of a single worker (evaluation, one-off calls)."""
    return get_backends(name, None, gpu_mem_bytes)[0]


def _devices(gpus: str | None) -> list[int]:
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    if gpus is None:
        return [0]
    if gpus == "all":
        return list(range(count))
    try:
        chosen = [int(g) for g in gpus.split(",")]
    except ValueError:
        raise ValueError(f"--gpus takes 'all' or ids like 0,1; got {gpus!r}") from None
    bad = [g for g in chosen if not 0 <= g < count]
    if bad:
        raise ValueError(f"--gpus {gpus}: no device {bad[0]} (this machine has {count})")
    return chosen
