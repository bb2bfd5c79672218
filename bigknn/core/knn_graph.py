"""k-NN graph arrays and the vectorised list merge that every stage shares.

A graph is two arrays: ``ids`` (rows, k) neighbour ids and ``dists`` (rows, k) float32 ordering keys,
ascending per row. An empty slot holds id ``EMPTY`` and key ``+inf``.

Ids come in two kinds. Local ids (a row's place in one shard, or in the index space of one merge's pair of
shards) are ``LOCAL_ID_DTYPE``: a shard holds at most tens of millions of rows, and the kernels work on them.
Store-wide ids (shard offset + local id) are ``id_dtype(rows)`` of the store's rows: int32 while every id
fits, int64 beyond (the store's manifest records which, bigknn/shards/manifest.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bigknn.core.hostmem import filled_once, in_row_blocks

EMPTY = -1
LOCAL_ID_DTYPE = np.dtype(np.int32)
INT32_ROWS = int(np.iinfo(np.int32).max) + 1  # rows whose ids 0 .. rows - 1 all fit int32


def id_dtype(rows: int) -> np.dtype:
    """The dtype of store-wide ids among ``rows`` rows: int32 while every id fits (half the bytes of int64,
    on disk and in memory), int64 beyond. Signed both ways: EMPTY (-1) marks empty slots everywhere, so
    uint32 would need another sentinel and would break every ``ids >= 0`` test."""
    return np.dtype(np.int32) if rows <= INT32_ROWS else np.dtype(np.int64)


@dataclass
class KnnGraph:
    ids: np.ndarray  # (rows, k) local ids, or store-wide ids (int32 or int64: ``id_dtype``)
    dists: np.ndarray  # (rows, k) float32, ascending per row
    report: dict | None = None  # how the descent that made it ended (bigknn/algorithms/recall_target.py Stopper.report)

    @property
    def rows(self) -> int:
        return self.ids.shape[0]

    @property
    def k(self) -> int:
        return self.ids.shape[1]


@dataclass
class ShardPart:
    """One shard as a merge sees it: its first global row id, its vectors and its graph (global ids)."""

    offset: int
    vectors: np.ndarray
    graph: KnnGraph


def final_columns(g: KnnGraph, k: int) -> KnnGraph:
    """A shard's final graph as stored: the first ``k`` of its lists' entries (merges keep the build's wider
    lists in memory; every reader takes k). Views, not copies: the store makes each chunk contiguous as it
    writes it, on its writer threads (a whole copy first held a 50M-row build's write back by seconds)."""
    if g.k <= k:
        return g
    return KnnGraph(g.ids[:, :k], g.dists[:, :k])


def widened(g: KnnGraph, width: int) -> KnnGraph:
    """``g`` with lists ``width`` entries wide for a merge, EMPTY / +inf padded (a final graph stored k wide,
    ``final_columns``); a graph that wide already is returned as it is."""
    if g.k >= width:
        return g
    ids, dists = filled_once((g.rows, width), g.ids.dtype), filled_once((g.rows, width), g.dists.dtype)

    def fill(a: int, b: int) -> None:  # np.pad would fill it on one thread, into fresh 4 KiB pages
        ids[a:b, :g.k], ids[a:b, g.k:] = g.ids[a:b], EMPTY
        dists[a:b, :g.k], dists[a:b, g.k:] = g.dists[a:b], np.inf

    in_row_blocks(g.rows, fill)
    return KnnGraph(ids, dists)


def through(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``table[ids]``, EMPTY slots kept EMPTY (ids renumbered by a table of new ids, or of rows)."""
    return np.where(ids == EMPTY, EMPTY, table[np.maximum(ids, 0)])


def shard_graph_to_global(g: KnnGraph, offset: int) -> KnnGraph:
    """A shard's GNND graph (ids local to the shard) with store-wide ids (``shifted``)."""
    return shifted(g, offset, offset + g.rows)


def shifted(g: KnnGraph, by: int, rows: int) -> KnnGraph:
    """``g`` with its ids moved ``by`` rows, as ids among ``rows`` rows (``id_dtype``): in place, on several
    threads, where the ids have that dtype already (int64 temporaries cost ~0.3 s of held GIL per 1M-row
    shard), into an int64 copy where the last id passes int32; EMPTY slots stay EMPTY. The caller gives up
    ``g``'s ids (a GNND's output, a graph just read)."""
    ids = np.asarray(g.ids, dtype=id_dtype(rows))
    if by:  # (a first shard's ids are store-wide already: 50M x 48 ids are seconds of work)

        def shift(a: int, b: int) -> None:
            np.add(ids[a:b], by, out=ids[a:b], where=ids[a:b] >= 0)

        in_row_blocks(len(ids), shift)
    return KnnGraph(ids, g.dists)


def merge_lists(ids: np.ndarray, dists: np.ndarray, k: int, extra: np.ndarray | None = None):
    """Per row: drop duplicate ids and empty slots, sort ascending by key, keep the first ``k``.

    ``ids``/``dists`` are (rows, m) with m >= k, in any order. Where an id appears twice the smaller key
    wins. ``extra`` is an optional (rows, m) array carried along with the kept entries (flags).
    Returns (ids, dists[, extra]) of shape (rows, k), ids in the dtype of ``ids``; short rows are padded
    with EMPTY/+inf.
    """
    rows, m = ids.shape
    dists = np.where(ids == EMPTY, np.inf, dists).astype(np.float32, copy=False)
    # sort by (id, key) so that duplicates are adjacent and the best copy comes first
    order = _argsort_id_then_key(ids, dists)
    sid = np.take_along_axis(ids, order, axis=1)
    sd = np.take_along_axis(dists, order, axis=1)
    dup = np.zeros_like(sid, dtype=bool)
    dup[:, 1:] = sid[:, 1:] == sid[:, :-1]
    sd = np.where(dup, np.inf, sd)
    kk = min(k, m)
    if kk < m:
        part = np.argpartition(sd, kk - 1, axis=1)[:, :kk]
    else:
        part = np.broadcast_to(np.arange(m), (rows, m))
    pd = np.take_along_axis(sd, part, axis=1)
    within = np.argsort(pd, axis=1)
    pick = np.take_along_axis(part, within, axis=1)
    out_ids = np.take_along_axis(sid, pick, axis=1)
    out_d = np.take_along_axis(sd, pick, axis=1)
    out_ids = np.where(np.isinf(out_d), EMPTY, out_ids).astype(ids.dtype, copy=False)
    if kk < k:
        pad = k - kk
        out_ids = np.pad(out_ids, ((0, 0), (0, pad)), constant_values=EMPTY)
        out_d = np.pad(out_d, ((0, 0), (0, pad)), constant_values=np.inf)
    if extra is None:
        return out_ids, out_d
    se = np.take_along_axis(extra, order, axis=1)
    out_e = np.take_along_axis(se, pick, axis=1)
    if kk < k:
        out_e = np.pad(out_e, ((0, 0), (0, k - kk)))
    return out_ids, out_d, out_e


def _argsort_id_then_key(ids: np.ndarray, dists: np.ndarray) -> np.ndarray:
    """Row-wise order by id, then by key: one argsort of a combined 64-bit key (id in the high 32 bits) is
    faster than lexsort; ids past int32 do not fit there and take two stable sorts, key then id."""
    bits = sortable_float_bits(dists)
    if ids.size == 0 or ids.max() < INT32_ROWS:
        return np.argsort((ids.astype(np.int64) << 32) | bits.astype(np.int64), axis=1)
    by_key = np.argsort(bits, axis=1, kind="stable")
    by_id = np.argsort(np.take_along_axis(ids, by_key, axis=1), axis=1, kind="stable")
    return np.take_along_axis(by_key, by_id, axis=1)


def sortable_float_bits(x: np.ndarray) -> np.ndarray:
    """uint32 codes whose unsigned order equals the float order (for packing keys into sort words)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    neg = (bits >> 31).astype(bool)
    return np.where(neg, ~bits, bits | np.uint32(0x80000000)).astype(np.uint32)


def drop_self(ids: np.ndarray, dists: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Remove each row's own id from its list (or the last entry, where duplicates crowded self out).

    ``ids``/``dists`` hold m entries per row; the result holds m - 1.
    """
    n, m = ids.shape
    is_self = ids == np.asarray(rows)[:, None]
    drop = np.where(is_self.any(axis=1), is_self.argmax(axis=1), m - 1)
    keep = np.ones((n, m), dtype=bool)
    keep[np.arange(n), drop] = False
    return ids[keep].reshape(n, m - 1), dists[keep].reshape(n, m - 1)
