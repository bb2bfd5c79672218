"""Joining a small batch of new rows to a finished kNN graph by searching it (the backend-independent half of
a small ingest: bigknn/operations/ingest_join.py).

Each new row is inserted as HNSW and NSW insert a row (Malkov & Yashunin; the GNND paper's GGM is the other
way in, docs/design.md): a best-first search of the existing kNN graph finds its nearest old rows, then each old
row the search met learns of the new row if it is nearer than the last entry of its list (the reverse update).
The search starts from the old rows of a fixed entry sample nearest the new row (one exact pass over
ENTRY_ROWS rows: the well-separated clusters of a clustered store each get an entry), and keeps a search list
of BEAM rows, expanding PARENTS of them a hop, until every row of the list was expanded. The new rows'
neighbours among themselves are exact (one pass over the batch). So the work of a batch of b rows is
b * (ENTRY_ROWS + b + hops * PARENTS * W) distances and the lists and rows of the old rows the searches meet,
whatever the store's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from bigknn.core.knn_graph import EMPTY, KnnGraph, drop_self, merge_lists
from bigknn.core.metric import Metric

ENTRY_ROWS = 1024  # old rows every new row is compared with for its entry points
ENTRIES = 16  # of them, the nearest a search starts from
BEAM = 64  # rows of a search's list (HNSW's efConstruction); the old rows whose lists the batch may enter
PARENTS = 4  # rows of the search list expanded a hop
MAX_HOPS = 256  # a search ends after this many hops even if rows of its list are still unexpanded
QUERY_BLOCK = 2048  # new rows searched at once (bounds the (rows, PARENTS * W, dim) gather)


class OldRows(Protocol):
    """What a join reads of the finished graph: the rows and lists of the old rows it meets (by global id)."""

    rows: int  # old rows: global ids 0..rows-1

    def vectors(self, ids: np.ndarray) -> np.ndarray:
        """float32 (len(ids), dim) rows."""

    def lists(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64, keys float32) (len(ids), W) lists of the committed graph, keys ascending, EMPTY padded."""


# (queries, count, blocks of (global offset, rows)) -> exact top-count over the blocks: Backend.exact_knn, bound
ExactFn = Callable[[np.ndarray, int, list], KnnGraph]


@dataclass
class JoinCost:
    """What a join did, as counts (the measure of an ingest's cost that does not depend on the machine's load)."""

    distances: int = 0  # distance evaluations
    lists_gathered: int = 0  # old lists gathered (a list each time a search expands its row)
    rows_gathered: int = 0  # old rows gathered for distances (each distinct row once a hop)

    def to_dict(self) -> dict:
        return {"distances": self.distances, "lists_gathered": self.lists_gathered, "rows_gathered": self.rows_gathered}


@dataclass
class Joined:
    new: KnnGraph  # the new rows' lists (global ids), width W
    changed: np.ndarray  # int64 global ids of the old rows whose lists the batch entered, ascending
    changed_lists: KnnGraph  # their new lists


