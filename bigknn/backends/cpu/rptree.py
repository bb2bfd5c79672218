"""Seed GNND's lists with random-projection-tree neighbours (compiled; the CPU's fast path).

From random lists NN-Descent spends its first iterations only finding the neighbourhood (recall 0.01 ->
0.06 -> 0.31 in the first three on 100K x 96, each costing as much as a late one). Rows that share a leaf
of an RP tree (split by the hyperplane halfway between two random rows, down to leaves of about a list's
width) are mostly near each other, and a handful of trees gives every list a good start at the cost of
about one iteration: the initialisation pynndescent uses, and the RP-tree of paper 003 (docs/design.md).
Slots the trees leave empty get random rows, which also keep far parts of the set linked.

Each row lies in one leaf per tree, so the leaves of a tree fill their rows' lists in parallel without
locks.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba import njit, prange

from bigknn.backends.cpu.descent import DescentState
from bigknn.core.knn_graph import LOCAL_ID_DTYPE
from bigknn.core.metric import Metric

from bigknn.backends.cpu.kernels import _holds, _sift_in, mix64, place
from bigknn.backends.cpu.keyblock import EMPTY, FAST, _key, keys_block, prefetch_per_pair
from bigknn.backends.cpu.prefetch import prefetch_rows
from bigknn.backends.cpu.bounds import Subspace, wide_enough

MAX_TRIES = 8  # random pairs tried for a split before the leaf is cut in half at random (duplicated rows)
SPLIT_CLIP = 4.0  # the splits' int8 rows span +-this many standard deviations of the centred values (split_rows)
SPLIT_AHEAD = 4  # a split prefetches the row this many places ahead in its (random) row order
SPLIT_KEPT = 0.99  # share of the variance the principal directions must hold for the trees to split in them


def tree_init(x: np.ndarray, width: int, metric: Metric, trees: int, rng: np.random.Generator,
              rows: np.ndarray | None = None) -> DescentState:
    """Lists of ``width`` entries, all NEW: the nearest leaf-mates of ``trees`` RP trees, then random rows
    where a list is not full. ``rows``: ``x``'s split rows, where the caller has them already (split_rows)."""
    n = len(x)
    sq = np.einsum("ij,ij->i", x, x)
    state = DescentState(np.full((n, width), EMPTY, LOCAL_ID_DTYPE), np.full((n, width), np.inf, np.float32),
                         np.ones((n, width), bool))
    seeds = [int(rng.integers(2 ** 31)) for _ in range(trees)]
    rows = split_rows(x) if rows is None else rows
    # each tree's split is serial; the trees are independent (their own seed, numba's per-thread generator),
    # so they grow on a thread each (_leaves releases the GIL), and join the lists in order as before
    with ThreadPoolExecutor(max(1, min(trees, numba.get_num_threads()))) as pool:
        for order, bounds in pool.map(lambda seed: _leaves(rows, max(8, width), seed), seeds):
            _join_leaves(x, sq, order, bounds, state.ids, state.dists, state.is_new, not metric.dot_keys)
    fill_random(x, sq, state.ids, state.dists, state.is_new, int(rng.integers(2 ** 31)), not metric.dot_keys)
    return state


def locality_order(rows: np.ndarray, width: int, seed: int) -> np.ndarray:
    """A row order (int32) in which the rows of each leaf of one RP tree over the split rows ``rows``
    (split_rows) are contiguous. A descent over the rows in this order reads neighbours that lie near each other
    in memory, so its gathers hit the caches where the input's order scatters them (docs/perf-notes.md,
    session 47)."""
    return np.asarray(_leaves(rows, max(8, width), seed)[0])


def rows_in_order(x: np.ndarray, order: np.ndarray, own: bool) -> np.ndarray:
    """``x[order]``; made in ``x`` itself where the caller owns it (``own``: a widened copy of its input), which
    spares an array the size of the rows."""
    if not own:
        return x[order]
    _permute_rows(x, order)
    return x


@njit(cache=True)
def _permute_rows(x, order):
    """x[:] = x[order] in place, along the permutation's cycles with one row of scratch."""
    done = np.zeros(order.size, np.bool_)
    scratch = np.empty(x.shape[1], x.dtype)
    for start in range(order.size):
        if done[start]:
            continue
        scratch[:] = x[start]
        i = start
        while order[i] != start:
            x[i] = x[order[i]]
            done[i] = True
            i = order[i]
        x[i] = scratch
        done[i] = True


