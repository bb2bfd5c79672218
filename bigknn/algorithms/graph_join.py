"""Joining a small batch of new rows to a finished kNN graph by searching it (the backend-independent half of
a small ingest: bigknn/operations/ingest_join.py).

Each new row is inserted as HNSW and NSW insert a row (Malkov & Yashunin; the GNND paper's GGM is the other
way in, docs/design.md): a best-first search of the existing kNN graph finds its nearest old rows, then each old
row the search met learns of the new row if it is nearer than the last entry of its list (the reverse update).
The search starts from the old rows of a fixed entry sample nearest the new row (one exact pass over
ENTRY_ROWS rows: the well-separated clusters of a clustered store each get an entry), and keeps a search list
of BEAM rows, expanding PARENTS of them a hop, until every row of the list was expanded. The new rows'
neighbours among themselves are exact (one pass over the batch). So the work of a batch of b rows is one pass
over the old lists' ids (below), then b * (effort * ENTRY_ROWS + b + hops * PARENTS * (W + REVERSE_CAP))
distances and the lists and rows of the old rows the searches meet, whatever the store's size.

A kNN graph's edges point one way, and in data of high intrinsic dimension many rows are in few lists or none
(hubness: 5 % of a k = 8 graph of 32-d Gaussian rows): a search reaches such a row only as an entry, so a new
row whose nearest old row is one missed it (its twin found 0.92 of the time in examples/parquet_to_graph.py).
So the search also follows the reverse of the edges leaving the rows in fewer than LOW_IN_DEGREE lists: one
pass over the old lists (ids only) counts each row's lists, and a row met leads to at most REVERSE_CAP rows
that name it and few lists name, nearest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import numpy as np

from bigknn.core.knn_graph import EMPTY, KnnGraph, drop_self, merge_lists, through
from bigknn.core.metric import Metric

ENTRY_ROWS = 1024  # old rows every new row is compared with for its entry points, times the join's effort
ENTRIES = 16  # of them, the nearest a search starts from
BEAM = 64  # rows of a search's list (HNSW's efConstruction), times the join's effort
PARENTS = 4  # rows of the search list expanded a hop
MAX_HOPS = 256  # a search ends after this many hops even if rows of its list are still unexpanded
QUERY_BLOCK = 2048  # new rows searched at once (bounds the (rows, PARENTS * W, dim) gather)
LOW_IN_DEGREE = 4  # rows in fewer lists than this give the reverse of their edges (module docstring)
REVERSE_CAP = 16  # reverse edges a row met leads to, at most


class OldRows(Protocol):
    """What a join reads of the finished graph: the rows and lists of the old rows it meets (by global id)."""

    rows: int  # old rows: global ids 0..rows-1

    def vectors(self, ids: np.ndarray) -> np.ndarray:
        """float32 (len(ids), dim) rows."""

    def lists(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64, keys float32) (len(ids), W) lists of the committed graph, keys ascending, EMPTY padded."""

    def all_lists(self) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Every old row's list as stored, a block at a time: (first global id, ids, keys) of the block."""

    def all_vectors(self) -> Iterator[tuple[int, np.ndarray]]:
        """Every old row, a block at a time: (first global id, rows) of the block."""


# (queries, count, blocks of (global offset, rows)) -> exact top-count over the blocks: Backend.exact_knn, bound
ExactFn = Callable[[np.ndarray, int, list], KnnGraph]


@dataclass
class JoinCost:
    """What a join did, as counts (the measure of an ingest's cost that does not depend on the machine's load)."""

    distances: int = 0  # distance evaluations
    lists_gathered: int = 0  # old lists gathered (a list each time a search expands its row)
    rows_gathered: int = 0  # old rows gathered for distances (each distinct row once a hop)
    check_distances: int = 0  # of the recall checks (bigknn/algorithms/join_check.py): about CHECK_ROWS x rows

    def to_dict(self) -> dict:
        return {"distances": self.distances, "lists_gathered": self.lists_gathered,
                "rows_gathered": self.rows_gathered, "check_distances": self.check_distances}


@dataclass
class Joined:
    new: KnnGraph  # the new rows' lists (global ids), width W
    changed: np.ndarray  # int64 global ids of the old rows whose lists the batch entered, ascending
    changed_lists: KnnGraph  # their new lists


