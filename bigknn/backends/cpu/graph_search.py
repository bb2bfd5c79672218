"""Batch graph search on the CPU: TSDG's two GPU procedures (Wang, Wang, Zhao, *Graph-based Approximate NN
Search: A Revisit*, §4) run step for step in NumPy, vectorised over the queries of a batch. The reference of
bigknn/backends/cuda/search_keys.cu and search.cu.

* ``small`` (Alg. 1): t0 independent greedy searches per query, search j from the entry sample's row j-th
  nearest the query (bigknn/algorithms/search_index.py; the paper: the best of 32 random rows); a hop
  computes the distances of the current row's neighbours (occlusion factor < 10), keeps per warp slot w the
  best of the neighbours w, w + 32, ... (R_temp), merges R_temp into the search's 32-entry list R_ij and moves
  to R_temp's best; a search ends when R_ij did not change. The t0 lists are merged into the top k.
* ``large`` (Alg. 2, with a search list for its R and Δ): one best-first search per query over a sorted search
  list R of L entries (L the budget, at least k), started with the SEEDS entry sample rows nearest the query.
  A hop expands R's PARENTS nearest entries not expanded yet (CAGRA's search width): the distances of their
  neighbours (occlusion factor < 5) not already in R nor listed before, and R <- the best L of R and them (R
  first among equal keys, then parent by parent in edge list order).
  It ends when every entry of R is expanded, or after the hop limit; the first k entries are the result.
  Rows of WALK_HALF_MIN_DIM dims or more are walked as halves, rows and query scaled by one power of two
  (SearchIndex.walk: half the bytes a key reads), and R's first RERANK entries are then re-keyed in float32 and
  sorted by (key, id): the result's distances are exact.
  The paper keeps R at k entries and searches on while the nearest queued row is within a slack Δ of R's
  last (GGNN's rule): a distance, where a list length is a rank. On 384-d text embeddings, whose distances
  crowd together, a slack admits whole shells of rows (docs/perf-notes.md, session 28); the list is HNSW's
  ef and CAGRA's itopk. The GPU skips rows it computed before (a table of them): such a row is in R or was
  beaten by R's last, which only falls, so skipping it changes nothing.

Departures from the paper, the same in both backends: R_ij takes the best 32 of R_ij and R_temp (the paper
replaces R_ij's last 16 by R_temp's best 16: the same cost on a warp, and exact for k up to 32), and a row
already in R_ij or R is not inserted again (the paper's R_ij may hold repeats).
"""

from __future__ import annotations

import numpy as np

from bigknn.core.knn_graph import EMPTY, KnnGraph, merge_lists
from bigknn.core.metric import Metric
from bigknn.algorithms.search_index import SearchIndex, entry_table, nearest_entries
from bigknn.algorithms.search_params import PARENTS, RERANK, SEARCH_K_MAX, SearchPlan

GATHER_BYTES = 64 << 20  # float32 temporaries of one distance gather


