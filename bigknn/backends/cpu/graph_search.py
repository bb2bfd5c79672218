"""Batch graph search on the CPU: TSDG's two GPU procedures (Wang, Wang, Zhao, *Graph-based Approximate NN
Search: A Revisit*, §4) run step for step in NumPy, vectorised over the queries of a batch. The reference of
bigknn/backends/cuda/search.cu.

* ``small`` (Alg. 1): t0 independent greedy searches per query, search j from the entry sample's row j-th
  nearest the query (bigknn/search/graph.py; the paper: the best of 32 random rows); a hop
  computes the distances of the current row's neighbours (occlusion factor < 10), keeps per warp slot w the
  best of the neighbours w, w + 32, ... (R_temp), merges R_temp into the search's 32-entry list R_ij and moves
  to R_temp's best; a search ends when R_ij did not change. The t0 lists are merged into the top k.
* ``large`` (Alg. 2): one best-first search per query from the entry sample's row nearest it, with the result list
  R of k entries, an expansion queue C of QUEUE_SEGMENTS sorted segments of 32 (row id mod segments), and a
  visited table V of the same segments (circular, the oldest entry replaced); edges with occlusion factor < 5.
  It ends when the nearest queued row is farther than R's last by more than Δ = tau min(d_best1, d_nn1+)
  (GGNN eq. (2)), when C is empty, or after the hop limit. A row enters R when it beats R's last, and C when
  it is within Δ of R's last: GGNN's fetch criterion, to which TSDG refers for Δ (the printed Alg. 2 queues
  only rows that enter R, which leaves Δ little to widen).

Departures from the paper, the same in both backends: R_ij takes the best 32 of R_ij and R_temp (the paper
replaces R_ij's last 16 by R_temp's best 16: the same cost on a warp, and exact for k up to 32), and a row
already in R_ij or R is not inserted again (the paper's R_ij may hold repeats).
"""

from __future__ import annotations

import numpy as np

from bigknn.graph import EMPTY, KnnGraph, merge_lists
from bigknn.search.graph import SearchIndex, entry_sample, key_distance, nearest_entries
from bigknn.search.params import QUEUE_SEGMENTS, SEARCH_K_MAX, SEGMENT, SearchPlan

GATHER_BYTES = 64 << 20  # float32 temporaries of one distance gather


