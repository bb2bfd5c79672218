"""The rows of a call on the device, laid out as the kernels read them, and their half-precision copy."""

from __future__ import annotations

import numpy as np

from bigknn.backends.cuda.compile import CTYPES, padded_dim
from bigknn.backends.cuda.transfer import Transfer
from bigknn.core.metric import half_scale

HALF_MIN_DIM = 96  # float32 rows at least this wide descend on half-precision copies (half_rows). 96, not 128:
# faster at the same recall on T1 and T2 (docs/perf-notes.md, "Measurements behind the constants")
HALF_BYTES = False  # byte rows (uint8, int8) descend on half copies (exact: halves hold every byte value)


def descends_on_halves(ctype: str, d: int) -> bool:
    """Whether a descent over rows of this kernel type and width reads half-precision copies (half_rows)."""
    return (ctype == "float" and d >= HALF_MIN_DIM) or (HALF_BYTES and ctype in ("unsigned char", "signed char"))


BLOCK_BYTES = 64 << 20  # CuPy work over whole row sets goes in blocks of about this many float32 bytes:
# a reduction or copy over 2^31 elements or more compiles a kernel of its own (64-bit indices) at a machine's
# first large build, seconds each (docs/perf-notes.md, session 40), which no warm-up on small shards compiles


def row_blocks(n: int, d: int, nbytes: int = BLOCK_BYTES) -> range:
    """Starts of blocks of rows of ``nbytes`` (as float32) each; ``step`` is the block's row count."""
    return range(0, n, max(1, nbytes // (4 * d)))


def kernel_rows(raw, dpad: int):
    """Device rows (n, d) as the kernels read them: halves viewed as uint16, zero-padded to dpad columns."""
    import cupy as cp

    xd = raw.view(cp.uint16) if raw.dtype == cp.float16 else raw
    n, d = raw.shape
    if dpad != d:
        xp = cp.zeros((n, dpad), dtype=xd.dtype)
        blocks = row_blocks(n, d)
        for i in blocks:
            xp[i:i + blocks.step, :d] = xd[i:i + blocks.step]
        xd = xp
    return xd


def prepare_rows(x, transfer: Transfer):
    """(host or device array) -> (device array (n, dpad) in a kernel dtype, ctype name, d, dpad)."""
    import cupy as cp

    dt = np.dtype(x.dtype)
    if dt not in CTYPES:
        x = x.astype(np.float32)
        dt = np.dtype(np.float32)
    d = x.shape[1]
    dpad = padded_dim(d, dt.itemsize)
    if isinstance(x, cp.ndarray):
        xd = cp.ascontiguousarray(x)
    else:
        xd = cp.empty(x.shape, dtype=dt)
        transfer.h2d(x, xd)
    return kernel_rows(xd, dpad), CTYPES[dt], d, dpad


def numeric(xd, d: int):
    """Device rows as prepared for the kernels (padded, halves viewed as uint16) back as (n, d) numbers."""
    import cupy as cp

    return xd.view(cp.float16)[:, :d] if xd.dtype == cp.uint16 else xd[:, :d]


def half_rows(xd, width: int | None = None):
    """A half-precision copy of float32 rows, scaled by a power of two into half's range: (copy viewed as
    uint16, zero columns appended up to ``width``; the scale). Wide rows make the cross-match a gather of
    random rows (1M x 64 samples x 384 floats is 98 GB an iteration); halves move half of it, and feed the
    tensor cores (cross.cu's MMA tiles, exact_fused.cu's k-NN). Ranks change only between near-equal keys,
    and every kept key is recomputed from the float32 rows (gnnd_finalize, knn_exact_keys)."""
    import cupy as cp

    n, d = xd.shape
    blocks = row_blocks(n, d)
    # the largest magnitude by two reductions a block: cp.abs(xd) would be a temporary as large as the rows
    # (19 GB for 50M x 96), outside what memory.py plans for
    peaks = [cp.maximum(xd[i:i + blocks.step].max(), -xd[i:i + blocks.step].min()) for i in blocks]
    scale = half_scale(float(cp.stack(peaks).max()) if n else 0.0)
    out = cp.zeros((n, width or d), dtype=cp.float16)
    for i in blocks:
        out[i:i + blocks.step, :d] = xd[i:i + blocks.step] * np.float32(scale)
    return out.view(cp.uint16), scale


def cut(arr, width: int):
    """The first ``width`` columns of a device list array (after a widened descent)."""
    import cupy as cp

    return arr if arr.shape[1] == width else cp.ascontiguousarray(arr[:, :width])
