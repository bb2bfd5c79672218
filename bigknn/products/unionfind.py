"""Union-find over an int64 parent array that several threads update at once, for the near-duplicate groups.

Every link hangs a root under a smaller root, so each tree's root is its lowest member, whatever order the
edges come in and however the threads interleave: the groups, and their ids, are the same as a sequential
run's. A link is one compare-and-swap on the larger root (it succeeds only while that row is still a root;
otherwise the union looks up both roots again), the lock-free union-find of the GPU connected-components
codes (ECL-CC). Path splitting writes with plain stores: it only ever replaces a non-root's parent with one of
its ancestors, which every concurrent reader may see, and no link ever targets a non-root.
"""

from __future__ import annotations

import numba
import numpy as np

from bigknn.products.atomics import cas


@numba.njit(nogil=True, cache=True)
def find(parent: np.ndarray, a: int) -> int:
    """The root of ``a``; each row passed is pointed at its grandparent (path splitting)."""
    while True:
        p = parent[a]
        if p == a:
            return a
        g = parent[p]
        if g != p:
            parent[a] = g
        a = p


@numba.njit(nogil=True, cache=True)
def union(parent: np.ndarray, a: int, b: int) -> None:
    """Join the trees of ``a`` and ``b``: the larger root is linked under the smaller."""
    while True:
        a, b = find(parent, a), find(parent, b)
        if a == b:
            return
        if a < b:
            a, b = b, a
        if cas(parent, a, a, b) == a:
            return


@numba.njit(nogil=True, cache=True)
def unite_near(parent: np.ndarray, ids: np.ndarray, keys: np.ndarray, k: int, bound: np.float32,
               first: int) -> None:
    """Union each row of a block of lists with every neighbour among its first ``k`` that has an id (not
    EMPTY) and a key <= ``bound``; row r of the block is row ``first + r`` of ``parent``. Keys ascend along
    each list (the store's contract), so a row's scan stops at its first key past the bound."""
    for r in range(ids.shape[0]):
        for j in range(k):
            if not keys[r, j] <= bound:
                break
            b = ids[r, j]
            if b >= 0:
                union(parent, np.int64(first + r), np.int64(b))


@numba.njit(parallel=True, cache=True)
def flatten(parent: np.ndarray) -> None:
    """Every row's parent made its root, in place (after the unions). Rows are rewritten concurrently, each
    only to its root, so a walk through any of them still ends at that root."""
    for i in numba.prange(len(parent)):
        root = parent[i]  # not i: prange's unsigned index would make the walk's variable a float
        while parent[root] != root:
            root = parent[root]
        parent[i] = root


@numba.njit(parallel=True, cache=True)
def singletons(n: int) -> np.ndarray:
    """A parent array of ``n`` one-row trees, written on every core (its fresh pages fault in in parallel, not
    one thread's page at a time as np.arange's do)."""
    parent = np.empty(n, np.int64)
    for i in numba.prange(n):
        parent[i] = i
    return parent
