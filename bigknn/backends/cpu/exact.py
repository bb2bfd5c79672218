"""Exact top-k by blocked BLAS distances with a running top-k, in bounded memory.

Each tile of keys is first compared with every query's current k-th key: after the first tiles only
a handful of entries per row can still enter, so the selection costs one comparison per key instead of
a partition of the whole tile.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from bigknn.core.knn_graph import EMPTY, LOCAL_ID_DTYPE, KnnGraph, id_dtype, merge_lists
from bigknn.core.metric import Metric

QUERY_ROWS = 2048  # queries per pass over a block
TILE_COLS = 8192  # block rows per key tile (QUERY_ROWS x TILE_COLS float32 = 64 MiB)


def exact_knn(queries: np.ndarray, k: int, metric: Metric, blocks: Iterable[tuple[int, np.ndarray]],
              compiled: bool = False) -> KnnGraph:
    """Each query's exact top-k among the blocks' rows, ids ``offset`` + row: int32 while they fit, int64 from
    the first block whose rows pass int32 (bigknn/core/knn_graph.py id_dtype). ``compiled``: keys and the running
    top-k through numba (_compiled_knn); the same lists."""
    q = np.ascontiguousarray(queries, dtype=np.float32)
    nq = q.shape[0]
    best_ids = np.full((nq, k), EMPTY, dtype=LOCAL_ID_DTYPE)
    best_d = np.full((nq, k), np.inf, dtype=np.float32)
    if compiled:
        return _compiled_knn(q, k, metric, blocks, best_ids, best_d)
    for offset, block in blocks:
        best_ids = best_ids.astype(np.result_type(best_ids, id_dtype(offset + block.shape[0])), copy=False)
        for c0 in range(0, block.shape[0], TILE_COLS):
            tile = np.ascontiguousarray(block[c0:c0 + TILE_COLS], dtype=np.float32)
            for q0 in range(0, nq, QUERY_ROWS):
                rows = slice(q0, q0 + QUERY_ROWS)
                keys = metric.pairwise_keys(q[rows], tile)
                if np.isinf(best_d[rows, -1]).any():  # lists still filling: take each row's k best
                    _merge_tile_topk(best_ids, best_d, rows, keys, offset + c0, k)
                    continue
                r, c = np.nonzero(keys < best_d[rows, -1:])
                if r.size:
                    _merge_candidates(best_ids, best_d, q0, r, (c + offset + c0).astype(best_ids.dtype), keys[r, c], k)
    return KnnGraph(best_ids, best_d)


def _compiled_knn(q: np.ndarray, k: int, metric: Metric, blocks: Iterable[tuple[int, np.ndarray]],
                  best_ids: np.ndarray, best_d: np.ndarray) -> KnnGraph:
    """exact_knn's compiled path: dot products by BLAS into one reused buffer (a fresh 64 MiB tile per matmul
    cost 5x the matmul in page faults), folded into the running top-k in place by keypass.tile_merge. Smaller
    query batches, to keep the tile in cache, measured slower (256 rows: 1.6x): BLAS's and numba's thread
    pools each spin after a call and take turns 8x as often. Wide rows whose lists are full go through their
    bounds in a subspace first (bounds.py), for as long as that pays: a pilot of PILOT_ROWS queries decides
    first, then every batch."""
    from bigknn.backends.cpu import bounds, keypass  # here: the NumPy reference never loads numba
    from bigknn.backends.cpu.halves import as_float

    nq = len(q)
    is_l2 = not metric.dot_keys
    q_sq = np.einsum("ij,ij->i", q, q)  # as metrics.pairwise_keys
    buf = np.empty(min(QUERY_ROWS, nq) * TILE_COLS, np.float32)  # shaped per tile: C order
    widened = None  # half rows' tiles are widened into this one buffer
    bounded = bounds.wide_enough(q.shape[1])
    piloted = False
    subspace = qb = None
    for offset, block in blocks:
        best_ids = best_ids.astype(np.result_type(best_ids, id_dtype(offset + block.shape[0])), copy=False)
        for c0, c1 in _tiles(block.shape[0], bounds.FILL_COLS if bounded and subspace is None else TILE_COLS):
            if block.dtype == np.float16 and widened is None:
                widened = np.empty(TILE_COLS * block.shape[1], np.float32)
            tile = as_float(block[c0:c1], into=widened)
            t_sq = np.einsum("ij,ij->i", tile, tile)
            tb = None

            def merge(rows: slice, with_bounds: bool) -> bool:
                """Fold the tile into ``rows``' lists; with bounds, whether they paid."""
                out = buf[:(rows.stop - rows.start) * len(tile)].reshape(rows.stop - rows.start, len(tile))
                if not with_bounds:
                    dots = np.matmul(q[rows], tile.T, out=out)
                    keypass.tile_merge(dots, q_sq[rows], t_sq, offset + c0, best_ids[rows], best_d[rows], is_l2)
                    return False
                bound_dots = np.matmul(qb.coords[rows], tb.coords.T, out=out)
                wasted = bounds.bounded_merge(bound_dots, qb.norm2[rows], qb.slack[rows], tb.norm2, tb.slack, q[rows],
                                            tile, q_sq[rows], t_sq, offset + c0, best_ids[rows], best_d[rows], is_l2)
                return bounds.worth_it(wasted, out.size, q.shape[1])

            for q0 in range(0, nq, QUERY_ROWS):
                rows = slice(q0, min(nq, q0 + QUERY_ROWS))
                if not (bounded and np.isfinite(best_d[rows, -1]).all()):  # lists still filling: every key counts
                    merge(rows, False)
                    continue
                if subspace is None:
                    subspace = bounds.Subspace.fit(tile, is_l2)
                    qb = subspace.project(q, q_sq)
                if tb is None:
                    tb = subspace.project(tile, t_sq)
                if not piloted:  # where the bounds let most keys through, the pilot's few queries find out
                    pilot = slice(q0, min(rows.stop, q0 + bounds.PILOT_ROWS))
                    bounded = piloted = merge(pilot, True)
                    rows = slice(pilot.stop, rows.stop)
                if rows.start < rows.stop:
                    bounded = merge(rows, bounded)
    return KnnGraph(best_ids, best_d)


