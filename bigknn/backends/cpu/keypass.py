"""Compiled key passes outside a GNND iteration, on every core: a block of rows' keys (row_keys), the final
exact l2 keys of every list (exact_l2_resort) and the exact k-NN's fold of a tile of dot products into the
running top-k (tile_merge). The iteration's own loops are kernels.py."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from bigknn.backends.cpu.kernels import _sift_in
from bigknn.backends.cpu.keyblock import EMPTY, FAST, _key


@njit(cache=True, parallel=True, fastmath=FAST)
def row_keys(x, sq, rows, ids, is_l2):
    """Keys between each row of ``rows`` and the ids of its block (EMPTY ids: +inf), as
    descent.row_keys_local."""
    out = np.empty(ids.shape, np.float32)
    for i in prange(ids.shape[0]):
        for j in range(ids.shape[1]):
            v = ids[i, j]
            out[i, j] = np.inf if v == EMPTY else _key(x, sq, rows[i], v, is_l2)
    return out


@njit(cache=True, parallel=True, fastmath=FAST)
def exact_l2_resort(x, ids, dists, is_new):
    """descent.exact_l2_keys: every l2 key as the direct sum of squared differences, then each list
    re-sorted (stably)."""
    n, k = ids.shape
    for i in prange(n):
        keys = np.empty(k, np.float32)
        j = 0
        while j < k:
            if j + 4 <= k and min(ids[i, j], ids[i, j + 1], ids[i, j + 2], ids[i, j + 3]) != EMPTY:  # ids >= 0
                _sq_diffs4(x, i, ids[i, j], ids[i, j + 1], ids[i, j + 2], ids[i, j + 3], keys, j)
                j += 4
                continue
            keys[j] = np.inf if ids[i, j] == EMPTY else _sq_diff(x, i, ids[i, j])
            j += 1
        order = np.argsort(keys, kind="mergesort")
        row_ids = ids[i].copy()
        row_new = is_new[i].copy()
        for j in range(k):
            ids[i, j] = row_ids[order[j]]
            dists[i, j] = keys[order[j]]
            is_new[i, j] = row_new[order[j]]


@njit(cache=True, fastmath=FAST, inline="always")
def _sq_diff(x, a, b):
    s = np.float32(0.0)
    for t in range(x.shape[1]):
        diff = x[b, t] - x[a, t]
        s += diff * diff
    return s


@njit(cache=True, fastmath=FAST, inline="always")
def _sq_diffs4(x, a, c0, c1, c2, c3, out, at):
    """out[at:at + 4] = _sq_diff(a, c) for the four c: one pass over a's row, so each of its loads feeds four
    differences, where one pair per pass is bound by its two loads (docs/perf-notes.md, session 52)."""
    s0 = np.float32(0.0)
    s1 = np.float32(0.0)
    s2 = np.float32(0.0)
    s3 = np.float32(0.0)
    for t in range(x.shape[1]):
        v = x[a, t]
        e0 = x[c0, t] - v
        e1 = x[c1, t] - v
        e2 = x[c2, t] - v
        e3 = x[c3, t] - v
        s0 += e0 * e0
        s1 += e1 * e1
        s2 += e2 * e2
        s3 += e3 * e3
    out[at] = s0
    out[at + 1] = s1
    out[at + 2] = s2
    out[at + 3] = s3


@njit(cache=True, inline="always")
def _tile_key(dot, qsq, tsq, is_l2):
    """metrics.pairwise_keys of one entry, in the same float32 order: (|q|^2 + |t|^2) - 2qt clamped at 0, or -qt."""
    if is_l2:
        k = (qsq + tsq) - np.float32(2.0) * dot
        return k if k > 0 else np.float32(0.0)
    return -dot


@njit(cache=True, parallel=True)
def tile_merge(dots, qsq, tsq, first_id, best_ids, best_d, is_l2):
    """Fold a tile of dot products into each row's running top-k in place (exact.exact_knn, compiled): one
    pass per row computes each key and sifts it in where it beats the k-th (equal keys after those listed,
    in column order). One read of the tile, where a filter pass (count, then fill) and a NumPy merge of the
    candidates took 1.4-1.5x as long (docs/perf-notes.md, cpu26)."""
    nq, nt = dots.shape
    k = best_ids.shape[1]
    for r in prange(nq):
        ids, d = best_ids[r], best_d[r]
        for j in range(nt):
            key = _tile_key(dots[r, j], qsq[r], tsq[j], is_l2)
            if key < d[k - 1] or ids[k - 1] == EMPTY:
                _sift_in(ids, d, k - 1, first_id + j, key)
