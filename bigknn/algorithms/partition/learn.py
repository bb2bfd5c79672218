"""A partition of the input's rows into S shards: learnt on a sample, stored with the store, applied to rows.

Both locality-aware methods end as centroids, each belonging to one shard (k-means' fine clusters, or the
sample means of the RP-tree's leaves): a row's cost of a shard is its squared distance to the shard's nearest
centroid (the RP-tree puts the row's own leaf first), and the capacity rule of ``balance`` turns costs into
labels. Distances are L2 on the rows as stored
(unit rows for cosine): for ``ip`` that is a locality heuristic, not the metric, and the recall target decides
the merges anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bigknn.core.metric import L2
from bigknn.algorithms.partition.kmeans import learn_kmeans
from bigknn.algorithms.partition.nearest import Nearest, nearest_numpy
from bigknn.algorithms.partition.rp_partition import RPTree, learn_rptree

METHODS = ("auto", "kmeans", "rptree", "contiguous")
DEFAULT_METHOD = "auto"  # k-means where near pairs leave merges out, else contiguous (operations/plan_model.py resolve_partition)
SLACK = 1.15  # a shard may hold this much more than an equal share (never more than --shard-rows)
NEAREST = 16  # centroids whose shards a row may go to before it goes to any shard with room


@dataclass
class Partition:
    method: str
    centroids: np.ndarray  # (C, d) float32: k-means' fine centroids, or the RP-tree leaves' sample means
    shard_of: np.ndarray  # (C,) int64: each centroid's shard, -1 once its shard was dropped
    tree: RPTree | None = None  # the RP-tree (its leaf c is centroid c)

    @property
    def shards(self) -> int:
        return int(self.shard_of.max()) + 1

    def cost(self, x: np.ndarray, nearest: Nearest = None) -> np.ndarray:
        """(n, S) costs, lower preferred: squared distance to the shard's nearest centroid among the row's
        ``NEAREST`` nearest centroids; other shards after those, by distance to their mean centroid (a row
        whose near shards are all full spills to the next shard in space, never to an arbitrary one); the own
        leaf first (RP-tree). ``nearest(x, count, centroids)``: (ids, squared distances) of
        each row's nearest centroids, ascending (the backend's: the GPU labels a billion rows, by GEMMs);
        None: NumPy."""
        count = min(NEAREST, len(self.centroids))
        ids, d2 = (nearest or nearest_numpy)(x, count, self.centroids)
        out = np.full((len(x), self.shards), np.inf, np.float32)
        rows = np.arange(len(x))
        for j in reversed(range(count)):  # the nearest centroid of each shard writes last
            shard = self.shard_of[ids[:, j]]
            kept = shard >= 0
            out[rows[kept], shard[kept]] = d2[kept, j]
        far = np.isinf(out)  # other shards: by distance to their mean centroid, after every near one
        if far.any():
            means = np.stack([self.centroids[self.shard_of == s].mean(axis=0) for s in range(self.shards)])
            # every mean's distance: one (n, S) product, no larger than ``out``; a k-NN over all S means
            # (the backend's, x sent again) sorted what is only indexed (a fifth of the labelling, CPU)
            by_mean = L2.pairwise_keys(x, means.astype(np.float32))
            nearest_max = np.where(far, -np.inf, out).max(axis=1, keepdims=True)
            nearest_max[np.isinf(nearest_max)] = 0.0  # no near shard kept (all dropped): by the means alone
            out = np.where(far, nearest_max + by_mean - by_mean.min(axis=1, keepdims=True), out)
        if self.tree is not None:
            own = self.shard_of[self.tree.leaves(x)]
            kept = own >= 0
            out[rows[kept], own[kept]] = -np.inf
        return out

    def first_choice(self, x: np.ndarray, nearest: Nearest = None) -> tuple[np.ndarray, np.ndarray]:
        """Each row's preferred shard and its cost there (``cost``'s argmin and min), from the nearest centroid
        alone (the own leaf, RP-tree): the labelling needs the (n, S) costs only for rows that spill. Rows
        whose first centroid's shard was dropped get ``cost``'s."""
        if self.tree is not None:
            first, key = self.shard_of[self.tree.leaves(x)], np.full(len(x), -np.inf, np.float32)
        else:
            ids, d2 = (nearest or nearest_numpy)(x, 1, self.centroids)
            first, key = self.shard_of[ids[:, 0]], d2[:, 0].copy()
        lost = np.flatnonzero(first < 0)
        if lost.size:
            cost = self.cost(x[lost], nearest)
            first[lost], key[lost] = cost.argmin(axis=1), cost.min(axis=1)
        return first, key

    def drop(self, shard: int) -> None:
        """Remove one shard (too few rows for a graph): its rows go to their next choice."""
        self.shard_of = np.where(self.shard_of == shard, -1, self.shard_of - (self.shard_of > shard))

    def arrays(self) -> dict[str, np.ndarray]:
        """What the store keeps under ``partition/`` (2-d arrays, as the store writes them)."""
        out = {"centroids": self.centroids, "shard_of": self.shard_of[:, None]}
        if self.tree is not None:
            out.update(directions=self.tree.directions, thresholds=self.tree.thresholds[:, None],
                       children=self.tree.children)
        return out

    @classmethod
    def from_arrays(cls, method: str, arrays: dict[str, np.ndarray]) -> "Partition":
        tree = None if method != "rptree" else RPTree(arrays["directions"], arrays["thresholds"][:, 0],
                                                      arrays["children"].astype(np.int64))
        return cls(method, arrays["centroids"], arrays["shard_of"][:, 0].astype(np.int64), tree)


def learn(method: str, sample: np.ndarray, shards: int, seed: int, nearest: Nearest = None) -> Partition:
    """Learn ``method``'s partition into ``shards`` shards on ``sample`` (rows prepared as stored);
    ``nearest``: as ``Partition.cost`` (k-means' assignments)."""
    if method == "kmeans":
        return Partition(method, *learn_kmeans(sample, shards, seed, SLACK, nearest))
    if method == "rptree":
        tree = learn_rptree(sample, shards, seed)
        leaf = tree.leaves(sample)
        x = sample.astype(np.float32, copy=False)
        sums = np.zeros((shards, x.shape[1]), np.float64)
        np.add.at(sums, leaf, x)
        centroids = (sums / np.maximum(np.bincount(leaf, minlength=shards), 1)[:, None]).astype(np.float32)
        return Partition(method, centroids, np.arange(shards, dtype=np.int64), tree)
    raise ValueError(f"no partition method {method!r}; one of {METHODS}")


def load(store) -> Partition | None:
    """The stored partition of a store (None: contiguous)."""
    spec = store.manifest.partition
    if spec is None:
        return None
    return Partition.from_arrays(spec.method, {name: store.read_partition(name) for name in spec.arrays})