def join(x: np.ndarray, first_id: int, old: OldRows, width: int, metric: Metric, exact: ExactFn, seed: int,
         cost: JoinCost, effort: int = 1, reverse: ReverseEdges | None = None) -> Joined:
    """The lists of the batch ``x`` (global ids first_id..) and the old lists it enters (module docstring).
    ``effort``: the entry sample and the search lists are ``effort`` times ENTRY_ROWS and BEAM rows (a
    clustered store's small clusters need entries of their own, a high-dimensional one longer lists);
    ``reverse``: the old lists' pass, where an earlier join of the batch made it."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    reverse = reverse or ReverseEdges(old)
    beam = effort * BEAM
    entry_ids = _entry_sample(old.rows, seed, effort * ENTRY_ROWS)
    entry_x = old.vectors(entry_ids)
    cost.rows_gathered += len(entry_ids)
    parts, entering = [], []
    for s in range(0, len(x), QUERY_BLOCK):
        q = x[s:s + QUERY_BLOCK]
        start = exact(q, min(ENTRIES, len(entry_ids)), [(0, entry_x)])
        cost.distances += len(q) * len(entry_ids)
        seeds = through(entry_ids, start.ids)
        beam_ids, beam_keys, met = _search(q, seeds, start.dists, old, reverse, metric, cost, beam)
        parts.append((beam_ids, beam_keys))
        entering.append(met.triples(first_id + s))
    beam_ids = np.concatenate([p[0] for p in parts])
    beam_keys = np.concatenate([p[1] for p in parts])
    own = _among_batch(x, first_id, width, metric, exact, cost)
    new_ids, new_keys = merge_lists(np.concatenate([beam_ids, own.ids.astype(np.int64)], axis=1),
                                    np.concatenate([beam_keys, own.dists], axis=1), width)
    changed, changed_lists = _reverse(*(np.concatenate([e[i] for e in entering]) for i in range(3)), old, width,
                                      cost)
    return Joined(KnnGraph(new_ids, new_keys), changed, changed_lists)


def _entry_sample(rows: int, seed: int, count: int) -> np.ndarray:
    """``count`` old rows, ascending (every row where there are no more), the same for every batch of a seed."""
    if rows <= count:
        return np.arange(rows, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(rows, count, replace=False)).astype(np.int64)


class ReverseEdges:
    """What one pass over the old lists tells a join (module docstring): the reverse of the edges leaving the
    rows in fewer than LOW_IN_DEGREE lists, for each row they point to the rows pointing at it, nearest first;
    and each old row's last key, which a new row must beat to enter its list."""

    def __init__(self, old: OldRows):
        degree = np.zeros(old.rows, dtype=np.int32)
        self.last_key = np.empty(old.rows, dtype=np.float32)
        for first, ids, keys in old.all_lists():
            valid = (ids != EMPTY) & (ids < old.rows)
            degree += np.bincount(ids[valid], minlength=old.rows)
            # keys ascend; a list with an empty slot takes any row
            self.last_key[first:first + len(ids)] = np.where(valid.all(axis=1), keys[:, -1], np.inf)
        low = degree < LOW_IN_DEGREE
        src, dst, key = [], [], []
        for first, ids, keys in old.all_lists():
            edge = (ids != EMPTY) & (ids < old.rows) & low[first:first + len(ids), None]
            src.append(np.broadcast_to(np.arange(first, first + len(ids))[:, None], edge.shape)[edge])
            dst.append(ids[edge])
            key.append(keys[edge])
        src, dst, key = (np.concatenate(a) if a else np.empty(0) for a in (src, dst, key))
        order = np.lexsort((key, dst))
        self.targets = dst[order].astype(np.int64)
        self.sources = src[order].astype(np.int64)

    def of(self, ids: np.ndarray) -> np.ndarray:
        """(len(ids), REVERSE_CAP) int64: the rows of few lists that name each of ``ids``, EMPTY padded."""
        out = np.full((len(ids), REVERSE_CAP), EMPTY, dtype=np.int64)
        lo = np.searchsorted(self.targets, ids, side="left")
        count = np.minimum(np.searchsorted(self.targets, ids, side="right") - lo, REVERSE_CAP)
        col = np.arange(REVERSE_CAP)
        take = col[None, :] < count[:, None]
        out[take] = self.sources[(lo[:, None] + col[None, :])[take]]
        return out


def _search(q: np.ndarray, seeds: np.ndarray, seed_keys: np.ndarray, old: OldRows, reverse: ReverseEdges,
            metric: Metric, cost: JoinCost, beam: int) -> tuple[np.ndarray, np.ndarray, Entering]:
    """Best-first search of the old graph for each query: (rows, beam) ids and keys of the nearest old rows met,
    and every old row met that the query enters (nearer than its last key: not only the ``beam`` nearest, as an
    old row's neighbour need not be among the new row's nearest). A row dropped from a search list never comes
    back (the list's last key only falls), so the list itself, with a flag per entry, is all a search
    remembers."""
    entering = Entering()
    entering.add(reverse, seeds, seed_keys, np.arange(len(q)))
    ids, keys, done = merge_lists(seeds.astype(np.int64), seed_keys, beam, np.zeros(seeds.shape, dtype=bool))
    done |= ids == EMPTY
    for _ in range(MAX_HOPS):
        active = np.nonzero(~done.all(axis=1))[0]
        if not len(active):
            break
        a_ids, a_done = ids[active], done[active]
        pick = np.argsort(a_done, axis=1, kind="stable")[:, :PARENTS]  # unexpanded first, nearest first
        parent_done = np.take_along_axis(a_done, pick, axis=1)
        parents = np.where(parent_done, EMPTY, np.take_along_axis(a_ids, pick, axis=1))
        np.put_along_axis(a_done, pick, True, axis=1)
        live = parents != EMPTY
        got, _ = old.lists(parents[live])
        got = np.concatenate([got, reverse.of(parents[live])], axis=1)
        cost.lists_gathered += int(live.sum())
        lists = np.full(parents.shape + (got.shape[1],), EMPTY, dtype=np.int64)
        lists[live] = got
        cand = lists.reshape(len(active), -1)
        known = (cand[:, :, None] == a_ids[:, None, :]).any(axis=2)
        cand = np.where(known, EMPTY, cand)
        cand_keys = _keys(q[active], cand, old, metric, cost)
        entering.add(reverse, cand, cand_keys, active)
        merged = merge_lists(np.concatenate([a_ids, cand], axis=1), np.concatenate([keys[active], cand_keys], axis=1),
                             beam, np.concatenate([a_done, cand == EMPTY], axis=1))
        ids[active], keys[active], done[active] = merged
        done[active] |= ids[active] == EMPTY
    return ids, keys, entering


