"""The CUDA kernels compiled by NVRTC, and the names and types the Python side launches them with.

The sources (``SOURCES``: common.cuh, then one file per part) include nothing: they are concatenated into one
text, so that NVRTC needs no include path and CuPy's disk cache, keyed by the text, sees every line. A call
asks for the template instances it launches (name expressions) and gets one RawModule, compiled for the
running device's arch in one NVRTC run and cached per process, per device and per set of defines.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bigknn.core import envvars

SOURCES = ("common.cuh", "gnnd.cu", "cross.cu", "ggm.cu", "exact.cu", "exact_fused.cu", "search_keys.cu", "search.cu",
           "prune.cu")
CTYPES = {
    np.dtype(np.float32): "float",
    np.dtype(np.float16): "unsigned short",
    np.dtype(np.uint8): "unsigned char",
    np.dtype(np.int8): "signed char",
}
MAX_K = 128  # longest list the kernels hold (one warp's shared-memory rows)
MAX_P = 32  # largest p the cross-match kernels are built for
_MODULES: dict = {}


def source() -> str:
    """The one CUDA source text every module is compiled from."""
    here = Path(__file__).parent
    return "".join((here / name).read_text() for name in SOURCES)


def compile_kernels(name_expressions: tuple[str, ...], system_atomics: bool = False):
    """RawModule holding the extern "C" kernels plus the named template instances (cached). ``system_atomics``:
    the descent's atomics act across GPUs (common.cuh GNND_SYSTEM_ATOMICS; a descent that spans GPUs)."""
    import cupy as cp

    # BIGKNN_CUDA_GUNR: loads in flight per thread in the cross-match gather (experiments; 0 = default)
    # BIGKNN_CUDA_MODE: diagnostics (1: cross-match emits nothing, 2: nor computes distances); never in use
    defines = tuple(f"-DGNND_GUNR={v}" for v in [envvars.integer("BIGKNN_CUDA_GUNR")] if v is not None)
    defines += tuple(f"-DGNND_MODE={v}" for v in [envvars.integer("BIGKNN_CUDA_MODE")] if v is not None)
    defines += ("-DGNND_SYSTEM_ATOMICS=1",) if system_atomics else ()
    device = cp.cuda.Device().id  # a loaded module belongs to one device's context (several GPUs: one each)
    mod = _MODULES.get((name_expressions, defines, device))
    if mod is not None:
        return mod
    for (names, defs, dev), mod in _MODULES.items():  # a module compiled for a superset serves too
        if dev == device and defs == defines and set(name_expressions) <= set(names):
            return mod
    src = source()
    cc = cp.cuda.Device().compute_capability
    errors = []
    for opts in (("-std=c++17", f"-arch=sm_{cc}") + defines, ("-std=c++17",) + defines):
        try:
            mod = cp.RawModule(code=src, options=opts, name_expressions=list(name_expressions))
            mod.compile()
            break
        except Exception as e:  # some CuPy versions add their own -arch and reject a second one
            errors.append(e)
            mod = None
    if mod is None:
        raise errors[-1]
    _MODULES[(name_expressions, defines, device)] = mod
    return mod


def sync_check(cp) -> None:
    """With BIGKNN_CUDA_CHECK set, wait for each kernel, so that a fault names the launch that caused it."""
    if envvars.flag("BIGKNN_CUDA_CHECK", False):
        cp.cuda.get_current_stream().synchronize()


def dtype_of(x) -> np.dtype:
    """The element type the kernels read ``x`` in: its own where they have one, else float32."""
    dt = np.dtype(x.dtype)
    return dt if dt in CTYPES else np.dtype(np.float32)


def ctype_of(x) -> str:
    return CTYPES[dtype_of(x)]


def padded_dim(d: int, itemsize: int) -> int:
    """Row length the kernels read: d rounded up to whole 16-byte units and to a multiple of 8."""
    align = max(16 // itemsize, 8)
    return -(-d // align) * align


def dpad_of(x) -> int:
    return padded_dim(x.shape[1], dtype_of(x).itemsize)


def _next_pow2(v: int) -> int:
    return 1 << max(0, (int(v) - 1).bit_length())


def cross_shape(p: int) -> tuple[int, int, int]:
    """(MAXN, TR, TC) of the cross-match for p samples: sample slots per kind and the register tile."""
    maxn = max(8, _next_pow2(2 * p))
    tr, tc = (4, 4) if maxn >= 32 else (2, 2)
    return maxn, tr, tc


def cross_name(ctype: str, m: int, p: int, dpad: int, expand: bool, cross: bool, tensor_cores: bool) -> str:
    """Name expression of the gnnd_cross instance for these rows, metric and sample count (``cross``: GGM's
    NEW x OLD variant; ``tensor_cores``: whether tensor-core tiles are allowed, see uses_mma)."""
    maxn, tr, tc = cross_shape(p)
    dc_lim = 128 if maxn <= 32 else 64  # keeps the static shared memory under 48 KB
    dc = dpad if dpad <= dc_lim else dc_lim
    e = 1 if (expand and m == 0) else 0
    mma = int(uses_mma(ctype, m, p, expand, tensor_cores))
    return f"gnnd_cross<{ctype}, {m}, {e}, {maxn}, {tr}, {tc}, {dc}, {1 if cross else 0}, {mma}>"


def uses_mma(ctype: str, m: int, p: int, expand: bool, tensor_cores: bool) -> bool:
    """Whether the cross-match tiles run on tensor cores (cross.cu, MMA): half rows, a dot-product key
    (ip, or l2 by the norm expansion), at least 16 samples a side, and tensor cores allowed."""
    dot = m == 1 or (m == 0 and expand)
    return ctype == "unsigned short" and cross_shape(p)[0] >= 16 and dot and tensor_cores