def query_keys(index: SearchIndex, q: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Keys from query i to rows[i, :] (EMPTY entries get inf), float32 as the kernels compute them."""
    return _keys(index.vectors, index.metric, q, rows)


def _keys(vectors: np.ndarray, metric: Metric, q: np.ndarray, rows: np.ndarray) -> np.ndarray:
    out = np.full(rows.shape, np.inf, np.float32)
    valid = rows >= 0
    width = rows.shape[1] if rows.ndim > 1 else 1
    step = max(1, GATHER_BYTES // max(1, width * q.shape[1] * 4))
    for r0 in range(0, len(rows), step):
        sl = slice(r0, r0 + step)
        v = vectors[np.where(valid[sl], rows[sl], 0)].astype(np.float32)
        qq = q[sl][:, None, :]
        keys = -np.einsum("qcd,qcd->qc", v, np.broadcast_to(qq, v.shape)) if metric.dot_keys else \
            np.einsum("qcd,qcd->qc", v - qq, v - qq)
        out[sl] = np.where(valid[sl], keys, np.inf)
    return out


def search(index: SearchIndex, queries: np.ndarray, plan: SearchPlan) -> KnnGraph:
    """The k nearest rows each query's search found, nearest first (keys ascending, EMPTY-padded)."""
    q = np.ascontiguousarray(queries, dtype=np.float32)
    sample, rows = entry_table(index, plan.seed)
    starts = nearest_entries(np, rows, sample, q, index.metric)
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


def _merge_sorted(ids_a, keys_a, ids_b, keys_b, width, flags_a=None):
    """The ``width`` smallest of two lists per row (entries of a first among equal keys); with ``flags_a``,
    also a's flags carried along (False for b's entries)."""
    ids = np.concatenate([ids_a, ids_b], axis=1)
    keys = np.concatenate([keys_a, keys_b], axis=1)
    order = np.argsort(keys, axis=1, kind="stable")[:, :width]
    keys = np.take_along_axis(keys, order, axis=1)
    ids = np.where(np.isinf(keys), EMPTY, np.take_along_axis(ids, order, axis=1))
    if flags_a is None:
        return ids, keys
    flags = np.concatenate([flags_a, np.zeros(ids_b.shape, bool)], axis=1)
    return ids, keys, np.take_along_axis(flags, order, axis=1)


# ---- Alg. 2: large batches --------------------------------------------------------------------
def _large(index: SearchIndex, q: np.ndarray, starts: np.ndarray, plan: SearchPlan) -> KnnGraph:
    nq, width = len(q), plan.list_length
    rows, qw = (index.vectors, q) if index.walk is None else (index.walk[0], q * np.float32(index.walk[1]))

    def walk_keys(a, ids):  # the walk's keys: on the scaled half rows and queries where the index has them
        return _keys(rows, index.metric, qw[a], ids)

    everyone = np.arange(nq)
    r_ids, r_keys = _merge_sorted(np.full((nq, width), EMPTY, np.int64), np.full((nq, width), np.inf, np.float32),
                                  starts.astype(np.int64), walk_keys(everyone, starts), width)  # the nearest seeds
    expanded = np.zeros((nq, width), bool)
    active = np.ones(nq, bool)
    for _ in range(plan.hops):
        a = np.flatnonzero(active)
        open_ = ~expanded[a] & np.isfinite(r_keys[a])
        done = ~open_.any(axis=1)
        active[a[done]] = False
        a, open_ = a[~done], open_[~done]
        if not a.size:
            break
        chosen = open_ & (np.cumsum(open_, axis=1) <= PARENTS)  # the nearest entries not expanded yet
        expanded[a] |= chosen
        at = np.argsort(~chosen, axis=1, kind="stable")[:, :PARENTS]  # their positions, nearest first
        parents = np.where(np.take_along_axis(chosen, at, axis=1), np.take_along_axis(r_ids[a], at, axis=1), EMPTY)
        nb = np.where(np.repeat(parents >= 0, index.ids.shape[1], axis=1),
                      _neighbours(index, np.maximum(parents, 0), plan.lambda_visit).reshape(len(a), -1), EMPTY)
        known = (r_ids[a][:, None, :] == nb[:, :, None]).any(axis=2) | _repeats(nb)
        nb = np.where(known, EMPTY, nb)
        r_ids[a], r_keys[a], expanded[a] = _merge_sorted(r_ids[a], r_keys[a], nb, walk_keys(a, nb),
                                                         width, expanded[a])  # R first among equal keys
    if index.walk is not None:  # R's first RERANK re-keyed in float32, by (key, id) as the GPU's warp sort
        r_ids = r_ids[:, :min(RERANK, width)]
        r_keys = query_keys(index, q, r_ids)
        order = np.lexsort((np.where(r_ids >= 0, r_ids, np.iinfo(np.int64).max), r_keys), axis=-1)
        r_ids, r_keys = np.take_along_axis(r_ids, order, axis=1), np.take_along_axis(r_keys, order, axis=1)
    return KnnGraph(r_ids[:, :plan.k].astype(np.int32), r_keys[:, :plan.k])


def _repeats(nb: np.ndarray) -> np.ndarray:
    """Entries equal to an earlier entry of their row (a row in the lists of two parents)."""
    order = np.argsort(nb, axis=1, kind="stable")
    s = np.take_along_axis(nb, order, axis=1)
    dup = np.zeros(nb.shape, bool)
    dup[:, 1:] = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
    out = np.zeros(nb.shape, bool)
    np.put_along_axis(out, order, dup, axis=1)
    return out