class Entering:
    """The (old row, query, key) triples of a search where the query is nearer than the old row's last key."""

    def __init__(self):
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, reverse: ReverseEdges, cand: np.ndarray, keys: np.ndarray, queries: np.ndarray) -> None:
        """``cand``/``keys``: (len(queries), m) old rows met by ``queries`` (EMPTY: none) and their keys."""
        valid = cand != EMPTY
        enters = np.zeros_like(valid)
        enters[valid] = keys[valid] < reverse.last_key[cand[valid]]
        row, _ = np.nonzero(enters)
        self.parts.append((cand[enters].astype(np.int64), queries[row].astype(np.int64), keys[enters]))

    def triples(self, first: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(old rows, queries numbered from ``first``, keys), each pair once."""
        v, u, key = (np.concatenate([p[i] for p in self.parts]) for i in range(3))
        order = np.lexsort((key, u, v))
        v, u, key = v[order], u[order], key[order]
        once = np.ones(len(v), dtype=bool)
        once[1:] = (v[1:] != v[:-1]) | (u[1:] != u[:-1])
        return v[once], u[once] + first, key[once]


def _keys(q: np.ndarray, cand: np.ndarray, old: OldRows, metric: Metric, cost: JoinCost) -> np.ndarray:
    """Keys from each query to its candidates (+inf where EMPTY); each distinct old row read once."""
    out = np.full(cand.shape, np.inf, dtype=np.float32)
    valid = cand != EMPTY
    if not valid.any():
        return out
    uniq, inverse = np.unique(cand[valid], return_inverse=True)
    rows = old.vectors(uniq)
    cost.rows_gathered += len(uniq)
    r = np.nonzero(valid)[0]
    out[valid] = metric.row_keys(q[r], rows[inverse])
    cost.distances += int(valid.sum())
    return out


def _among_batch(x: np.ndarray, first_id: int, width: int, metric: Metric, exact: ExactFn,
                 cost: JoinCost) -> KnnGraph:
    """The new rows' exact neighbours among themselves, self dropped (width columns, EMPTY padded)."""
    m = min(width + 1, len(x))
    got = exact(x, m, [(first_id, x)])
    cost.distances += len(x) * len(x)
    ids, keys = drop_self(got.ids.astype(np.int64), got.dists, np.arange(first_id, first_id + len(x)))
    pad = width - ids.shape[1]
    if pad > 0:
        ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=EMPTY)
        keys = np.pad(keys, ((0, 0), (0, pad)), constant_values=np.inf)
    return KnnGraph(ids, keys)


def _reverse(v: np.ndarray, u: np.ndarray, key: np.ndarray, old: OldRows, width: int,
             cost: JoinCost) -> tuple[np.ndarray, KnnGraph]:
    """The old rows ``v`` the new rows ``u`` enter (at ``key``; each pair once), and their lists with the new
    rows in: each old row takes its nearest ``width`` of its list and the new rows that enter it."""
    if not len(v):
        return np.empty(0, np.int64), KnnGraph(np.empty((0, width), np.int64), np.empty((0, width), np.float32))
    changed = np.unique(v)
    ids, keys = old.lists(changed)
    cost.lists_gathered += len(changed)
    at = np.searchsorted(changed, v)
    order = np.lexsort((key, at))
    u, key, at = u[order], key[order], at[order]
    rank = np.arange(len(at)) - np.searchsorted(at, at)  # position among the new rows entering that list
    keep = rank < width
    cand_ids = np.full((len(changed), width), EMPTY, dtype=np.int64)
    cand_keys = np.full((len(changed), width), np.inf, dtype=np.float32)
    cand_ids[at[keep], rank[keep]] = u[keep]
    cand_keys[at[keep], rank[keep]] = key[keep]
    out_ids, out_keys = merge_lists(np.concatenate([ids.astype(np.int64), cand_ids], axis=1),
                                    np.concatenate([keys, cand_keys], axis=1), ids.shape[1])
    return changed, KnnGraph(out_ids, out_keys)
