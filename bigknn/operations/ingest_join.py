"""A small ingest: the batch joins the existing graph by searching it (bigknn/algorithms/graph_join.py), and its
rows are appended to the store's tail shard, so that a store fed a file a day keeps a bounded number of shards.

Which batches: those of at most JOIN_MAX_FRACTION of ``shard_rows`` rows and at most JOIN_MAX_ROWS rows, into a
contiguous store (a partitioned store places a batch by its partition: bigknn/operations/ingest.py). Larger batches
become shards of their own.

Where the rows go: the tail shard is the last shard when an earlier small ingest made it (its rows live in its
graph version's directory, copy-on-write with its lists: ShardEntry.rows_with_graph) and the batch still fits
under ``shard_rows``; otherwise the batch starts a new tail. A tail is closed with more than
(1 - JOIN_MAX_FRACTION) * shard_rows rows, so a store built with S shards that took R rows by small ingests has
at most S + 1 + R / ((1 - JOIN_MAX_FRACTION) * shard_rows) shards, and never needs a merge of shard pairs.

What an ingest of b rows into a store of n rows does: one pass over the old lists (ids only: which rows few
lists name, bigknn/algorithms/graph_join.py), b * (ENTRY_ROWS + b + hops * PARENTS * (W + REVERSE_CAP)) distance
evaluations, about b * 20 hops of a search list of BEAM rows, then the recall check (bigknn/algorithms/join_check.py):
CHECK_ROWS * (n + b) distances, one read of every old row. A join below the store's recall target is done again
with twice and four times the entries and search list (JOIN_EFFORTS); one still below it is declined, and the
batch becomes a new shard, GNND and merges, as a larger batch does: a recall promise kept at a merge's cost
rather than broken at a join's. The check's cost follows the store, not the batch, so it runs on the first
join and then once the store grew by CHECK_GROWTH since the last checked join; the joins between run at the
effort the last one needed, and each checked join starts again from the least (recorded with each input,
``join_effort``, ``join_checked``; a batch declined, ``join_declined``, has the next join checked). Amortised,
the checks cost about CHECK_ROWS / CHECK_GROWTH distances per row ingested, the order of the search's own.

A join writes a new graph version of every shard whose lists the batch entered, plus the tail (its rows and
lists). The search's counts follow the batch; the check and the bytes read follow
the store.

Crash safety: everything is written under new version numbers and becomes visible in one commit, which also
records the input: a run killed before it leaves the store as it was, and the rerun does the whole join again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from bigknn.backends import Backend
from bigknn.formats import VectorSource
from bigknn.core.knn_graph import KnnGraph, final_columns, widened
from bigknn.algorithms.graph_join import JoinCost, Joined, ReverseEdges, join
from bigknn.algorithms.join_check import check, truth
from bigknn.core.metric import metric as metric_of, prepare_rows
from bigknn.engine.accounting import Accounting
from bigknn.core.progress import Reporter
from bigknn.shards import ShardEntry, Store
from bigknn.shards.manifest import Manifest, TAIL_SINCE
from bigknn.shards.upgrade import mark_format

JOIN_MAX_FRACTION = 0.25  # a batch of at most this share of shard_rows joins the graph (module docstring)
# and of at most this many rows: the join searches on the host and takes the batch's own neighbours exactly (b^2
# distances), where GNND and the seeded merges of a larger batch run on the backend
JOIN_MAX_ROWS = 1 << 16
JOIN_EFFORTS = (1, 2, 4)  # a join's efforts (graph_join.join), tried in turn until its check reaches the target
CHECK_GROWTH = 0.1  # a join is checked again once the store grew by this share since the last checked one


def joins(m: Manifest, rows: int) -> bool:
    """Whether a batch of ``rows`` rows joins the store's graph (not new shards, GNND and merges)."""
    return (m.partition is None and rows <= min(JOIN_MAX_FRACTION * m.shard_rows, JOIN_MAX_ROWS)
            and m.rows > m.params.width())


