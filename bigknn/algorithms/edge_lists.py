"""Per-row candidate lists of a prune built from edges, written once for NumPy and CuPy (``xp``): the CPU
backend runs it on the host, the CUDA backend on the device, where the sorts of tens of millions of edges
cost milliseconds instead of the seconds they cost on the host (issue 15: the host side dominated prune).

Every sort is one argsort of a packed 64-bit word (row or id in the high half, the key's order-preserving bits
in the low half), which both libraries sort fast; no lexsort, no stable sort is needed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

EMPTY = -1  # bigknn.core.knn_graph.EMPTY (not imported: this module is shared with the device code as is)
EDGE_BYTES = 96  # bytes an edge takes while edge_lists sorts it (words, order, temporaries)
MERGE_ENTRY_BYTES = 40  # bytes a list entry takes while merge_rows sorts it (words, order, temporaries)


def key_bits(xp: Any, keys: Any) -> Any:
    """int64 codes in 0..2^32 whose order equals the float32 keys' order (bigknn.core.knn_graph.sortable_float_bits)."""
    bits = xp.ascontiguousarray(keys, dtype=xp.float32).view(xp.uint32)
    flip = (bits >> 31) * xp.uint32(0x7FFFFFFF) | xp.uint32(0x80000000)  # all bits of a negative, the sign of others
    return (bits ^ flip).astype(xp.int64)


