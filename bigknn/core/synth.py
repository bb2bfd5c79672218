"""Seeded clustered vectors with low intrinsic dimension: the clustered family of docs/design.md.

C Gaussian clusters in m dims (centres ~ N(0, 4^2 I), points = centre + N(0, I)), lifted to d dims by a
random m x d matrix with entries N(0, 1/m), plus N(0, 0.05^2) noise. Generated in row blocks so that any
size streams to disk in bounded memory; the same seed gives the same rows whatever the block size.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numpy as np

BLOCK_ROWS = 65536
# integer rows: x*10 + centre, rounded and clipped into the type's range (the data has a per-coordinate std near 4)
INT_SCALE = 10.0
INT_CENTRE = {np.dtype(np.uint8): 128.0, np.dtype(np.int8): 0.0}


def synth_blocks(rows: int, dim: int, clusters: int = 200, intrinsic_dim: int = 12, seed: int = 0,
                 threads: int | None = None, first_row: int = 0) -> Iterator[np.ndarray]:
    """Yield float32 blocks of the clustered set, ``rows`` rows in all, generated on ``threads`` threads
    (NumPy's generators and matmul release the GIL; each block has its own generator, so the rows do
    not depend on the thread count).

    ``first_row``: yield rows [first_row, first_row + rows) of the set of first_row + rows rows instead: new
    rows from the same distribution (the clusters come from the seed) as a set of first_row rows, e.g. the
    batch an ingest benchmark folds into a store built from that set."""
    if rows < 1 or dim < 1 or clusters < 1 or intrinsic_dim < 1 or first_row < 0:
        raise ValueError("rows, dim, clusters and intrinsic_dim must be positive, first_row not negative")
    setup = np.random.default_rng(seed)
    centres = setup.normal(0.0, 4.0, size=(clusters, intrinsic_dim))
    lift = setup.normal(0.0, np.sqrt(1.0 / intrinsic_dim), size=(intrinsic_dim, dim))
    end = first_row + rows

    def block(start: int) -> np.ndarray:
        n = min(BLOCK_ROWS, end - start)
        rng = np.random.default_rng([seed, start // BLOCK_ROWS])
        labels = rng.integers(0, clusters, size=n)
        low = centres[labels] + rng.normal(size=(n, intrinsic_dim))
        x = low @ lift + rng.normal(0.0, 0.05, size=(n, dim))
        skip = max(0, first_row - start)
        return x[skip:].astype(np.float32)

    workers = threads or min(8, os.cpu_count() or 1)
    starts = range(first_row - first_row % BLOCK_ROWS, end, BLOCK_ROWS)
    with ThreadPoolExecutor(workers) as pool:
        ahead = 2 * workers  # blocks in flight: bounded memory whatever the size
        futures = [pool.submit(block, s) for s in starts[:ahead]]
        for i in range(len(starts)):
            out = futures[i].result()
            futures[i] = None
            if i + ahead < len(starts):
                futures.append(pool.submit(block, starts[i + ahead]))
            yield out


def synth(rows: int, dim: int, clusters: int = 200, intrinsic_dim: int = 12, seed: int = 0) -> np.ndarray:
    """The whole clustered set in memory (for tests and in-memory benchmarks)."""
    return np.concatenate(list(synth_blocks(rows, dim, clusters, intrinsic_dim, seed)))


def as_dtype(x: np.ndarray, dtype: np.dtype | str) -> np.ndarray:
    """Synthetic float rows as ``dtype``: floats cast, uint8 / int8 quantised (INT_SCALE, INT_CENTRE)."""
    dtype = np.dtype(dtype)
    if dtype in INT_CENTRE:
        info = np.iinfo(dtype)
        x = np.clip(np.rint(x * INT_SCALE + INT_CENTRE[dtype]), info.min, info.max)
    return x.astype(dtype)
