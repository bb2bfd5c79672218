"""Near-pair choice: the shard pairs whose merges bring in the true neighbours the recall target needs.

Given the exact neighbours of a row sample (store positions) and the shard of every position, each pair's
mass is the number of the sample's true neighbours that live across it. Pairs are taken by decreasing mass
until same-shard and chosen pairs together cover ``coverage(recall)`` of all true neighbours; every shard keeps
its heaviest pair (a shard no merge touches never sees another shard's rows). Where that needs most of the
pairs anyway (data with no locality: iid), every pair is taken: the sample's masses of the remaining pairs are
too noisy to leave any out, and the saving is small.
"""

from __future__ import annotations

import numpy as np

ALL_PAIRS_FRACTION = 0.5  # choosing more than this share of all pairs takes them all
MISSED_SHARE = 0.1  # of the recall target's allowed misses, the share the partition may cause (0.25 left the
# clustered synth 200K x 96, 17 shards, at 0.988 by eval recall: the plan fits its own 2000-row sample)


def coverage(recall: float) -> float:
    """The share of true neighbours the chosen pairs must cover for a build aiming at ``recall``."""
    return 1.0 - (1.0 - recall) * MISSED_SHARE


def pair_masses(shard_of_row: np.ndarray, shard_of_neighbour: np.ndarray, shards: int) -> tuple[np.ndarray, int]:
    """(S, S) upper-triangular counts of true neighbours across each pair, and the count within shards.
    ``shard_of_row`` (n,), ``shard_of_neighbour`` (n, m) with -1 for no neighbour."""
    a = np.broadcast_to(shard_of_row[:, None], shard_of_neighbour.shape)
    valid = shard_of_neighbour >= 0
    a, b = a[valid], shard_of_neighbour[valid]
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    mass = np.zeros((shards, shards), np.int64)
    np.add.at(mass, (lo[lo != hi], hi[lo != hi]), 1)
    return mass, int((lo == hi).sum())


def choose_pairs(mass: np.ndarray, within: int, recall: float) -> list[list[int]]:
    """The pairs (i < j, sorted) to merge: see the module's docstring."""
    shards = len(mass)
    every = [[i, j] for i in range(shards) for j in range(i + 1, shards)]
    total = within + int(mass.sum())
    if total == 0 or shards < 2:
        return every
    i, j = np.triu_indices(shards, 1)
    order = np.argsort(-mass[i, j], kind="stable")
    covered = within + np.cumsum(mass[i, j][order])
    need = int(np.searchsorted(covered, coverage(recall) * total)) + 1  # the first prefix that reaches it
    chosen = {(int(i[o]), int(j[o])) for o in order[:need]}
    full = mass + mass.T
    for s in range(shards):
        t = int(np.argmax(np.where(np.arange(shards) == s, -1, full[s])))
        chosen.add((min(s, t), max(s, t)))
    if len(chosen) > ALL_PAIRS_FRACTION * len(every):
        return every
    return sorted([a, b] for a, b in chosen)


def near_shards(primary: np.ndarray, pairs: list[list[int]], recall: float) -> list[int]:
    """The build shards a new batch must merge with: the shards its rows would be stored in (``primary``:
    rows per shard, by the stored partition), by decreasing count until ``coverage(recall)`` of the rows,
    and each one's partners in the build's plan (``pairs``: where the neighbours of that shard's rows live)."""
    order = np.argsort(-primary, kind="stable")
    need = int(np.searchsorted(np.cumsum(primary[order]), coverage(recall) * primary.sum())) + 1
    home = {int(s) for s in order[:need]}
    near = home | {b if a in home else a for a, b in pairs if a in home or b in home}
    return sorted(s for s in near if s < len(primary))
