"""Nearest-centroid searches: each row's ``count`` nearest centroids (ids, squared L2), ascending.

The labelling pass asks one per row of the input (``count`` 1) and ``NEAREST`` for the rows that spill; k-means
asks one per sample row in each Lloyd step. The backend answers (Backend.nearest_centroids); both backends run
``nearest_by_blocks`` here, the CPU backend and k-means on a sample with NumPy, the CUDA backend with CuPy on
its GPU: one GEMM per block of rows, keys |c|^2 - 2 x.c, a row's |x|^2 added to its chosen keys only.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

import numpy as np

Nearest = Callable[[np.ndarray, int, np.ndarray], tuple[np.ndarray, np.ndarray]] | None  # None: NumPy's

NUMPY_BLOCK_ROWS = 16_384  # rows per GEMM of ``nearest_numpy``
DEVICE_BLOCK_BYTES = 256 << 20  # a device block's (rows, C) float32 keys and float32 rows, together


def nearest_numpy(x: np.ndarray, count: int, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``Nearest`` in NumPy, by blocks of ``NUMPY_BLOCK_ROWS`` (``nearest_by_blocks``), so the (rows, C)
    temporaries stay small: much faster against a few centroids than the CPU backend's exact k-NN."""
    return nearest_by_blocks(np, x, count, centroids, NUMPY_BLOCK_ROWS)


def device_block_rows(centroids: int, dim: int) -> int:
    """Rows per block on a GPU: the block's keys and its float32 rows within ``DEVICE_BLOCK_BYTES``."""
    return max(1, DEVICE_BLOCK_BYTES // (4 * (centroids + dim)))


def nearest_by_blocks(xp: ModuleType, x: np.ndarray, count: int, centroids: np.ndarray,
                      block_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``Nearest`` with the array module ``xp`` (NumPy, or CuPy on the current device), ``block_rows`` rows per
    GEMM. ``x`` is a host array: each block goes to ``xp`` in its own dtype (uint8: a quarter of the bytes of
    float32) and is made float32 there; the answer (int64 ids, float32 squared distances) comes back to the
    host. Keys are ordered by |c|^2 - 2 x.c; the row's own |x|^2 is added to the chosen keys only."""
    host: Callable[[Any], np.ndarray] = np.asarray if xp is np else xp.asnumpy
    c = xp.asarray(centroids, dtype=xp.float32)
    minus_2c, c_norms = -2.0 * c.T, xp.einsum("ij,ij->i", c, c)
    ids = np.empty((len(x), count), np.int64)
    d2 = np.empty((len(x), count), np.float32)
    for lo in range(0, len(x), block_rows):
        xs = xp.asarray(x[lo:lo + block_rows]).astype(xp.float32, copy=False)
        keys = xs @ minus_2c
        keys += c_norms
        part, chosen = _smallest(xp, keys, count)
        chosen = chosen + xp.einsum("ij,ij->i", xs, xs)[:, None]
        ids[lo:lo + len(xs)] = host(part)
        d2[lo:lo + len(xs)] = host(xp.maximum(chosen, 0.0))
    return ids, d2


def _smallest(xp: ModuleType, keys: Any, count: int) -> tuple[Any, Any]:
    """Column ids of each row's ``count`` smallest keys and those keys, ascending (``keys`` may be overwritten).
    NumPy: argpartition, then a sort of the chosen. Other modules: ``count`` argmins (``_argmins``), since
    CuPy's argpartition sorts every row in full."""
    if count == 1:
        part = keys.argmin(axis=1)[:, None]
        return part, xp.take_along_axis(keys, part, axis=1)
    if count >= keys.shape[1]:
        part = xp.broadcast_to(xp.arange(keys.shape[1]), keys.shape)
    elif xp is np:
        part = np.argpartition(keys, count - 1, axis=1)[:, :count]
    else:
        return _argmins(xp, keys, count)
    chosen = xp.take_along_axis(keys, part, axis=1)
    order = xp.argsort(chosen, axis=1)
    return xp.take_along_axis(part, order, axis=1), xp.take_along_axis(chosen, order, axis=1)


def _argmins(xp: ModuleType, keys: Any, count: int) -> tuple[Any, Any]:
    """Each row's ``count`` smallest keys and their column ids, ascending (ties: the lower id first), by
    ``count`` passes of argmin over ``keys``, which is overwritten (each pick set to +inf)."""
    rows = xp.arange(keys.shape[0])
    part = xp.empty((keys.shape[0], count), xp.int64)
    chosen = xp.empty((keys.shape[0], count), keys.dtype)
    for j in range(count):
        pick = keys.argmin(axis=1)
        part[:, j] = pick
        chosen[:, j] = keys[rows, pick]
        keys[rows, pick] = xp.inf
    return part, chosen
