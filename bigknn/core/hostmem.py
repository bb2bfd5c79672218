"""Large host arrays that many threads fill once (a graph copied back from the device), in huge pages where the
kernel gives them: the first touch of fresh memory costs a page fault per 4 KiB, which made copying a 50M-row
graph back from the GPU run at a fraction of the bus's rate."""

from __future__ import annotations

import mmap
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import numpy as np

HUGE_PAGE_BYTES = 64 << 20  # arrays at least this large are asked for in huge pages
PAGE_BYTES = 4096  # one store per (small) page faults every page in
TOUCH_THREADS = 8
BLOCK_ROWS_MIN = 1 << 16  # in_row_blocks: fewer rows a thread are filled on the calling thread alone


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


def in_row_blocks(rows: int, fill: Callable[[int, int], None], threads: int = TOUCH_THREADS) -> None:
    """``fill(start, stop)`` over [0, rows) in ``threads`` contiguous blocks at once (NumPy drops the GIL for
    its copies): a large array's first writes fault its pages in on every thread, not one."""
    step = -(-rows // threads) if rows >= threads * BLOCK_ROWS_MIN else max(rows, 1)
    blocks = [(a, min(a + step, rows)) for a in range(0, rows, step)]
    if len(blocks) <= 1:
        for a, b in blocks:
            fill(a, b)
        return
    with ThreadPoolExecutor(len(blocks), thread_name_prefix="fill") as pool:
        for f in [pool.submit(fill, a, b) for a, b in blocks]:
            f.result()


def touched_later(shape: tuple[int, ...], dtype: np.dtype | type) -> Future:
    """A future of ``filled_once``'s array with every page already written, by background threads: the first-touch
    faults (the kernel zeroing pages, and on a fresh virtual machine the hypervisor backing them) are paid while
    the caller computes, not inside the copy that fills the array. The caller keeps the future until it copies in.
    """
    out = filled_once(shape, dtype)
    flat = out.reshape(-1).view(np.uint8)
    future: Future = Future()
    if flat.nbytes < HUGE_PAGE_BYTES:
        future.set_result(out)
        return future
    step = -(-flat.nbytes // (TOUCH_THREADS * PAGE_BYTES)) * PAGE_BYTES
    spans = [(a, min(a + step, flat.nbytes)) for a in range(0, flat.nbytes, step)]

    def touch_all() -> None:  # on a thread of its own per call: concurrent callers (GPU workers) do not queue
        try:
            with ThreadPoolExecutor(len(spans), thread_name_prefix="touch") as pool:
                # NumPy drops the GIL for a strided scalar store: the pages fault in parallel
                for f in [pool.submit(flat[a:b:PAGE_BYTES].fill, 0) for a, b in spans]:
                    f.result()
            future.set_result(out)
        except BaseException as e:  # handed to the caller's result()
            future.set_exception(e)

    threading.Thread(target=touch_all, name="touch-ahead", daemon=True).start()
    return future