def shard_bound(built_shards: int, joined_rows: int, shard_rows: int) -> int:
    """The most shards a store of ``built_shards`` shards has after ``joined_rows`` rows of small ingests."""
    return built_shards + 1 + int(joined_rows // ((1 - JOIN_MAX_FRACTION) * shard_rows))


class StoreRows:
    """The committed rows and lists of a store as the join reads them (bigknn/algorithms/graph_join.py OldRows):
    a shard is read whole the first time a search reaches it, then kept for the run."""

    def __init__(self, store: Store):
        self.store = store
        m = store.manifest
        self.rows = m.rows
        self.offsets = np.array([s.offset for s in m.shards], dtype=np.int64)
        self.id_dtype = m.id_dtype
        self._vectors: dict[int, np.ndarray] = {}
        self._graphs: dict[int, KnnGraph] = {}
        self.bytes_read = 0

    def shard_vectors(self, sid: int) -> np.ndarray:
        if sid not in self._vectors:
            x = self.store.read_vectors(sid)
            self.bytes_read += x.nbytes
            self._vectors[sid] = x
        return self._vectors[sid]

    def shard_graph(self, sid: int) -> KnnGraph:
        if sid not in self._graphs:
            g = self.store.read_graph(sid)
            self.bytes_read += g.ids.nbytes + g.dists.nbytes
            self._graphs[sid] = widened(g, self.store.manifest.params.width())  # stored final graphs are k wide
        return self._graphs[sid]

    def _by_shard(self, ids: np.ndarray):
        shard = np.searchsorted(self.offsets, ids, side="right") - 1
        for sid in np.unique(shard):
            sel = np.nonzero(shard == sid)[0]
            yield int(sid), sel, ids[sel] - self.offsets[sid]

    def vectors(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        out = np.empty((len(ids), self.store.manifest.dim), dtype=np.float32)
        for sid, sel, local in self._by_shard(ids):
            out[sel] = self.shard_vectors(sid)[local]
        return out

    def all_lists(self):
        k = self.store.manifest.k  # the final lists' width: what a new row must beat to enter one
        for sid, offset in enumerate(self.offsets):
            g = self.shard_graph(sid)
            yield int(offset), g.ids[:, :k], g.dists[:, :k]

    def all_vectors(self):
        for sid, offset in enumerate(self.offsets):  # kept where a search read them; not kept otherwise
            x = self._vectors.get(sid)
            if x is None:
                x = self.store.read_vectors(sid)
                self.bytes_read += x.nbytes
            yield int(offset), x

    def lists(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = np.asarray(ids, dtype=np.int64)
        width = self.store.manifest.params.width()
        out_ids = np.empty((len(ids), width), dtype=np.int64)
        out_keys = np.empty((len(ids), width), dtype=np.float32)
        for sid, sel, local in self._by_shard(ids):
            g = self.shard_graph(sid)
            out_ids[sel] = g.ids[local]
            out_keys[sel] = g.dists[local]
        return out_ids, out_keys


@dataclass
class Declined:
    """A join that fell short of the store's recall target at every effort: nothing was written."""

    checks: list[dict]  # each effort's JoinCheck
    cost: JoinCost

    def to_dict(self) -> dict:
        return {**self.cost.to_dict(), "checks": self.checks}


def join_batch(store: Store, vf: VectorSource, fp: dict, backend: Backend, reporter: Reporter, acct: Accounting,
               unchanged: Callable[[], bool]) -> dict | Declined | None:
    """Join the rows of ``vf`` (checked and hashed: ``fp``) to the store's graph and commit them with the input's
    record, in one commit. A join that is due a check (``_check_due``) is measured against the store's recall
    target (bigknn/algorithms/join_check.py) and searched again with more entries and longer search lists
    (JOIN_EFFORTS) where it falls short. Returns the run's counts (JoinCost, the bytes read and written, each
    effort's check); Declined, writing nothing, where no effort reached the target; None, writing nothing, where
    ``unchanged()`` says after the rows were read that the file is no longer the one hashed."""
    m = store.manifest
    t = time.perf_counter()
    offset, b = m.rows, vf.rows
    x = prepare_rows(vf.read(0, b), m.metric).astype(np.dtype(m.dtype), copy=False)
    if not unchanged():
        return None
    m.hold_ids_of(offset + b)
    old = StoreRows(store)
    cost = JoinCost()
    metric = metric_of(m.metric)

    def exact(q: np.ndarray, count: int, blocks) -> KnnGraph:
        return backend.exact_knn(q, count, metric, blocks)

    last_effort, due = _check_due(m)
    reverse, checks, exact_side = None, [], None
    for effort in (e for e in JOIN_EFFORTS if e >= last_effort):
        with reporter.phase("join" if effort == 1 else f"join ({effort}x the entries and search)", b,
                            "rows") as advance:
            reverse = reverse or ReverseEdges(old)
            got = join(x, offset, old, m.params.width(), metric, exact, m.seed, cost, effort, reverse)
            advance(b)
        if not due:
            break
        exact_side = exact_side or truth(x, offset, old, m.k, exact, m.seed, cost)  # once for every effort
        checked = check(exact_side, got)
        checks.append({"effort": effort, **checked.to_dict()})
        if checked.reached(m.params.recall):
            break
        reporter.note(f"join: recall {checked.new_rows.recall:.4f} on the new rows, {checked.old_rows.recall:.4f} "
                      f"on the old rows near them (effort {effort}): below the target {m.params.recall}")
    else:
        acct.add("join", time.perf_counter() - t, old.bytes_read)
        return Declined(checks, cost)
    fp.update(join_effort=effort, join_checked=due)
    tail = m.shards[-1]
    appends = tail.rows_with_graph and tail.rows + b <= m.shard_rows
    entered = _entered(m, old, got)
    tid = tail.id if appends else len(m.shards)
    versions, written = {}, 0
    for sid, g in entered.items():
        if sid != tid:
            versions[sid] = store.next_version(sid, m.shards[sid].graph)
            written += _write(store, sid, versions[sid], g, old.shard_vectors(sid) if m.shards[sid].rows_with_graph
                              else None)
    new_lists = KnnGraph(got.new.ids.astype(m.id_dtype), got.new.dists)
    if appends:
        kept = entered[tid] if tid in entered else old.shard_graph(tid)
        rows = np.concatenate([old.shard_vectors(tid), x])
        graph = KnnGraph(np.concatenate([kept.ids.astype(m.id_dtype), new_lists.ids]),
                         np.concatenate([kept.dists, new_lists.dists]))
    else:
        rows, graph = x, new_lists
    version = store.next_version(tid, tail.graph if appends else None)
    written += _write(store, tid, version, graph, rows)
    for sid, v in versions.items():
        m.shards[sid].graph = v
    if appends:
        tail.rows, tail.graph = len(rows), version
    else:
        m.shards.append(ShardEntry(id=tid, offset=offset, rows=b, graph=version, rows_with_graph=True))
        m.merged.extend([i, tid] for i in range(tid))  # joined to every shard: no pair left to merge
    if m.format < TAIL_SINCE:
        m.format = TAIL_SINCE
        mark_format(store.path, m.format)
    m.inputs.append(fp)
    store.commit()
    acct.add("join", time.perf_counter() - t, old.bytes_read, written)
    return {**cost.to_dict(), "bytes_read": old.bytes_read, "bytes_written": written,
            "shards_written": len(versions) + 1, "checks": checks}


def _check_due(m: Manifest) -> tuple[int, bool]:
    """The effort this join starts at, and whether it is checked: the first join, each one after the store grew
    by CHECK_GROWTH since the last checked one, and the one after a declined batch are checked, from the least
    effort up (the data may have become easier); the joins between run at the effort the last one reached.
    Never checked without a target (recall 0, the experts' fixed behaviour)."""
    joins = [rec for rec in m.inputs if "join_effort" in rec or rec.get("join_declined")]
    checked = [rec["first_id"] for rec in joins if rec.get("join_checked")]
    due = bool(m.params.recall) and (not checked or m.rows > (1 + CHECK_GROWTH) * checked[-1]
                                     or bool(joins[-1].get("join_declined")))
    if due or not joins or joins[-1].get("join_declined"):
        return JOIN_EFFORTS[0], due
    return joins[-1]["join_effort"], False


def _entered(m: Manifest, old: StoreRows, got: Joined) -> dict[int, KnnGraph]:
    """Per shard whose lists the batch entered: its whole graph with those lists replaced."""
    shard_of = np.searchsorted(old.offsets, got.changed, side="right") - 1
    out = {}
    for sid in map(int, np.unique(shard_of)):
        sel = shard_of == sid
        g = old.shard_graph(sid)
        ids, keys = g.ids.astype(m.id_dtype), g.dists.copy()
        local = got.changed[sel] - m.shards[sid].offset
        ids[local] = got.changed_lists.ids[sel]
        keys[local] = got.changed_lists.dists[sel]
        out[sid] = KnnGraph(ids, keys)
    return out


def _write(store: Store, sid: int, version: int, graph: KnnGraph, rows: np.ndarray | None) -> int:
    """Write a shard's new graph version, k wide as every final graph (with its rows, for a shard that keeps them
    there); the bytes written."""
    graph = final_columns(graph, store.manifest.k)
    written = graph.ids.nbytes + graph.dists.nbytes
    if rows is not None:
        store.write_vectors(sid, rows, version)
        written += rows.nbytes
    store.write_graph(sid, version, graph)
    return written