def nearest_lists(xp: Any, rows: int, width: int, row: np.ndarray, ids: np.ndarray, keys: np.ndarray,
                  lists: tuple[np.ndarray, np.ndarray] | None = None, max_edges: int | None = None,
                  merge_rows_at_once: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per row 0..rows-1: the nearest ``width`` distinct ids of its edges (``row``, ``ids``, ``keys``: host
    arrays) and of its entries in ``lists`` ((rows, m) ids and keys, EMPTY / inf padded), ascending by key, a
    repeated id with its smaller key: (rows, width) host int64 ids and float32 keys, EMPTY / inf padded.
    ``max_edges``: edges sorted at once (consecutive rows' edges in turn: a capped GPU's working set);
    ``merge_rows_at_once``: rows whose lists are merged at once."""
    out_ids, out_keys = np.empty((rows, width), np.int64), np.empty((rows, width), np.float32)
    step = merge_rows_at_once or max(1, rows)
    for r0, r1, at in row_chunks(rows, row, max_edges or max(1, len(row))):
        e_row = row[at] - r0 if r0 else row[at]
        e_ids, e_keys = edge_lists(xp, r1 - r0, width, xp.asarray(e_row), xp.asarray(ids[at]), xp.asarray(keys[at]))
        for b0 in range(r0, r1, step):
            b1 = min(r1, b0 + step)
            i, k = e_ids[b0 - r0:b1 - r0], e_keys[b0 - r0:b1 - r0]
            if lists is not None:
                i, k = merge_rows(xp, xp.concatenate([xp.asarray(lists[0][b0:b1], dtype=xp.int64), i], axis=1),
                                  xp.concatenate([xp.asarray(lists[1][b0:b1], dtype=xp.float32), k], axis=1), width)
            out_ids[b0:b1], out_keys[b0:b1] = _host(xp, i), _host(xp, k)
    return out_ids, out_keys


def row_chunks(rows: int, row: np.ndarray, max_edges: int) -> list[tuple[int, int, Any]]:
    """Rows 0..rows-1 split into consecutive ranges (r0, r1) of at most ``max_edges`` edges each (a row with
    more has a range of its own), each with the positions of its edges in ``row`` (host ints < rows): one
    range and a whole slice where all fit, else one stable counting sort by range."""
    if len(row) <= max_edges:
        return [(0, rows, slice(None))]
    ends = np.cumsum(np.bincount(row, minlength=rows))  # edges of rows 0..r
    bounds = [0]
    while bounds[-1] < rows:
        r0 = bounds[-1]
        r1 = int(np.searchsorted(ends, (ends[r0 - 1] if r0 else 0) + max_edges, side="right"))
        bounds.append(min(rows, max(r1, r0 + 1)))
    rank = np.searchsorted(np.asarray(bounds[1:-1]), row, side="right")
    order = np.argsort(rank.astype(np.min_scalar_type(len(bounds))), kind="stable")  # radix for < 2^16 ranges
    starts = np.concatenate([[0], np.cumsum(np.bincount(rank, minlength=len(bounds) - 1))])
    return [(bounds[i], bounds[i + 1], order[starts[i]:starts[i + 1]]) for i in range(len(bounds) - 1)]


def _host(xp: Any, a: Any) -> np.ndarray:
    return a if xp is np else a.get()


def edge_lists(xp: Any, rows: int, width: int, row: Any, ids: Any, keys: Any) -> tuple[Any, Any]:
    """(rows, width) lists of the edges (row, id, key), each row's nearest ``width`` ascending (the edges of a
    row are distinct: a prune files each kept edge once under its target)."""
    out_ids = xp.full((rows, width), EMPTY, xp.int64)
    out_keys = xp.full((rows, width), xp.inf, xp.float32)
    if len(row) == 0:
        return out_ids, out_keys
    row = xp.asarray(row, dtype=xp.int64)
    order = xp.argsort((row << 32) | key_bits(xp, keys))
    row = row[order]
    starts = xp.searchsorted(row, row, side="left")
    rank = xp.arange(len(row)) - starts
    keep = rank < width
    at = order[keep]
    out_ids[row[keep], rank[keep]] = xp.asarray(ids, dtype=xp.int64)[at]
    out_keys[row[keep], rank[keep]] = xp.asarray(keys, dtype=xp.float32)[at]
    return out_ids, out_keys


def merge_rows(xp: Any, ids: Any, keys: Any, width: int) -> tuple[Any, Any]:
    """Per row of (rows, m) ids / keys in any order: the distinct ids (a repeated one with its smaller key),
    ascending by key, cut to ``width`` columns (bigknn.core.knn_graph.merge_lists' contract, int64 ids out)."""
    keys = xp.where(ids < 0, xp.inf, keys).astype(xp.float32)
    order = xp.argsort((ids << 32) | key_bits(xp, keys), axis=1)  # by id, then key: repeats adjacent, best first
    sid = xp.take_along_axis(ids, order, axis=1)
    sk = xp.take_along_axis(keys, order, axis=1)
    repeat = xp.zeros(sid.shape, dtype=bool)
    repeat[:, 1:] = sid[:, 1:] == sid[:, :-1]
    sk = xp.where(repeat | (sid < 0), xp.inf, sk)
    col = xp.arange(sid.shape[1], dtype=xp.int64)[None, :]  # m < 2^16 (a prune's lists are at most 512 wide)
    pick = xp.argsort((key_bits(xp, sk) << 16) | col, axis=1)[:, :width]  # distinct words: no stable sort needed
    out_k = xp.take_along_axis(sk, pick, axis=1)
    out_i = xp.where(xp.isinf(out_k), EMPTY, xp.take_along_axis(sid, pick, axis=1))
    if out_i.shape[1] < width:
        pad = width - out_i.shape[1]
        out_i = xp.concatenate([out_i, xp.full((len(out_i), pad), EMPTY, xp.int64)], axis=1)
        out_k = xp.concatenate([out_k, xp.full((len(out_k), pad), xp.inf, xp.float32)], axis=1)
    return out_i, out_k


def verdict_columns(xp: Any, verdict: Any, valid: Any, sequential: bool, width: int, cap: int) -> tuple[Any, Any]:
    """A diversification's verdict on (rows, c) candidate lists turned into what a prune stores: per row, the
    columns of the candidates kept, cut to ``width`` (int32, -1 padded), and their occlusion factors (uint8,
    ``cap`` padded). A sequential rule's verdict is the kept mask: its kept columns in order, factor 0. An
    occlusion verdict is each candidate's factor: every valid column, by (factor capped at cap - 1, column).
    One sort of distinct (rank, column) words per row; run where the verdict is (host or device), so that
    only ``width`` small columns cross to the host."""
    rows, c = verdict.shape
    if sequential:
        rank = xp.where(verdict.astype(bool), 0, cap)
    else:
        rank = xp.where(valid, xp.minimum(verdict, cap - 1), cap)
    word = xp.sort(rank.astype(xp.int32) * c + xp.arange(c, dtype=xp.int32)[None, :], axis=1)[:, :width]
    ranks = word // c
    cols = xp.where(ranks < cap, word % c, -1).astype(xp.int32)
    if c < width:
        cols = xp.concatenate([cols, xp.full((rows, width - c), -1, xp.int32)], axis=1)
        ranks = xp.concatenate([ranks, xp.full((rows, width - c), cap, ranks.dtype)], axis=1)
    return cols, ranks.astype(xp.uint8)
