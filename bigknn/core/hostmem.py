"""Large host arrays that many threads fill once (a graph copied back from the device), in huge pages where the
kernel gives them: the first touch of fresh memory costs a page fault per 4 KiB, which made copying a 50M-row
graph back from the GPU run at a fraction of the bus's rate."""

from __future__ import annotations

import mmap

import numpy as np

HUGE_PAGE_BYTES = 64 << 20  # arrays at least this large are asked for in huge pages


def filled_once(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialised C-contiguous array; from ``HUGE_PAGE_BYTES`` on, anonymous memory advised for
    transparent huge pages (Linux; elsewhere, or where they are off, ordinary pages). It is unmapped when the
    last array viewing it goes."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < HUGE_PAGE_BYTES or advice is None:
        return np.empty(shape, dtype)
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        memory.madvise(advice)
    except OSError:
        pass  # huge pages not offered here: ordinary pages
    return np.frombuffer(memory, dtype=dtype).reshape(shape)