def join(x: np.ndarray, first_id: int, old: OldRows, width: int, metric: Metric, exact: ExactFn, seed: int,
         cost: JoinCost) -> Joined:
    """The lists of the batch ``x`` (global ids first_id..) and the old lists it enters (module docstring)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    entry_ids = _entry_sample(old.rows, seed)
    entry_x = old.vectors(entry_ids)
    cost.rows_gathered += len(entry_ids)
    parts = []
    for s in range(0, len(x), QUERY_BLOCK):
        q = x[s:s + QUERY_BLOCK]
        start = exact(q, min(ENTRIES, len(entry_ids)), [(0, entry_x)])
        cost.distances += len(q) * len(entry_ids)
        seeds = np.where(start.ids != EMPTY, entry_ids[np.maximum(start.ids, 0)], EMPTY)
        parts.append(_search(q, seeds, start.dists, old, metric, cost))
    beam_ids = np.concatenate([p[0] for p in parts])
    beam_keys = np.concatenate([p[1] for p in parts])
    own = _among_batch(x, first_id, width, metric, exact, cost)
    new_ids, new_keys = merge_lists(np.concatenate([beam_ids, own.ids.astype(np.int64)], axis=1),
                                    np.concatenate([beam_keys, own.dists], axis=1), width)
    changed, changed_lists = _reverse(beam_ids, beam_keys, first_id, old, width, cost)
    return Joined(KnnGraph(new_ids, new_keys), changed, changed_lists)


def _entry_sample(rows: int, seed: int) -> np.ndarray:
    """ENTRY_ROWS old rows, ascending (every row where there are no more), the same for every batch of a seed."""
    if rows <= ENTRY_ROWS:
        return np.arange(rows, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(rows, ENTRY_ROWS, replace=False)).astype(np.int64)


def _search(q: np.ndarray, seeds: np.ndarray, seed_keys: np.ndarray, old: OldRows, metric: Metric,
            cost: JoinCost) -> tuple[np.ndarray, np.ndarray]:
    """Best-first search of the old graph for each query: (rows, BEAM) ids and keys of the nearest old rows met.
    A row dropped from a search list never comes back (the list's last key only falls), so the list itself,
    with a flag per entry, is all a search remembers."""
    ids, keys, done = merge_lists(seeds.astype(np.int64), seed_keys, BEAM, np.zeros(seeds.shape, dtype=bool))
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
        cost.lists_gathered += int(live.sum())
        lists = np.full(parents.shape + (got.shape[1],), EMPTY, dtype=np.int64)
        lists[live] = got
        cand = lists.reshape(len(active), -1)
        known = (cand[:, :, None] == a_ids[:, None, :]).any(axis=2)
        cand = np.where(known, EMPTY, cand)
        cand_keys = _keys(q[active], cand, old, metric, cost)
        merged = merge_lists(np.concatenate([a_ids, cand], axis=1), np.concatenate([keys[active], cand_keys], axis=1),
                             BEAM, np.concatenate([a_done, cand == EMPTY], axis=1))
        ids[active], keys[active], done[active] = merged
        done[active] |= ids[active] == EMPTY
    return ids, keys


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


def _reverse(beam_ids: np.ndarray, beam_keys: np.ndarray, first_id: int, old: OldRows, width: int,
             cost: JoinCost) -> tuple[np.ndarray, KnnGraph]:
    """The old rows a search met whose lists a new row enters (nearer than their last entry), and their lists
    with the new rows in: each old row takes its nearest ``width`` of its list and the new rows that met it."""
    valid = beam_ids != EMPTY
    v = beam_ids[valid]
    u = (np.nonzero(valid)[0] + first_id).astype(np.int64)
    key = beam_keys[valid]
    if not len(v):
        return np.empty(0, np.int64), KnnGraph(np.empty((0, width), np.int64), np.empty((0, width), np.float32))
    met = np.unique(v)
    ids, keys = old.lists(met)
    cost.lists_gathered += len(met)
    at = np.searchsorted(met, v)
    enters = key < keys[at, -1]
    v, u, key, at = v[enters], u[enters], key[enters], at[enters]
    changed = np.unique(at)
    order = np.lexsort((key, at))
    v, u, key, at = v[order], u[order], key[order], at[order]
    rank = np.arange(len(at)) - np.searchsorted(at, at)  # position among the new rows entering that list
    keep = rank < width
    row = np.searchsorted(changed, at[keep])
    cand_ids = np.full((len(changed), width), EMPTY, dtype=np.int64)
    cand_keys = np.full((len(changed), width), np.inf, dtype=np.float32)
    cand_ids[row, rank[keep]] = u[keep]
    cand_keys[row, rank[keep]] = key[keep]
    out_ids, out_keys = merge_lists(np.concatenate([ids[changed].astype(np.int64), cand_ids], axis=1),
                                    np.concatenate([keys[changed], cand_keys], axis=1), ids.shape[1])
    return met[changed], KnnGraph(out_ids, out_keys)