def split_rows(x: np.ndarray) -> np.ndarray:
    """The rows the trees split: int8, centred per dimension, at one scale for all (so the geometry is kept),
    clipped at SPLIT_CLIP standard deviations. A split is a pass over its rows' bytes, and the trees' passes
    were bound by memory: a quarter of the bytes split text 100K x 384 (20 trees, one thread) in 0.70 s against
    1.43 s, and the seeds were as good (recall@10 of the seeded lists 0.396 against 0.383; docs/perf-notes.md).
    Wide rows whose variance lies nearly all in a few directions are split in those (``principal_rows``).
    Only the split decisions see these rows; every key is computed from ``x``."""
    principal = principal_rows(x)
    if principal is not None:
        return principal
    centre = x.mean(axis=0, dtype=np.float64).astype(np.float32)
    return _quantise(x, centre, np.float32(SPLIT_CLIP))


def principal_rows(x: np.ndarray) -> np.ndarray | None:
    """``x``'s coordinates in its BOUND_DIMS principal directions (the exact search's subspace, bounds.py) as
    int8 split rows, where those directions hold SPLIT_KEPT of the variance about the mean (rows of low intrinsic
    dimension); None where they do not, or the rows are too narrow for it to pay. The hyperplane halfway between
    two rows then cuts nearly where it would in full, on a fraction of the bytes a split reads. One scale for all
    coordinates, from the widest one's spread: the pooled spread of the full rows would clip the leading
    directions, which hold most of the variance."""
    if not wide_enough(x.shape[1]) or len(x) < 2:
        return None
    sub = Subspace.fit(x, is_l2=True)
    if sub.kept < SPLIT_KEPT:
        return None
    coords = x @ sub.basis
    coords -= coords.mean(axis=0)
    spread = float(coords.std(axis=0).max())
    scale = 127.0 / (SPLIT_CLIP * spread) if spread > 0 else 1.0
    return np.clip(np.rint(coords * scale), -127, 127).astype(np.int8)


@njit(cache=True, parallel=True, fastmath=FAST)
def _quantise(x, centre, clip):
    n, d = x.shape
    row_ss = np.zeros(n, np.float64)
    for i in prange(n):
        s = 0.0
        for j in range(d):
            v = x[i, j] - centre[j]
            s += v * v
        row_ss[i] = s
    std = np.sqrt(row_ss.sum() / max(1, n * d))
    scale = np.float32(127.0 / (clip * std)) if std > 0 else np.float32(1.0)
    out = np.empty((n, d), np.int8)
    for i in prange(n):
        for j in range(d):
            v = np.rint((x[i, j] - centre[j]) * scale)
            out[i, j] = np.int8(min(127.0, max(-127.0, v)))
    return out


@njit(cache=True, fastmath=FAST, nogil=True)
def _leaves(x, leaf, seed):
    """One RP tree: the row order with each leaf contiguous, and the leaves' bounds in it (``x``: split_rows)."""
    np.random.seed(seed)
    n, d = x.shape
    order = np.arange(n).astype(np.int32)
    side = np.empty(n, np.bool_)
    normal = np.empty(d, np.float32)
    bounds = [0]
    stack = [(0, n)]
    while len(stack) > 0:
        lo, hi = stack.pop()
        if hi - lo <= leaf:
            bounds.append(hi)
            continue
        mid = lo
        for _ in range(MAX_TRIES):
            a = order[lo + np.random.randint(hi - lo)]
            b = order[lo + np.random.randint(hi - lo)]
            offset = np.float32(0.0)
            for j in range(d):
                normal[j] = np.float32(x[a, j]) - np.float32(x[b, j])  # once per split, not once per row
                offset += normal[j] * (np.float32(x[a, j]) + np.float32(x[b, j]))
            offset *= np.float32(0.5)
            mid = lo
            for i in range(lo, hi):
                if i + SPLIT_AHEAD < hi:
                    prefetch_rows(x, order[i + SPLIT_AHEAD:i + SPLIT_AHEAD + 1], EMPTY)
                r = order[i]
                s = np.float32(0.0)
                for j in range(d):
                    s += normal[j] * np.float32(x[r, j])
                side[i] = s > offset
                mid += not side[i]
            if lo < mid < hi:
                break
        else:  # every pair tied (duplicated rows): cut in half
            mid = lo + (hi - lo) // 2
            for i in range(lo, hi):
                side[i] = i >= mid
        left = lo  # stable partition: rows with side False first
        right = np.empty(hi - mid, np.int32)
        nr = 0
        for i in range(lo, hi):
            if side[i]:
                right[nr] = order[i]
                nr += 1
            else:
                order[left] = order[i]
                left += 1
        order[mid:hi] = right[:nr]
        stack.append((mid, hi))
        stack.append((lo, mid))
    bounds.sort()
    return order, np.array(bounds, np.int64)


