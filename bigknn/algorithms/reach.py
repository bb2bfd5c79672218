"""Rows every search graph row is reachable from, added to the entry sample (algorithms/search_index.py entry_rows).

A kNN graph of well-separated clusters has no edge between them, and the search graph pruned from it neither:
a query whose cluster holds no entry sample row never reaches its neighbours. The f16 family (1,000 clusters,
490K rows) lost 2 % of recall so (session 31): a sample of 4,096 rows misses a cluster of 490 in e^-4.1 = 1.7 %
of clusters, and 94 % of the rows its searches missed were unreachable from the sample. ``roots`` walks the
graph from row 0 and makes each row it has not reached yet a root and walks on from there: every row is then
reachable from a root, whatever the sample's seed, and a connected graph has the one root, row 0.
"""

from __future__ import annotations

import numpy as np
from numba import njit


def roots(ids: np.ndarray, lambdas: np.ndarray, lambda_visit: int) -> np.ndarray:
    """Ascending int64 rows from which every row of the graph ``ids`` ((rows, degree), EMPTY-padded) is reachable
    over edges of occlusion factor (``lambdas``) below ``lambda_visit``: in row order, each row no root before it
    reaches."""
    return _roots(np.ascontiguousarray(ids), np.ascontiguousarray(lambdas), lambda_visit)


@njit(cache=True)
def _roots(ids, lambdas, lambda_visit):
    n, deg = ids.shape
    seen = np.zeros(n, np.bool_)
    queue = np.empty(n, np.int64)
    found = np.empty(n, np.int64)
    count = 0
    for r in range(n):
        if seen[r]:
            continue
        found[count] = r
        count += 1
        seen[r] = True
        queue[0] = r
        head, tail = 0, 1
        while head < tail:  # breadth first from r over the rows not reached before
            u = queue[head]
            head += 1
            for j in range(deg):
                v = ids[u, j]
                if v >= 0 and lambdas[u, j] < lambda_visit and not seen[v]:
                    seen[v] = True
                    queue[tail] = v
                    tail += 1
    return found[:count]
