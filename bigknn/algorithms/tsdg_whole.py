"""TSDG's two stages (bigknn/operations/prune.py's passes) on a whole kNN graph held at once, written once for NumPy
and CuPy (``xp``): no shards, no scratch, and on a GPU no lists crossing to the host and back between the
stages. Issue 15: a 1M text prune spent most of its seconds in those crossings and the host conversions around
them, not in its kernels. The CUDA backend runs it on the device where ``resident_bytes`` fit half its budget,
the CPU backend on the host where the store's vectors and the prune's lists fit the host budget; otherwise
the prune goes shard by shard (prune.py), with the same result.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from bigknn.algorithms.columns import take_columns
from bigknn.algorithms.edge_lists import EDGE_BYTES, EMPTY, MERGE_ENTRY_BYTES, edge_lists, merge_rows
from bigknn.algorithms.search_params import NO_LAMBDA, DiversifyRule, PruneParams

# (cands, keys, rule, width) -> (cols, factors): Backend.diversify_lists on xp arrays of rows of the whole table
Diversify = Callable[[Any, Any, DiversifyRule, int], tuple[Any, Any]]
MERGE_BYTES = 256 << 20  # sort words and temporaries of one block of merged rows


def resident_bytes(rows: int, k: int, dim: int, params: PruneParams) -> int:
    """Bytes ``tsdg`` holds at its peak on a graph of ``rows`` x ``k`` with float32 rows of ``dim``: the table,
    the graph (int64 ids, float32 keys), the forward lists, their edges being sorted, and the candidate
    lists."""
    forward, width = params.forward_width(k), params.candidate_width(k)
    per_row = 4 * dim + 12 * k + (12 + EDGE_BYTES) * forward + 12 * width  # 12: an int64 id and a float32 key
    return rows * per_row + MERGE_BYTES


def tsdg(xp: Any, ids: Any, keys: Any, params: PruneParams, diversify: Diversify) -> tuple[Any, Any, int]:
    """The search graph of the kNN graph ``ids`` / ``keys`` ((rows, k) xp arrays, ids global = row numbers,
    keys ascending): (rows, degree) int32 ids and uint8 occlusion factors (EMPTY / NO_LAMBDA padded), and the
    number of forward edges (each is also a reverse edge)."""
    rows, k = ids.shape
    ids = xp.asarray(ids, dtype=xp.int64)
    cols, _ = diversify(ids, keys, DiversifyRule("gd", params.alpha), params.forward_width(k))
    f_ids, f_keys = _take(xp, ids, cols, EMPTY), _take(xp, keys, cols, np.float32(np.inf))
    valid = f_ids >= 0
    src = xp.nonzero(valid)[0]  # each forward edge's row, row-major like f_ids[valid]
    width = params.candidate_width(k)
    e_ids, e_keys = edge_lists(xp, rows, width, f_ids[valid], src, f_keys[valid])
    cand = xp.empty((rows, width), xp.int64)
    ckeys = xp.empty((rows, width), xp.float32)
    step = max(1, MERGE_BYTES // (MERGE_ENTRY_BYTES * (f_ids.shape[1] + width)))
    for r0 in range(0, rows, step):
        sl = slice(r0, r0 + step)
        cand[sl], ckeys[sl] = merge_rows(xp, xp.concatenate([f_ids[sl], e_ids[sl]], axis=1),
                                         xp.concatenate([f_keys[sl], e_keys[sl]], axis=1), width)
    del e_ids, e_keys
    cols, lam = diversify(cand, ckeys, DiversifyRule("occlusion"), params.degree)
    out = _take(xp, cand, cols, EMPTY)
    drop = lam > params.lambda0
    return (xp.where(drop, EMPTY, out).astype(xp.int32), xp.where(drop, NO_LAMBDA, lam).astype(xp.uint8),
            int(valid.sum()))


def _take(xp: Any, values: Any, cols: Any, empty) -> Any:
    """values[r, cols[r, j]] per row, ``empty`` where a column is -1 (take_columns on the host)."""
    if xp is np:
        return take_columns(values, cols, empty)
    picked = xp.take_along_axis(values, xp.maximum(cols, 0).astype(xp.int64), axis=1)
    return xp.where(cols >= 0, picked, values.dtype.type(empty))
