"""How many threads the compiled CPU loops run on (``--threads``, ``bigknn.build(threads=...)``)."""

from __future__ import annotations


def use_threads(threads: int | None) -> None:
    """Run the calling thread's numba parallel loops on ``threads`` threads (None: all numba started).

    numba's setting belongs to the thread that launches a kernel, and the pipeline calls the backend
    from its worker threads, so every backend call sets it again. numba starts its pool once, with one
    thread per core it may use (NUMBA_NUM_THREADS); more than that cannot be had, so more is taken as all.
    """
    import numba

    top = numba.config.NUMBA_NUM_THREADS
    numba.set_num_threads(min(threads, top) if threads else top)
