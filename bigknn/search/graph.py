"""A search graph as the search procedures read it, and the entry rows they start from.

Both backends draw a query's entry rows from the same hash of (seed, query number, search number, draw), so
that a query gets the same entries whichever backend and whatever batch it is searched in: results depend on
the query, not on its neighbours in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bigknn.search.params import SEEDS

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@dataclass
class SearchIndex:
    """Everything a batch search reads: the rows, each row's edges ordered by (occlusion factor, distance),
    their occlusion factors, the kernel metric (l2 or ip) and GGNN's d_nn1+ (the largest distance from a row
    to its nearest neighbour, in the metric's distance: Euclidean for l2, 1 - x.y for ip)."""

    vectors: np.ndarray  # (n, d) as stored (cosine rows normalised)
    ids: np.ndarray  # (n, degree) int32 global row ids, EMPTY-padded at the end
    lambdas: np.ndarray  # (n, degree) uint8 occlusion factors, NO_LAMBDA in empty slots
    metric: str
    nn1: float

    @property
    def rows(self) -> int:
        return self.ids.shape[0]


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (uint64 arrays wrap; the CUDA kernels compute the same)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def entry_rows(seed: int, query_ids: np.ndarray, search: np.ndarray | int, rows: int) -> np.ndarray:
    """(len(query_ids), SEEDS) random rows: draw i of search j of query q is mix(mix(mix(seed) ^ q) ^ (32 j + i))
    mod rows."""
    with np.errstate(over="ignore"):
        base = _mix(np.asarray([seed], np.uint64))
        q = _mix(base ^ np.asarray(query_ids, np.uint64))
        draw = (np.asarray(search, np.uint64) * np.uint64(SEEDS))[..., None] + np.arange(SEEDS, dtype=np.uint64)
        h = _mix(q[:, None] ^ draw)
    return (h % np.uint64(rows)).astype(np.int64)


def key_distance(keys: np.ndarray | float, metric: str) -> np.ndarray:
    """Ordering keys -> the distances GGNN's slack is measured in: Euclidean for l2, 1 + key = 1 - x.y for ip."""
    keys = np.asarray(keys, np.float64)
    return np.sqrt(np.maximum(keys, 0.0)) if metric == "l2" else 1.0 + keys