def _tiles(n: int, first: int) -> list[tuple[int, int]]:
    """Column tiles of TILE_COLS over ``n`` rows, the first ``first`` wide."""
    head = min(n, first)
    return [(0, head)] + [(c0, min(c0 + TILE_COLS, n)) for c0 in range(head, n, TILE_COLS)] if n else []


def _merge_tile_topk(best_ids, best_d, rows, keys, first_id, k) -> None:
    kk = min(k, keys.shape[1])
    part = np.argpartition(keys, kk - 1, axis=1)[:, :kk] if kk < keys.shape[1] else \
        np.broadcast_to(np.arange(keys.shape[1]), keys.shape)
    _merge_topk(best_ids, best_d, rows, (part + first_id).astype(best_ids.dtype),
                np.take_along_axis(keys, part, axis=1), k)


def _merge_topk(best_ids, best_d, rows, ids, keys, k) -> None:
    """Fold entries (global ``ids``, ``keys``: one row of at most k per row of ``rows``, a slice or indices)
    into those rows' running top-k."""
    merged_ids, merged_d = merge_lists(np.concatenate([best_ids[rows], ids], axis=1),
                                       np.concatenate([best_d[rows], keys], axis=1), k)
    best_ids[rows], best_d[rows] = merged_ids, merged_d


def _merge_candidates(best_ids, best_d, q0, r, cid, ckey, k) -> None:
    """Fold (row, id, key) candidates into the running top-k of the rows they name."""
    order = np.lexsort((ckey, r))
    r, cid, ckey = r[order], cid[order], ckey[order]
    rows_hit, starts, counts = np.unique(r, return_index=True, return_counts=True)
    width = int(min(k, counts.max()))
    rank = np.arange(r.size) - np.repeat(starts, counts)
    keep = rank < width
    slot = np.searchsorted(rows_hit, r[keep])
    wid = np.full((rows_hit.size, width), EMPTY, dtype=best_ids.dtype)
    wkey = np.full((rows_hit.size, width), np.inf, dtype=np.float32)
    wid[slot, rank[keep]] = cid[keep]
    wkey[slot, rank[keep]] = ckey[keep]
    _merge_topk(best_ids, best_d, rows_hit + q0, wid, wkey, k)
