"""Backend selection: ``auto`` takes the GPU(s) when CuPy and a CUDA device are present."""

from __future__ import annotations

from bigknn.backends.base import Backend
from bigknn.errors import BadInput
from bigknn.extras import install_hint

BACKENDS = ("auto", "cpu", "cuda")

__all__ = ["BACKENDS", "Backend", "get_backend", "get_backends"]


def get_backends(name: str = "auto", gpus: str | None = None, gpu_mem_bytes: int | None = None,
                 threads: int | None = None) -> list[Backend]:
    """One backend per worker: one per selected GPU (``gpus``: "all" or "0,1"; default the first GPU),
    or a single CPU worker on ``threads`` cores (None: all)."""
    if name not in BACKENDS:
        raise BadInput(f"--backend {name}", f"unknown backend; choose one of {', '.join(BACKENDS)}")
    chosen = _gpu_list(gpus)
    if name in ("auto", "cuda"):
        from bigknn.backends.cuda import CudaBackend, cuda_available

        if cuda_available():
            return [CudaBackend(gpu_mem_bytes=gpu_mem_bytes, device=d) for d in _devices(chosen)]
        if name == "cuda":
            raise BadInput("--backend cuda", "needs CuPy and a CUDA device; none found (CuPy for your CUDA: "
                                             f"{install_hint('gpu-cuda12')}, or gpu-cuda13; or use --backend cpu)")
    from bigknn.backends.cpu import CpuBackend

    return [CpuBackend(threads=threads)]


def get_backend(name: str = "auto", gpu_mem_bytes: int | None = None) -> Backend:
    """The backend of a single worker (evaluation, one-off calls)."""
    return get_backends(name, None, gpu_mem_bytes)[0]


def _gpu_list(gpus: str | None) -> list[int] | str | None:
    """``--gpus`` parsed: None (GPU 0), "all", or device ids; checked even where no GPU will be used."""
    if gpus is None or gpus == "all":
        return gpus
    try:
        return [int(g) for g in gpus.split(",")]
    except ValueError:
        raise BadInput(f"--gpus {gpus}", "takes 'all' or device ids like 0,1") from None


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