def query_keys(index: SearchIndex, q: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Keys from query i to rows[i, :] (EMPTY entries get inf), float32 as the kernels compute them."""
    out = np.full(rows.shape, np.inf, np.float32)
    valid = rows >= 0
    width = rows.shape[1] if rows.ndim > 1 else 1
    step = max(1, GATHER_BYTES // max(1, width * q.shape[1] * 4))
    for r0 in range(0, len(rows), step):
        sl = slice(r0, r0 + step)
        v = index.vectors[np.where(valid[sl], rows[sl], 0)].astype(np.float32)
        qq = q[sl][:, None, :]
        keys = -np.einsum("qcd,qcd->qc", v, np.broadcast_to(qq, v.shape)) if index.metric == "ip" else \
            np.einsum("qcd,qcd->qc", v - qq, v - qq)
        out[sl] = np.where(valid[sl], keys, np.inf)
    return out


def search(index: SearchIndex, queries: np.ndarray, plan: SearchPlan) -> KnnGraph:
    """The k nearest rows each query's search found, nearest first (keys ascending, EMPTY-padded)."""
    q = np.ascontiguousarray(queries, dtype=np.float32)
    sample = entry_sample(plan.seed, index.rows)
    starts = nearest_entries(np, index.vectors[sample].astype(np.float32), sample, q, index.metric)
    if plan.procedure == "small":
        return _small(index, q, starts, plan)
    return _large(index, q, starts, plan)


def search_batches(index: SearchIndex, queries: np.ndarray, plan: SearchPlan, batch: int) -> KnnGraph:
    """``search`` over consecutive batches of ``batch`` queries, each finished before the next starts."""
    parts = [search(index, queries[i:i + batch], plan) for i in range(0, len(queries), batch)]
    if not parts:
        return KnnGraph(np.empty((0, plan.k), np.int32), np.empty((0, plan.k), np.float32))
    return KnnGraph(np.concatenate([p.ids for p in parts]), np.concatenate([p.dists for p in parts]))


def _entries(index: SearchIndex, q: np.ndarray, starts: np.ndarray, search: np.ndarray | int):
    """(row, key) each search starts from: search j of a query from its ``starts`` entry j mod their number."""
    rows = starts[np.arange(len(starts)), np.asarray(search) % starts.shape[1]]
    return rows, query_keys(index, q, rows[:, None])[:, 0]


def _neighbours(index: SearchIndex, rows: np.ndarray, lambda_visit: int) -> np.ndarray:
    """The edges of ``rows`` a search visits: occlusion factor below ``lambda_visit``; the others EMPTY."""
    nb = index.ids[rows].astype(np.int64)
    return np.where((nb >= 0) & (index.lambdas[rows] < lambda_visit), nb, EMPTY)


# ---- Alg. 1: small batches --------------------------------------------------------------------
def _small(index: SearchIndex, q: np.ndarray, starts: np.ndarray, plan: SearchPlan) -> KnnGraph:
    t0 = plan.searches
    owner = np.repeat(np.arange(len(q)), t0)  # query of each search
    u, _ = _entries(index, q[owner], starts[owner], np.tile(np.arange(t0), len(q)))
    best_ids = np.full((len(owner), SEARCH_K_MAX), EMPTY, np.int64)  # R_ij, ascending
    best_keys = np.full((len(owner), SEARCH_K_MAX), np.inf, np.float32)
    active = np.ones(len(owner), bool)
    for _ in range(plan.hops):
        a = np.flatnonzero(active)
        if not a.size:
            break
        nb = _neighbours(index, u[a], plan.lambda_visit)
        keys = query_keys(index, q[owner[a]], nb)
        tid, tkey = _warp_minima(nb, keys)  # R_temp
        nxt = tid[np.arange(len(a)), np.argmin(tkey, axis=1)]
        seen = (tid[:, :, None] == best_ids[a][:, None, :]).any(axis=2)
        fresh = np.where(seen, np.inf, tkey)
        updated = (fresh < best_keys[a][:, -1:]).any(axis=1)
        ids, keys = _merge_sorted(best_ids[a], best_keys[a], tid, fresh, SEARCH_K_MAX)
        best_ids[a], best_keys[a] = ids, keys
        u[a] = nxt
        active[a[~updated]] = False
    per_query = (len(q), t0 * SEARCH_K_MAX)
    ids, keys = merge_lists(best_ids.reshape(per_query), best_keys.reshape(per_query), plan.k)
    return KnnGraph(ids.astype(np.int32), keys)


def _warp_minima(nb: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """R_temp: slot w holds the nearest of neighbours w, w + 32, w + 64, ... (the first such on ties)."""
    rows, width = nb.shape
    groups = -(-width // SEARCH_K_MAX)
    pad = groups * SEARCH_K_MAX - width
    nbp = np.pad(nb, ((0, 0), (0, pad)), constant_values=EMPTY).reshape(rows, groups, SEARCH_K_MAX)
    kp = np.pad(keys, ((0, 0), (0, pad)), constant_values=np.inf).reshape(rows, groups, SEARCH_K_MAX)
    g = np.argmin(kp, axis=1)
    tkey = np.take_along_axis(kp, g[:, None, :], axis=1)[:, 0]
    tid = np.take_along_axis(nbp, g[:, None, :], axis=1)[:, 0]
    return np.where(np.isinf(tkey), EMPTY, tid), tkey


def _merge_sorted(ids_a, keys_a, ids_b, keys_b, width):
    """The ``width`` smallest of two lists per row (entries of a first among equal keys)."""
    ids = np.concatenate([ids_a, ids_b], axis=1)
    keys = np.concatenate([keys_a, keys_b], axis=1)
    order = np.argsort(keys, axis=1, kind="stable")[:, :width]
    keys = np.take_along_axis(keys, order, axis=1)
    return np.where(np.isinf(keys), EMPTY, np.take_along_axis(ids, order, axis=1)), keys


# ---- Alg. 2: large batches --------------------------------------------------------------------
def _large(index: SearchIndex, q: np.ndarray, starts: np.ndarray, plan: SearchPlan) -> KnnGraph:
    nq, k, m, s = len(q), plan.k, QUEUE_SEGMENTS, SEGMENT
    u0, k0 = _entries(index, q, starts, 0)
    at = np.arange(nq)
    r_ids = np.full((nq, k), EMPTY, np.int64)  # R, ascending
    r_keys = np.full((nq, k), np.inf, np.float32)
    r_ids[:, 0], r_keys[:, 0] = u0, k0
    c_ids = np.full((nq, m, s), EMPTY, np.int64)  # C: each segment ascending
    c_keys = np.full((nq, m, s), np.inf, np.float32)
    c_ids[at, u0 % m, 0], c_keys[at, u0 % m, 0] = u0, k0
    v_ids = np.full((nq, m, s), EMPTY, np.int64)  # V: each segment a ring
    v_head = np.zeros((nq, m), np.int64)
    active = np.ones(nq, bool)
    nn1 = float(index.nn1)
    for _ in range(plan.hops):
        a = np.flatnonzero(active)
        if not a.size:
            break
        heads = c_keys[a, :, 0]
        seg = np.argmin(heads, axis=1)
        top = heads[np.arange(len(a)), seg]
        slack = plan.budget * np.maximum(0.0, np.minimum(key_distance(r_keys[a, 0], index.metric), nn1))
        stop = np.isinf(top) | (key_distance(top, index.metric) > key_distance(r_keys[a, -1], index.metric) + slack)
        active[a[stop]] = False
        a, seg = a[~stop], seg[~stop]
        if not a.size:
            break
        u = c_ids[a, seg, 0]
        _pop_front(c_ids, c_keys, a, seg)
        vs = u % m
        v_ids[a, vs, v_head[a, vs]] = u
        v_head[a, vs] = (v_head[a, vs] + 1) % s
        nb = _neighbours(index, u, plan.lambda_visit)
        safe = np.where(nb >= 0, nb, 0)
        known = ((v_ids[a[:, None], safe % m] == nb[:, :, None]).any(axis=2)
                 | (c_ids[a[:, None], safe % m] == nb[:, :, None]).any(axis=2)
                 | (r_ids[a][:, None, :] == nb[:, :, None]).any(axis=2))
        nb = np.where(known, EMPTY, nb)
        keys = query_keys(index, q[a], nb)
        slack = slack[~stop]
        for j in range(nb.shape[1]):  # inserted one by one in list order, as a warp does
            key = keys[:, j]
            to_c = key_distance(key, index.metric) <= key_distance(r_keys[a, -1], index.metric) + slack
            to_r = key < r_keys[a, -1]
            if to_c.any():
                _insert(c_ids, c_keys, a[to_c], nb[to_c, j] % m, nb[to_c, j], key[to_c])
            if to_r.any():
                _insert(r_ids, r_keys, a[to_r], None, nb[to_r, j], key[to_r])
    return KnnGraph(r_ids.astype(np.int32), r_keys)


def _pop_front(ids: np.ndarray, keys: np.ndarray, rows: np.ndarray, seg: np.ndarray) -> None:
    ids[rows, seg, :-1] = ids[rows, seg, 1:]
    keys[rows, seg, :-1] = keys[rows, seg, 1:]
    ids[rows, seg, -1] = EMPTY
    keys[rows, seg, -1] = np.inf


def _insert(ids: np.ndarray, keys: np.ndarray, rows: np.ndarray, seg: np.ndarray | None, e: np.ndarray,
            key: np.ndarray) -> None:
    """Insert (e, key) into each row's ascending list (or the list's segment ``seg``), after equal keys; the
    last entry falls off (a new entry worse than all of a full list is the one that falls off)."""
    where = (rows,) if seg is None else (rows, seg)
    li, lk = ids[where], keys[where]
    pos = (lk <= key[:, None]).sum(axis=1)[:, None]
    col = np.arange(lk.shape[1])[None, :]
    prev_i = np.concatenate([li[:, :1], li[:, :-1]], axis=1)
    prev_k = np.concatenate([lk[:, :1], lk[:, :-1]], axis=1)
    ids[where] = np.where(col < pos, li, np.where(col == pos, e[:, None], prev_i))
    keys[where] = np.where(col < pos, lk, np.where(col == pos, key[:, None], prev_k))
