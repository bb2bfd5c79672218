"""The backend-independent halves of GGM (§5.1, Alg. 3 of the GNND paper: Wang, Zhao, Zeng, "Fast k-NN Graph
Construction by GPU based NN-Descent"; docs/design.md): set the merge up, and fold it back.

Set-up: the two shards become one local index space [a rows | b rows]. Every list keeps its first
k - k/2 entries that lie in a or b (entries pointing into other shards cannot be cross-matched, since
their vectors are not loaded; they wait in the held-back list) and gets k/2 random rows of the other
shard, marked NEW. After the cross-shard descent, each refined list is merged with the row's whole old
list (global ids), de-duplicated, sorted, cut to k.

Seeded merge (an ingest batch b against an old shard a, ``vias`` given): the paper's random fill makes a
merge cost about na + nb rows of descent, so folding a small batch into every old shard would cost as much
as the build's merges of those shards. Here the rows of a keep their lists whole and get no fill; each row
of b is filled first with rows of a two hops away through ``vias``, old shards already merged with b (the
a-entries of the lists of the row's neighbours in them: the old graph is global, so those lists already
hold their nearest rows of a). Several vias, not one: a row has only ~W/S neighbours in each of S shards,
and one poorly merged via would pass its weakness on to every later merge. The descent then only refines
near b, and old rows learn of new ones through it. An old row's list would have empty slots here (only its
in-pair entries take part), and an empty slot takes any candidate; so its empty slots carry the key of its
stored list's last entry (``bound``), and only rows of b that would enter its final list are taken and
spread further.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from bigknn.core.knn_graph import EMPTY, LOCAL_ID_DTYPE, KnnGraph, ShardPart, id_dtype, merge_lists


@dataclass
class MergeSetup:
    ids: np.ndarray  # (na+nb, k) local ids, held part first, random fill after
    dists: np.ndarray  # keys; +inf where still to be computed (the fill)
    fill_mask: np.ndarray  # True on the random fill entries (they start NEW): the last `fill` columns
    fill: int
    part: np.ndarray  # 0 for rows of a, 1 for rows of b
    bound: np.ndarray  # (na+nb,) key of the descent list's empty slots: +inf, or a seeded merge's old-row bound


SEEDED_MAX_FRACTION = 0.1  # an ingest merges seeded while its new rows are at most this share of the old ones
SEED_SHARDS = 4  # old shards a seeded merge draws seeds through: those merged with the batch last


def seeded_merge_fits(batch_rows: int, store_rows: int) -> bool:
    """Whether an ingest of ``batch_rows`` into a store of ``store_rows`` merges seeded. The old rows get no
    fill, which is right while new rows are few among their neighbours: about batch / store of them, in
    every old shard alike (a small shard of an earlier batch included: its rows' lists reach into the whole
    store, so the paper's merge finds little there, and seeds through the old shards find it)."""
    return batch_rows <= SEEDED_MAX_FRACTION * store_rows


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
    return out.astype(LOCAL_ID_DTYPE)


def to_global(ids: np.ndarray, a: ShardPart, b: ShardPart) -> np.ndarray:
    """Local ids of the merged index space -> store-wide ids, in the dtype that holds both shards' ids."""
    na, nb = a.vectors.shape[0], b.vectors.shape[0]
    ids64 = ids.astype(np.int64)
    out = np.where(ids64 < na, ids64 + a.offset, ids64 - na + b.offset)
    return np.where(ids == EMPTY, EMPTY, out).astype(id_dtype(max(a.offset + na, b.offset + nb)))


def start_merge(a: ShardPart, b: ShardPart, rng: np.random.Generator, vias: list[ShardPart] | None = None) -> MergeSetup:
    """Lists for the descent: held entries, then the fill (random rows of the other shard; for a seeded
    merge, rows of b get seeds through ``vias`` first and rows of a get no fill)."""
    na, nb = a.vectors.shape[0], b.vectors.shape[0]
    k = a.graph.k
    fill = fill_count(k)
    fill_a = 0 if vias else fill
    old_ids = np.concatenate([a.graph.ids, b.graph.ids])
    old_d = np.concatenate([a.graph.dists, b.graph.dists])
    local = to_local(old_ids, a, b)
    # the first `held` entries of each list that can take part in this merge
    held = np.concatenate([np.full(na, k - fill_a), np.full(nb, k - fill)])
    in_pair = local != EMPTY
    rank = np.cumsum(in_pair, axis=1) - 1
    take = in_pair & (rank < held[:, None])
    n = na + nb
    ids = np.full((n, k), EMPTY, dtype=LOCAL_ID_DTYPE)
    dists = np.full((n, k), np.inf, dtype=np.float32)
    r = np.broadcast_to(np.arange(n)[:, None], (n, k))
    ids[r[take], rank[take]] = local[take]
    dists[r[take], rank[take]] = old_d[take]
    fill_b = rng.integers(0, na, size=(nb, fill)).astype(LOCAL_ID_DTYPE)  # rows of a for lists of b
    if vias:
        seeds = seeds_through(b, a, vias, fill)
        fill_b = np.where(seeds != EMPTY, seeds, fill_b)
    ids[na:, k - fill:] = fill_b
    fill_mask = np.zeros((n, k), dtype=bool)
    fill_mask[na:, k - fill:] = True
    if fill_a:
        ids[:na, k - fill_a:] = rng.integers(0, nb, size=(na, fill_a)) + na  # rows of b for lists of a
        fill_mask[:na, k - fill_a:] = True
    part = np.concatenate([np.zeros(na, np.int8), np.ones(nb, np.int8)])
    bound = np.full(n, np.inf, dtype=np.float32)
    if vias:
        bound[:na] = list_bound(a.graph, k)
    return MergeSetup(ids, dists, fill_mask, fill, part, bound)


def list_bound(g: KnnGraph, w: int) -> np.ndarray:
    """Per row, the key a candidate must beat to enter a list of ``w`` built from this graph's lists:
    the w-th stored key (+inf where the stored list is shorter)."""
    if g.k < w:
        return np.full(g.rows, np.inf, dtype=np.float32)
    return np.ascontiguousarray(g.dists[:, w - 1], dtype=np.float32)


SEED_ROWS = 4096  # rows of b per batch of two-hop gathers: (rows, w, w) ids in flight


def seeds_through(b: ShardPart, a: ShardPart, vias: list[ShardPart], count: int) -> np.ndarray:
    """Per row of b: up to ``count`` distinct rows of a (local ids, EMPTY padded) two hops away through vias.

    Candidates are the a-entries of the lists of the row's neighbours in the vias (lists of one width),
    taken by list position first (every neighbour's nearest, then every neighbour's second, ...) and, within
    a position, by the row's own order of those neighbours (nearest first). The CUDA set-up takes them in
    the same order."""
    wv = vias[0].graph.k
    if any(v.graph.k != wv for v in vias):
        raise ValueError(f"seeded merge: via lists of widths {[v.graph.k for v in vias]}; they must be equal")
    nb, na = b.graph.rows, a.graph.rows
    out = np.full((nb, count), EMPTY, dtype=LOCAL_ID_DTYPE)
    for s in range(0, nb, SEED_ROWS):
        g = b.graph.ids[s:s + SEED_ROWS].astype(np.int64)  # (r, w) global ids
        hop = np.full(g.shape + (wv,), EMPTY, dtype=np.int64)  # (r, w, wv) lists of the row's via neighbours
        for via in vias:
            t = g - via.offset
            t_ok = (t >= 0) & (t < via.graph.rows)
            hop[t_ok] = via.graph.ids[t[t_ok]]
        hop -= a.offset  # EMPTY stays negative
        cand = np.where((hop >= 0) & (hop < na), hop, na).transpose(0, 2, 1).reshape(len(g), -1)  # na: none
        out[s:s + SEED_ROWS] = _first_distinct(cand, count, na)
    return out


def _first_distinct(cand: np.ndarray, count: int, none: int) -> np.ndarray:
    """The first ``count`` distinct values of each row other than ``none``, in row order, EMPTY padded."""
    rows, m = cand.shape
    order = np.argsort(cand, axis=1, kind="stable")
    sv = np.take_along_axis(cand, order, axis=1)
    first = np.ones_like(sv, dtype=bool)
    first[:, 1:] = sv[:, 1:] != sv[:, :-1]
    pos = np.where(first & (sv != none), order, m)  # original position of each value's first occurrence
    pos.sort(axis=1)
    pos = pos[:, :count]
    out = np.take_along_axis(cand, np.minimum(pos, m - 1), axis=1)
    out = np.where(pos < m, out, EMPTY).astype(LOCAL_ID_DTYPE)
    if out.shape[1] < count:
        out = np.pad(out, ((0, 0), (0, count - out.shape[1])), constant_values=EMPTY)
    return out


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


# (one shard, the other shard, m) -> each row of the first's exact top-m among the other's rows, global ids
CrossExactFn = Callable[[np.ndarray, ShardPart, int], KnnGraph]


def exact_merge(a: ShardPart, b: ShardPart, width: int, cross: CrossExactFn) -> tuple[KnnGraph, KnnGraph]:
    """The merge's result by brute force, for a merge whose descent stalled below its target (iid-like rows,
    where NN-Descent cannot find neighbours): each row's old list united with its exact top-``width`` in the
    other shard, cut to ``width``. Both shards' rows meet every row of the other once: the pair's share of
    the exact graph, so a build whose descents all stall still ends with the exact graph."""
    out = []
    for own, other in ((a, b), (b, a)):
        found = cross(own, other, min(width, other.graph.rows))
        ids, dists = merge_lists(np.concatenate([own.graph.ids, found.ids], axis=1),
                                 np.concatenate([own.graph.dists, found.dists], axis=1), width)
        out.append(KnnGraph(ids, dists))
    return out[0], out[1]
