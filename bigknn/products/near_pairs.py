"""The graph's list entries at or under a distance, as (row, neighbour) pairs of store positions, streamed
block by block.

A block is whole graph chunks of one shard, so each chunk file is read and checked once. Worker threads read
blocks ahead of the consumer and filter them in a compiled loop that compares the stored keys with the
threshold turned into a key once (``Metric.key_at_most``): no distance is computed, no mask or repeated row
array is made, and only the near pairs, usually a few per row, reach the consumer. Memory: the blocks in
flight, about 2 x READ_THREADS x a chunk of ids and of keys.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numba
import numpy as np

from bigknn.core.metric import metric
from bigknn.operations.readout import neighbours_per_row
from bigknn.shards import Store

READ_THREADS = min(16, os.cpu_count() or 1)  # blocks read, checked and filtered at once
AHEAD = 2  # blocks in flight per read thread


@numba.njit(nogil=True, cache=True)
def _near(ids: np.ndarray, keys: np.ndarray, k: int, bound: np.float32, first: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, neighbours) of the entries among each row's first ``k`` with an id (not EMPTY) and a key <=
    ``bound``; row r of the block is store position ``first + r``."""
    count = 0
    for r in range(ids.shape[0]):
        for j in range(k):
            if ids[r, j] >= 0 and keys[r, j] <= bound:
                count += 1
    rows = np.empty(count, np.int64)
    cols = np.empty(count, np.int64)
    c = 0
    for r in range(ids.shape[0]):
        for j in range(k):
            if ids[r, j] >= 0 and keys[r, j] <= bound:
                rows[c] = first + r
                cols[c] = ids[r, j]
                c += 1
    return rows, cols


def near_pairs(store: Store, max_distance: float, k: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(rows, neighbours), int64 store positions, of every entry among the first ``k`` of each list whose
    distance (``Graph.neighbors``'s) is <= ``max_distance``, block by block in store order."""
    store.manifest.require_complete(store.path)  # unfinished lists are not yet top-k over all rows
    k = neighbours_per_row(store, k)
    bound = metric(store.manifest.metric).key_at_most(max_distance)
    blocks = [(shard.id, shard.offset, lo, min(lo + step, shard.rows))
              for shard in store.manifest.shards
              for step in (store.graph_chunk_rows(shard.id),)
              for lo in range(0, shard.rows, step)]

    def read(shard_id: int, offset: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        g = store.read_graph(shard_id, start=lo, stop=hi)
        return _near(g.ids, g.dists, k, bound, offset + lo)

    with ThreadPoolExecutor(READ_THREADS) as pool:
        ahead = AHEAD * READ_THREADS
        futures = [pool.submit(read, *b) for b in blocks[:ahead]]
        for i in range(len(blocks)):
            pairs = futures[i].result()
            futures[i] = None  # its pairs are the consumer's now
            if i + ahead < len(blocks):
                futures.append(pool.submit(read, *blocks[i + ahead]))
            yield pairs
