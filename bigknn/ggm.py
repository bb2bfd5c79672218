"""The backend-independent halves of GGM (paper 000 §5.1, Alg. 3): set the merge up, and fold it back.

Set-up: the two shards become one local index space [a rows | b rows]. Every list keeps its first
k - k/2 entries that lie in a or b (entries pointing into other shards cannot be cross-matched, since
their vectors are not loaded; they wait in the held-back list) and gets k/2 random rows of the other
shard, marked NEW. After the cross-shard descent, each refined list is merged with the row's whole old
list (global ids), de-duplicated, sorted, cut to k.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bigknn.backends.base import ShardPart
from bigknn.graph import EMPTY, ID_DTYPE, KnnGraph, merge_lists


@dataclass
class MergeSetup:
    ids: np.ndarray  # (na+nb, k) local ids, held part first, random fill after
    dists: np.ndarray  # keys; +inf where still to be computed (the fill)
    fill_mask: np.ndarray  # True on the random fill entries (they start NEW): the last `fill` columns
    fill: int
    part: np.ndarray  # 0 for rows of a, 1 for rows of b


def merge_stop_frac(min_update_frac: float, na: int, nb: int) -> float:
    """The stop rule of a merge, as a fraction of all (na + nb) lists: ``min_update_frac`` of the SMALLER
    shard's entries. Counting over both shards lets the converged lists of a big shard end a merge while
    the rows of a small one (an ingested batch) are still finding their neighbours."""
    return min_update_frac * min(na, nb) / (na + nb)


def fill_count(k: int) -> int:
    """How many entries of each list GGM replaces with random rows of the other shard."""
    return max(1, k // 2)


def to_local(ids: np.ndarray, a: ShardPart, b: ShardPart) -> np.ndarray:
    """Global ids -> local ids of the merged index space; ids outside both shards become EMPTY."""
    na, nb = a.vectors.shape[0], b.vectors.shape[0]
    ids = ids.astype(np.int64)
    out = np.full(ids.shape, EMPTY, dtype=np.int64)
    in_a = (ids >= a.offset) & (ids < a.offset + na)
    in_b = (ids >= b.offset) & (ids < b.offset + nb)
    out[in_a] = ids[in_a] - a.offset
    out[in_b] = ids[in_b] - b.offset + na
    return out.astype(ID_DTYPE)


def to_global(ids: np.ndarray, a: ShardPart, b: ShardPart) -> np.ndarray:
    na = a.vectors.shape[0]
    ids64 = ids.astype(np.int64)
    out = np.where(ids64 < na, ids64 + a.offset, ids64 - na + b.offset)
    return np.where(ids == EMPTY, EMPTY, out).astype(ID_DTYPE)


def start_merge(a: ShardPart, b: ShardPart, rng: np.random.Generator) -> MergeSetup:
    na, nb = a.vectors.shape[0], b.vectors.shape[0]
    k = a.graph.k
    fill = fill_count(k)
    held = k - fill
    old_ids = np.concatenate([a.graph.ids, b.graph.ids])
    old_d = np.concatenate([a.graph.dists, b.graph.dists])
    local = to_local(old_ids, a, b)
    # the first `held` entries of each list that can take part in this merge
    in_pair = local != EMPTY
    rank = np.cumsum(in_pair, axis=1) - 1
    take = in_pair & (rank < held)
    n = na + nb
    ids = np.full((n, k), EMPTY, dtype=ID_DTYPE)
    dists = np.full((n, k), np.inf, dtype=np.float32)
    r = np.broadcast_to(np.arange(n)[:, None], (n, k))
    ids[r[take], rank[take]] = local[take]
    dists[r[take], rank[take]] = old_d[take]
    rand_a = rng.integers(0, nb, size=(na, fill)) + na  # rows of b for lists of a
    rand_b = rng.integers(0, na, size=(nb, fill))  # rows of a for lists of b
    ids[:, held:] = np.concatenate([rand_a, rand_b]).astype(ID_DTYPE)
    fill_mask = np.zeros((n, k), dtype=bool)
    fill_mask[:, held:] = True
    part = np.concatenate([np.zeros(na, np.int8), np.ones(nb, np.int8)])
    return MergeSetup(ids, dists, fill_mask, fill, part)


def finish_merge(a: ShardPart, b: ShardPart, ids: np.ndarray, dists: np.ndarray) -> tuple[KnnGraph, KnnGraph]:
    """Fold the refined lists (local ids) into each row's whole old list; split back into a and b."""
    na = a.vectors.shape[0]
    k = a.graph.k
    refined = to_global(ids, a, b)
    old_ids = np.concatenate([a.graph.ids, b.graph.ids])
    old_d = np.concatenate([a.graph.dists, b.graph.dists])
    out_ids, out_d = merge_lists(np.concatenate([old_ids, refined], axis=1),
                                 np.concatenate([old_d, dists], axis=1), k)
    return KnnGraph(out_ids[:na], out_d[:na]), KnnGraph(out_ids[na:], out_d[na:])
