"""The random-projection tree of paper 003 (first level), learnt on a row sample.

Each internal node projects rows on a random direction and splits at the sample's quantile that gives each
side its share of the S leaves, so leaves hold equal shares of the sample whatever S is. A row's first choice
is its leaf; where that leaf is full, it spills to the leaf whose sample centroid is nearest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class RPTree:
    directions: np.ndarray  # (S-1, d) float32: one per internal node
    thresholds: np.ndarray  # (S-1,) float32: a row goes left when its projection is below
    children: np.ndarray  # (S-1, 2) int64: >= 0 an internal node, < 0 the leaf -(c+1)

    def leaves(self, x: np.ndarray) -> np.ndarray:
        """The leaf of each row (n,)."""
        x = x.astype(np.float32, copy=False)
        node = np.zeros(len(x), np.int64)  # the root is node 0 (a one-leaf tree has no nodes)
        if len(self.thresholds) == 0:
            return node
        out = np.full(len(x), -1, np.int64)
        live = np.arange(len(x))
        while live.size:
            n = node[live]
            proj = np.einsum("ij,ij->i", x[live], self.directions[n])
            nxt = self.children[n, (proj >= self.thresholds[n]).astype(np.int64)]
            leaf = nxt < 0
            out[live[leaf]] = -nxt[leaf] - 1
            node[live] = nxt
            live = live[~leaf]
        return out


def learn_rptree(sample: np.ndarray, shards: int, seed: int) -> RPTree:
    rng = np.random.default_rng((seed, 4))
    x = sample.astype(np.float32, copy=False)
    directions, thresholds, children = [], [], []
    next_leaf = [0]

    def grow(rows: np.ndarray, leaves: int) -> int:
        """Index of the subtree's root node (or -(leaf+1) for a leaf)."""
        if leaves == 1:
            next_leaf[0] += 1
            return -next_leaf[0]
        node = len(thresholds)
        direction = rng.standard_normal(x.shape[1]).astype(np.float32)
        direction /= np.linalg.norm(direction)
        proj = x[rows] @ direction
        left_leaves = leaves // 2
        cut = np.quantile(proj, left_leaves / leaves) if rows.size else 0.0
        directions.append(direction)
        thresholds.append(np.float32(cut))
        children.append([0, 0])
        below = proj < cut
        children[node][0] = grow(rows[below], left_leaves)
        children[node][1] = grow(rows[~below], leaves - left_leaves)
        return node

    grow(np.arange(len(x)), shards)
    d = x.shape[1]
    return RPTree(np.array(directions, np.float32).reshape(-1, d), np.array(thresholds, np.float32),
                  np.array(children, np.int64).reshape(-1, 2))
