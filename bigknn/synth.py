"""Seeded clustered vectors with low intrinsic dimension: the benchmark workload of DESIGN.md.

C Gaussian clusters in m dims (centres ~ N(0, 4^2 I), points = centre + N(0, I)), lifted to d dims by a
random m x d matrix with entries N(0, 1/m), plus N(0, 0.05^2) noise. Generated in row blocks so that any
size streams to disk in bounded memory; the same seed gives the same rows whatever the block size.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

BLOCK_ROWS = 65536


def synth_blocks(rows: int, dim: int, clusters: int = 200, intrinsic_dim: int = 12, seed: int = 0,
) -> Iterator[np.ndarray]:
    """Yield float32 blocks of the clustered set, ``rows`` rows in all."""
    if rows < 1 or dim < 1 or clusters < 1 or intrinsic_dim < 1:
        raise ValueError("rows, dim, clusters and intrinsic_dim must be positive")
    setup = np.random.default_rng(seed)
    centres = setup.normal(0.0, 4.0, size=(clusters, intrinsic_dim))
    lift = setup.normal(0.0, np.sqrt(1.0 / intrinsic_dim), size=(intrinsic_dim, dim))
    for start in range(0, rows, BLOCK_ROWS):
        n = min(BLOCK_ROWS, rows - start)
        # one generator per fixed-size block keeps the output independent of how callers slice it
        rng = np.random.default_rng([seed, start // BLOCK_ROWS])
        labels = rng.integers(0, clusters, size=n)
        low = centres[labels] + rng.normal(size=(n, intrinsic_dim))
        x = low @ lift + rng.normal(0.0, 0.05, size=(n, dim))
        yield x.astype(np.float32)


def synth(rows: int, dim: int, clusters: int = 200, intrinsic_dim: int = 12, seed: int = 0) -> np.ndarray:
    """The whole clustered set in memory (for tests and in-memory benchmarks)."""
    return np.concatenate(list(synth_blocks(rows, dim, clusters, intrinsic_dim, seed)))
