"""The prune's gathers of the columns a diversification kept (``lists.verdict_columns``' output), compiled on
every core: ``np.take_along_axis`` took ~0.3 s a call on 1M x 64 lists, 1.4 s of a 5.7 s 1M prune (H100 host,
2026-11-26); this loop ~0.1 s on 2 cores."""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True)
def _take(values, cols, empty):
    rows, width = cols.shape
    out = np.empty((rows, width), values.dtype)
    for r in prange(rows):
        for j in range(width):
            c = cols[r, j]
            out[r, j] = values[r, c] if c >= 0 else empty
    return out


def take_columns(values: np.ndarray, cols: np.ndarray, empty) -> np.ndarray:
    """values[r, cols[r, j]] per row, ``empty`` where a column is -1 (verdict_columns' padding)."""
    values = np.ascontiguousarray(values)
    return _take(values, np.ascontiguousarray(cols), values.dtype.type(empty))
