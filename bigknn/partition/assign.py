"""The labelling pass: a sample to learn the partition from, then every row of the file to its shard.

The sample is read first (random rows through the memory map: a few MiB), the labels in one streamed pass
(n int64 labels: 8 GB at 1B rows, host RAM the planner counts). Each shard's rows are then its input rows in
file order (``layout``), which the sharding pass gathers.
"""

from __future__ import annotations

import numpy as np

from bigknn.formats import VectorFile, check_rows
from bigknn.metrics import prepare_rows
from bigknn.partition.balance import assign_balanced
from bigknn.partition.learn import SLACK, Nearest, Partition, learn

SAMPLE_PER_SHARD = 1024  # sample rows per shard the partition is learnt on (64 per fine k-means cluster)
SAMPLE_MIN, SAMPLE_MAX = 8192, 262_144
LABEL_CHUNK_ROWS = 65_536  # rows labelled at once


def shard_count(rows: int, shard_rows: int, min_rows: int) -> int:
    """Shards of a partitioned build: enough that an equal share leaves each ``SLACK`` of room below
    ``shard_rows`` (full shards would spill every boundary row to a far shard), more than ``min_rows`` rows
    each on average."""
    return max(1, min(-(-int(SLACK * rows) // shard_rows), rows // (min_rows + 1)))


def backend_nearest(backend) -> Nearest:
    """``Partition.cost``'s nearest-centroid search on a backend (bigknn/backends/): exact k-NN, squared L2."""
    def nearest(x: np.ndarray, count: int, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        g = backend.exact_knn(np.ascontiguousarray(x, np.float32), count, "l2", [(0, centroids)])
        return g.ids.astype(np.int64), g.dists
    return nearest


def learn_from_file(vf: VectorFile, method: str, shards: int, metric: str, seed: int) -> Partition:
    size = min(vf.rows, max(SAMPLE_MIN, min(SAMPLE_MAX, SAMPLE_PER_SHARD * shards)))
    rows = np.sort(np.random.default_rng((seed, 5)).choice(vf.rows, size=size, replace=False))
    return learn(method, prepare_rows(vf.take(rows), metric), shards, seed)


def layout(vf: VectorFile, part: Partition, metric: str, shard_rows: int, min_rows: int,
           nearest: Nearest = None) -> list[np.ndarray]:
    """Each shard's input rows (sorted): at most ``min(shard_rows, SLACK x an equal share)`` and more than
    ``min_rows`` each; a shard left with fewer is dropped and its rows go to their next choice. Bad rows
    (NaN, Inf) are refused here, before anything is written. ``nearest``: as ``Partition.cost``."""
    while True:
        cap = min(shard_rows, int(np.ceil(SLACK * vf.rows / part.shards)))
        room = np.full(part.shards, cap, np.int64)
        labels = np.empty(vf.rows, np.int64)
        for start, block in vf.chunks(LABEL_CHUNK_ROWS):
            check_rows(vf.path, start, block)
            x = prepare_rows(block, metric)
            labels[start:start + len(block)] = assign_balanced(part.cost(x, nearest), room)
        counts = np.bincount(labels, minlength=part.shards)
        if part.shards == 1 or counts.min() > min_rows:
            break
        part.drop(int(counts.argmin()))
    order = np.argsort(labels, kind="stable")
    return np.split(order, np.cumsum(counts)[:-1])
