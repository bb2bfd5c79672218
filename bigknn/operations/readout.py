"""The finished graph as users read it: row i holds global row i's first k neighbours, nearest first, with
the metric's distances (``bigknn.core.metric.user_distance``), and optionally the row itself first at distance 0:
the layout of scikit-learn's ``KNeighborsTransformer`` graphs and of UMAP's ``precomputed_knn``.

Stored lists never hold their own row, so "with self" is one prepended column: self comes first even where
duplicates of the row sit at distance 0 too.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from bigknn.core.errors import BadInput
from bigknn.core.metric import user_distance
from bigknn.algorithms.partition.rowmap import RowMap
from bigknn.shards import Store


def neighbours_per_row(store: Store, k: int | None) -> int:
    """``k`` checked against the graph's own k (None: the graph's k)."""
    have = store.manifest.k
    if k is None:
        return have
    if not 1 <= k <= have:
        raise BadInput(store.path, f"k = {k} is outside 1..{have}, the neighbours the graph holds per row")
    return k


def shard_blocks(store: Store, k: int | None = None,
                 include_self: bool = False) -> Iterator[tuple[slice | np.ndarray, np.ndarray, np.ndarray]]:
    """(input rows, ids, distances) of each shard, one shard in memory at a time; the rows are a slice of
    consecutive rows (a contiguous store) or an index array (a partitioned one), ids are input rows."""
    store.manifest.require_complete(store.path)  # unfinished lists are not yet top-k over all rows
    m = store.manifest
    k = neighbours_per_row(store, k)
    rowmap = RowMap.of(store)
    for shard in m.shards:
        g = store.read_graph(shard.id)
        ids, dists = rowmap.to_input(g.ids[:, :k]), user_distance(g.dists[:, :k], m.metric)
        positions = np.arange(shard.offset, shard.offset + shard.rows, dtype=m.id_dtype)
        rows = slice(shard.offset, shard.offset + shard.rows) if rowmap.identity else rowmap.to_input(positions)
        if include_self:
            ids = np.concatenate([rowmap.to_input(positions)[:, None], ids], axis=1)
            dists = np.concatenate([np.zeros((shard.rows, 1), np.float32), dists], axis=1)
        yield rows, ids, dists


def whole_graph(store: Store, k: int | None = None, include_self: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Every row's (ids in the store's id dtype, distances float32) in one pair of (rows, k [+1]) arrays."""
    cols = neighbours_per_row(store, k) + include_self
    ids = np.empty((store.manifest.rows, cols), store.manifest.id_dtype)
    dists = np.empty((store.manifest.rows, cols), np.float32)
    for rows, block_ids, block_dists in shard_blocks(store, k, include_self):
        ids[rows] = block_ids
        dists[rows] = block_dists
    return ids, dists


def in_degrees(store: Store, k: int | None = None) -> np.ndarray:
    """How many lists (their first ``k`` entries) each row appears in; the mean is k. One shard in memory at
    a time."""
    counts = np.zeros(store.manifest.rows, np.int64)
    for _, ids, _ in shard_blocks(store, k):
        counts += np.bincount(ids[ids >= 0], minlength=len(counts))
    return counts


def shard_of(store: Store, rows: np.ndarray) -> np.ndarray:
    """The shard index holding each input row."""
    starts = np.array([s.offset for s in store.manifest.shards])
    return np.searchsorted(starts, RowMap.of(store).to_position(rows), side="right") - 1


def csr_parts(ids: np.ndarray, dists: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(data, indices, indptr) of the CSR matrix holding each row's list in list order (nearest first, as
    scikit-learn's k-neighbours graphs are), zero distances included as explicit entries."""
    n, w = ids.shape
    index = np.int64 if n * w > np.iinfo(np.int32).max else np.int32
    return dists.ravel(), ids.ravel(), np.arange(0, n * w + 1, w, dtype=index)
