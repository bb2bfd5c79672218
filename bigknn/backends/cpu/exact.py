"""Exact top-k by blocked BLAS distances with a running top-k, in bounded memory.

Each tile of keys is first compared with every query's current k-th key: after the first tiles only
a handful of entries per row can still enter, so the selection costs one comparison per key instead of
a partition of the whole tile.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from bigknn.graph import EMPTY, LOCAL_ID_DTYPE, KnnGraph, id_dtype, merge_lists
from bigknn.metrics import pairwise_keys

QUERY_ROWS = 2048  # queries per pass over a block
TILE_COLS = 8192  # block rows per key tile (QUERY_ROWS x TILE_COLS float32 = 64 MiB)


def exact_knn(queries: np.ndarray, k: int, metric: str, blocks: Iterable[tuple[int, np.ndarray]],
              compiled: bool = False) -> KnnGraph:
    """Each query's exact top-k among the blocks' rows, ids ``offset`` + row: int32 while they fit, int64 from
    the first block whose rows pass int32 (bigknn/graph.py id_dtype). ``compiled``: keys and the running
    filter through numba (kernels.tile_topk / tile_candidates), the dot products into one reused buffer
    (a fresh 64 MiB tile per matmul cost 5x the matmul in page faults); the same lists."""
    q = np.ascontiguousarray(queries, dtype=np.float32)
    nq = q.shape[0]
    best_ids = np.full((nq, k), EMPTY, dtype=LOCAL_ID_DTYPE)
    best_d = np.full((nq, k), np.inf, dtype=np.float32)
    tiles = _CompiledTiles(q, metric) if compiled else None
    for offset, block in blocks:
        best_ids = best_ids.astype(np.result_type(best_ids, id_dtype(offset + block.shape[0])), copy=False)
        for c0 in range(0, block.shape[0], TILE_COLS):
            tile = np.ascontiguousarray(block[c0:c0 + TILE_COLS], dtype=np.float32)
            if tiles is not None:
                tiles.start(tile)
            for q0 in range(0, nq, QUERY_ROWS):
                rows = slice(q0, q0 + QUERY_ROWS)
                filling = np.isinf(best_d[rows, -1]).any()  # lists still filling: take each row's k best
                if tiles is not None and filling:
                    c, keys = tiles.topk(rows, k)
                    _merge_topk(best_ids, best_d, rows, (c + offset + c0).astype(best_ids.dtype), keys, k)
                    continue
                if tiles is not None:
                    r, c, keys = tiles.candidates(rows, best_d[rows, -1])
                    if r.size:
                        _merge_candidates(best_ids, best_d, q0, r, (c + offset + c0).astype(best_ids.dtype), keys, k)
                    continue
                keys = pairwise_keys(q[rows], tile, metric)
                if filling:
                    _merge_tile_topk(best_ids, best_d, rows, keys, offset + c0, k)
                    continue
                r, c = np.nonzero(keys < best_d[rows, -1:])
                if r.size:
                    _merge_candidates(best_ids, best_d, q0, r, (c + offset + c0).astype(best_ids.dtype), keys[r, c], k)
    return KnnGraph(best_ids, best_d)


class _CompiledTiles:
    """exact_knn's compiled tile step: dot products by BLAS into one buffer, keys and the filter by numba."""

    def __init__(self, q: np.ndarray, metric: str):
        from bigknn.backends.cpu import kernels  # here: the NumPy reference never loads numba

        self.kernels = kernels
        self.q = q
        self.is_l2 = metric != "ip"
        self.q_sq = np.einsum("ij,ij->i", q, q)  # as metrics.pairwise_keys
        self.buf = np.empty(min(QUERY_ROWS, len(q)) * TILE_COLS, np.float32)  # shaped per tile: C order

    def start(self, tile: np.ndarray) -> None:
        self.tile = tile
        self.t_sq = np.einsum("ij,ij->i", tile, tile)

    def _dots(self, rows: slice) -> np.ndarray:
        q = self.q[rows]
        out = self.buf[:len(q) * len(self.tile)].reshape(len(q), len(self.tile))
        return np.matmul(q, self.tile.T, out=out)

    def topk(self, rows: slice, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each query's min(k, tile) nearest tile columns and their keys, nearest first (lists still filling).
        One compiled pass per row, where NumPy's argpartition of the whole 2048 x 8192 tile cost 0.4 s."""
        return self.kernels.tile_topk(self._dots(rows), self.q_sq[rows], self.t_sq, k, self.is_l2)

    def candidates(self, rows: slice, bound: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row within ``rows``, tile column, key) of the entries below each row's ``bound``."""
        return self.kernels.tile_candidates(self._dots(rows), self.q_sq[rows], self.t_sq,
                                            np.ascontiguousarray(bound), self.is_l2)


def _merge_tile_topk(best_ids, best_d, rows, keys, first_id, k) -> None:
    kk = min(k, keys.shape[1])
    part = np.argpartition(keys, kk - 1, axis=1)[:, :kk] if kk < keys.shape[1] else \
        np.broadcast_to(np.arange(keys.shape[1]), keys.shape)
    _merge_topk(best_ids, best_d, rows, (part + first_id).astype(best_ids.dtype), np.take_along_axis(keys, part, axis=1),
                k)


def _merge_topk(best_ids, best_d, rows, ids, keys, k) -> None:
    """Fold each row's best entries of a tile (global ``ids``, ``keys``: (rows, <= k)) into its running top-k."""
    ids, d = merge_lists(np.concatenate([best_ids[rows], ids], axis=1), np.concatenate([best_d[rows], keys], axis=1), k)
    best_ids[rows], best_d[rows] = ids, d


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
    g = rows_hit + q0
    ids, d = merge_lists(np.concatenate([best_ids[g], wid], axis=1), np.concatenate([best_d[g], wkey], axis=1), k)
    best_ids[g], best_d[g] = ids, d
