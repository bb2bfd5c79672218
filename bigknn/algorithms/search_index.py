"""A search graph as the search procedures read it, and the entry points they start from.

TSDG (§4, Alg. 1 and 2) starts every search from the best of 32 random rows and reports this as effective as
HNSW's hierarchy or NSG's navigating node. It is not where the kNN graph falls apart into components (the 200
well-separated clusters of ``bigknn synth``: a search from another cluster never reaches the query's, recall
0.22 at batch 10K on the GPU, issue 15). So every query is compared exactly with a fixed entry sample of
ENTRY_SAMPLE rows (one GEMM a batch, on the backend), and search j of a query starts from the sample row
j-th nearest to it (j modulo SEEDS): search 0 from the nearest, the small-batch procedure's t0 searches from
different rows near the query. The sample is drawn from a hash of the plan's seed, so it is the same whichever
backend and batch: a query's results depend on the query, not on its neighbours in the batch. The rows every row
is reachable from (algorithms/reach.py) join the sample, so that a cluster the sample misses still has an entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from bigknn.core.metric import Metric, half_scale
from bigknn.formats import check_rows
from bigknn.algorithms import reach
from bigknn.algorithms.edge_lists import key_bits
from bigknn.algorithms.search_params import ENTRY_SAMPLE, LAMBDA_VISIT, SEEDS, WALK_HALF_MIN_DIM

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@dataclass
class SearchIndex:
    """Everything a batch search reads: the rows, each row's edges ordered by (occlusion factor, distance),
    their occlusion factors and the store's metric (cosine's too: a search asks it only ``dot_keys`` and
    ``kernel_id``)."""

    vectors: np.ndarray  # (n, d) as stored (cosine rows normalised)
    ids: np.ndarray  # (n, degree) int32 global row ids, EMPTY-padded at the end
    lambdas: np.ndarray  # (n, degree) uint8 occlusion factors, NO_LAMBDA in empty slots
    metric: Metric
    _entries: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # seed -> entry_rows

    @property
    def rows(self) -> int:
        return self.ids.shape[0]

    @cached_property
    def walk(self) -> tuple[np.ndarray, float] | None:
        """(rows as half precision, scaled by a power of two into half's range; the scale) where the large
        procedure walks on halves (rows WALK_HALF_MIN_DIM wide or wider, a multiple of 8); None otherwise.
        Made once, the same bits for both backends (float32 * scale, rounded to nearest even)."""
        n, d = self.vectors.shape
        if d < WALK_HALF_MIN_DIM or d % 8:
            return None
        x = np.asarray(self.vectors, dtype=np.float32)
        scale = half_scale(float(np.abs(x).max()) if n else 0.0)
        return (x * np.float32(scale)).astype(np.float16), scale

    @cached_property
    def roots(self) -> np.ndarray:
        """Rows every row is reachable from over the edges both procedures visit (reach.py; the large procedure
        visits the fewest)."""
        return reach.roots(self.ids, self.lambdas, LAMBDA_VISIT["large"])


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (uint64 arrays wrap; the CUDA kernels compute the same)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def entry_sample(seed: int, rows: int) -> np.ndarray:
    """The rows searches start from: ENTRY_SAMPLE draws mix(mix(seed) ^ i) mod rows, distinct, ascending (every
    row where there are no more)."""
    if rows <= ENTRY_SAMPLE:
        return np.arange(rows, dtype=np.int64)
    with np.errstate(over="ignore"):
        h = _mix(_mix(np.asarray([seed], np.uint64)) ^ np.arange(ENTRY_SAMPLE, dtype=np.uint64))
    return np.unique((h % np.uint64(rows)).astype(np.int64))


def entry_rows(index: SearchIndex, seed: int) -> np.ndarray:
    """The rows each query is compared with for its entry points: the seed's entry sample and the index's
    roots, ascending; made once per index and seed (a one-query search must not redo the hashing)."""
    rows = index._entries.get(seed)
    if rows is None:
        rows = index._entries[seed] = np.union1d(entry_sample(seed, index.rows), index.roots)
    return rows


def entry_table(index: SearchIndex, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(entry_rows, their vectors as float32): what the host compares each query with, made once per index
    and seed."""
    key = ("table", seed)
    table = index._entries.get(key)
    if table is None:
        ids = entry_rows(index, seed)
        table = index._entries[key] = (ids, np.asarray(index.vectors[ids], dtype=np.float32))
    return table


def nearest_entries(xp: Any, sample: Any, sample_ids: Any, queries: Any, metric: Metric) -> Any:
    """(queries, min(SEEDS, sample rows)) ids of the sample rows nearest each query, nearest first (the lower
    sample position on equal keys), for NumPy or CuPy arrays (``xp``): one GEMM. Keys drop the query's own
    norm (the same for every row of the sample). The CUDA backend keeps the same words' smallest in a warp
    instead of sorting whole rows (backends/cuda/graph_search.py nearest_entries)."""
    dots = xp.asarray(queries, dtype=xp.float32) @ xp.asarray(sample, dtype=xp.float32).T
    keys = -dots if metric.dot_keys else (sample * sample).sum(axis=1, dtype=xp.float32)[None, :] - 2 * dots
    w = min(SEEDS, keys.shape[1])
    col = xp.arange(keys.shape[1], dtype=xp.int64)[None, :]
    word = ((key_bits(xp, keys) - (1 << 31)) << 32) | col  # distinct (no tie left to the sort), within int64
    return sample_ids[xp.sort(word, axis=1)[:, :w] & 0xFFFFFFFF]


def host_queries(rows: np.ndarray, metric: Metric, name: str, first_row: int) -> np.ndarray:
    """Query rows checked (BadInput naming ``name`` and the row) and prepared on the host: float32, C order,
    unit length where the metric normalises: the Backend's ``searched_queries`` on the host, and the queries
    exact truth and recall compare (operations/search_queries.py load_queries)."""
    check_rows(name, first_row, rows)
    return np.ascontiguousarray(metric.prepare(rows.astype(np.float32, copy=False)), dtype=np.float32)