@njit(cache=True, parallel=True, fastmath=FAST)
def _join_leaves(x, sq, order, bounds, ids, dists, is_new, is_l2):
    """Every row's leaf-mates merged into its list (each key computed once, the leaf's keys as one blocked
    triangle, as the cross-match's, while the next leaf's rows are prefetched)."""
    k = ids.shape[1]
    for leaf in prange(bounds.size - 1):
        lo, hi = bounds[leaf], bounds[leaf + 1]
        ahead = order[hi:bounds[leaf + 2]] if leaf + 2 < bounds.size else order[hi:hi]
        rows = order[lo:hi]
        m = hi - lo
        keys = np.empty((m, m), np.float32)
        prefetch_rows(ids, ahead, EMPTY)  # the next leaf's lists, which its merges read and write
        prefetch_rows(dists, ahead, EMPTY)
        at = keys_block(x, sq, rows, m, rows, m, keys, True, is_l2, ahead, 0, prefetch_per_pair(ahead.size, m // 2))
        prefetch_rows(x, ahead[at:], EMPTY)
        cand = np.empty(m, np.int32)
        cand_key = np.empty(m, np.float32)
        merged = np.empty(k, np.int32)
        merged_key = np.empty(k, np.float32)
        merged_new = np.empty(k, np.bool_)
        for a in range(m):
            r = rows[a]
            q = 0
            for b in range(m):  # mates in leaf order, sorted by key as they come (ties keep that order)
                key = keys[min(a, b), max(a, b)]
                if b == a or key >= dists[r, k - 1] or _holds(ids[r], k, rows[b]):
                    continue
                _sift_in(cand, cand_key, q, rows[b], key)
                q += 1
            if q > 0:
                _merge(ids[r], dists[r], is_new[r], cand, cand_key, q, merged, merged_key, merged_new)


@njit(cache=True, inline="always")
def _merge(ids, dists, is_new, cand, cand_key, q, merged, merged_key, merged_new):
    """The list's k nearest of itself and the sorted candidates cand[:q] (NEW), listed entries first at equal
    keys: what offering the candidates one by one gives, at one pass over the list instead of a shift per
    candidate (text 100K, 20 trees: 17.9M candidates entered with 452M shifts)."""
    k = ids.size
    i = 0
    j = 0
    for t in range(k):
        if j < q and cand_key[j] < dists[i]:
            merged[t] = cand[j]
            merged_key[t] = cand_key[j]
            merged_new[t] = True
            j += 1
        else:
            merged[t] = ids[i]
            merged_key[t] = dists[i]
            merged_new[t] = is_new[i]
            i += 1
    ids[:] = merged
    dists[:] = merged_key
    is_new[:] = merged_new


@njit(cache=True, parallel=True, fastmath=FAST)
def fill_random(x, sq, ids, dists, is_new, seed, is_l2):
    """Fill each list's empty slots with random other rows (NEW), as pynndescent does after its trees. Draw t of
    row r is a hash of (seed, r, t): numba's generator is per thread and ``np.random.seed`` seeds only the
    calling one, so draws from it depended on which thread took a row and what it drew before (a resumed
    build differed from the uninterrupted one in about 1 run of 9, session 28)."""
    n, k = ids.shape
    base = mix64(np.uint64(seed))
    for r in prange(n):
        for t in range(2 * k):
            if ids[r, k - 1] != EMPTY:
                break
            c = np.int64(mix64(base ^ np.uint64(r * 2 * k + t)) % np.uint64(n - 1))
            c += c >= r  # never the row itself
            _offer(ids[r], dists[r], is_new[r], c, _key(x, sq, r, c, is_l2))


@njit(cache=True, inline="always")
def _offer(ids, dists, is_new, c, key):
    """Insert ``c`` into a sorted list if it beats the last entry and is not listed yet."""
    if key >= dists[ids.size - 1] or _holds(ids, ids.size, c):
        return
    place(ids, dists, is_new, c, key)
