"""``bigknn merge STORE OTHER...``: fold stores built independently (another machine, another day) into STORE,
reusing their graphs: a merge, not a rebuild; the way a build is split across machines without a cluster.

The other stores' shards become new shards of STORE after its last row: their vectors are hard links to the
other store's checked chunk files where both stores are on one file system in the current format (no bytes
copied: the files get a second name, and a later writer of either store only ever removes its own names),
else copies; their
committed graphs become the new shards' first graph versions, ids renumbered to STORE's rows (offset by the rows
before them). The pairs within one other store were merged when it was built and are recorded as merged; GGM
runs on every pair across stores: STORE's shards with each new shard, and new shards of different stores.
Everything is staged in the manifest's ``pending`` section, laid out as an ingest's (bigknn/operations/ingest.py),
so a killed merge resumes from its last commit (the same command again, or ``bigknn merge STORE``), and readers
see the old graph until one final commit makes the merged one visible. Each other store is recorded in STORE's
``inputs`` (``STORE_KEY``: its manifest's sha256) with its own inputs after it, ids shifted: merging it again is
a no-op that says so, and an ``ingest`` of a file it was built from is skipped.

The manifest's recall estimate stays the one measured before the merge, and says so: its ``graph_rows`` is
fewer than the store's rows; ``bigknn eval recall`` measures the merged graph.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np

from bigknn.backends import Backend
from bigknn.core.knn_graph import shifted
from bigknn.engine.accounting import Accounting
from bigknn.operations.merge_checks import (STORE_KEY, check_id_room, check_other, check_store, digest,
                                          merged_digests)
from bigknn.engine.executor import Executor, InProcess
from bigknn.engine.pending import StagedLedger, cache_shards, check_merge_count, record_timings
from bigknn.core.progress import Reporter
from bigknn.shards import ShardEntry, Store, WriterLock, user_ids
from bigknn.shards.sections import STORES_KEYS, PendingWrite

COPY_THREADS = 4  # shards copied at once: reading, checking and writing chunks run on several cores


def merge_stores(store_path: Path, others: list[Path], backends: list[Backend], reporter: Reporter,
                 wait_s: float = 0.0, host_mem: int | None = None, executor: Executor | None = None) -> dict:
    """Merge the stores ``others`` into ``store_path``; returns what was merged, skipped (merged before) and the
    times. Every refusal comes before the writer lock is taken: a refused merge writes nothing. ``executor``:
    where the merges run (default: in process, on ``backends``)."""
    executor = executor or InProcess(backends)
    t0 = time.perf_counter()
    acct = Accounting()
    store = Store.open(store_path, pin=False)
    opened: list[Store] = []
    try:
        for path in others:  # pinned: the graph versions read stay on disk whatever their writers do
            opened.append(Store.open(path))
        todo = _check(store, opened)
        _check_resources(store, todo, len(backends), host_mem, reporter)
        report = {"store": str(store_path), "merged": [], "skipped": [], "rows_added": 0, "merges_run": 0,
                  "resumed": None, "shards_linked": 0}
        with WriterLock(store_path, wait_s):
            store = Store.open(store_path, pin=False)  # re-read: another writer may have committed while we waited
            todo = _check(store, opened)
            rows_before = store.manifest.rows
            before = merged_digests(store, staged=False)
            for other in opened:
                report["skipped" if digest(other) in before else "merged"].append(str(other.path))
                if digest(other) in before:
                    reporter.note(f"{other.path}: already merged into {store_path}; skipped")
            if store.manifest.pending:
                report["resumed"] = store.manifest.pending.inputs[0]["path"]
                report["merges_run"] += resume(store, executor, reporter, acct, host_mem)
            if todo:
                report["shards_linked"] = _stage(store, todo, reporter, acct)
                report["merges_run"] += resume(store, executor, reporter, acct, host_mem)
            record_timings(store, acct)
            store.close()
    finally:
        for other in opened:
            other.close()
    m = store.manifest
    if report["merged"] and m.estimate is not None and m.estimate.get("graph_rows", m.rows) < m.rows:
        reporter.note(f"{store_path}: the recorded recall estimate was measured on {m.estimate['graph_rows']:,} rows, "
                      f"before the merge; `bigknn eval recall {store_path}` measures the merged graph")
    report.update({"rows_added": m.rows - rows_before, "rows": m.rows, "shards": len(m.shards),
                   "merges_done": len(m.merged), "merges_total": m.merges_total,
                   "wall_s": round(time.perf_counter() - t0, 3), **acct.summary(), "recall_estimate": m.estimate})
    return report


def resume(store: Store, executor: Executor, reporter: Reporter, acct: Accounting,
           host_mem: int | None = None) -> int:
    """Run the staged merge's remaining merges, then make it visible in one commit; returns the pairs merged."""
    ledger = StagedLedger(store)  # every pair with a new shard: those within one other store are done
    before = len(ledger.history())
    executor.run_pending(store, ledger, reporter, acct, host_mem)
    merged = len(ledger.history()) - before
    ledger.finish()
    store.commit()
    return merged


def _check(store: Store, others: list[Store]) -> list[Store]:
    """Refuse what cannot merge (bigknn/operations/merge_checks.py); return the others not merged or staged yet."""
    check_store(store)
    merged, todo = merged_digests(store), []
    for i, other in enumerate(others):
        if digest(other) not in merged:
            check_other(store, other, others[:i])
            todo.append(other)
    check_id_room(store, store.manifest.rows + _pending_rows(store) + sum(o.manifest.rows for o in todo))
    return todo


def _pending_rows(store: Store) -> int:
    pending = store.manifest.pending
    return sum(s.rows for s in pending.shards) if pending else 0


def _check_resources(store: Store, todo: list[Store], workers: int, host_mem: int | None,
                     reporter: Reporter) -> None:
    """Refuse, before anything is written, a merge whose shards do not fit ``host_mem`` or whose merges cannot
    finish: every pair across stores (a staged merge's counted whole)."""
    m = store.manifest
    pending = m.pending.shards if m.pending else []
    groups = [[s.rows for s in m.shards]] + ([[s.rows for s in pending]] if pending else [])
    groups += [[s.rows for s in o.manifest.shards] for o in todo]
    shards = sum(len(g) for g in groups)
    merges = (shards * shards - sum(len(g) ** 2 for g in groups)) // 2
    cache_shards(m, store.path, max(max(g) for g in groups), workers, host_mem)
    check_merge_count(store.path, shards, merges, "merge fewer stores at once, or stores built with a larger "
                                                  "--shard-rows", reporter)


def _stage(store: Store, others: list[Store], reporter: Reporter, acct: Accounting) -> int:
    """Copy the other stores' shards (vectors, renumbered graphs, user ids) after STORE's, then commit them as a
    pending merge (invisible to readers). A killed copy leaves only arrays no commit names: they are removed
    and written again by the next run. Returns how many shards' rows were hard-linked rather than copied."""
    m = store.manifest
    t = time.perf_counter()
    first, offset = len(m.shards), m.rows
    store.remove_uncommitted_shards(range(first, first + sum(len(o.manifest.shards) for o in others)))
    m.hold_ids_of(offset + sum(o.manifest.rows for o in others))  # before any graph is written with the new ids
    inputs: list[dict] = []
    starts: list[tuple[Store, int]] = []  # (other store, the row id its first row gets)
    copies: list[tuple[Store, ShardEntry, int, int]] = []  # (other store, its shard, new shard id, row offset)
    merged: list[list[int]] = []
    for other in others:
        om = other.manifest
        sid0, row0 = first + len(copies), offset + sum(c[1].rows for c in copies)
        inputs.append({"path": str(other.path.resolve()), "rows": om.rows, "first_id": row0, STORE_KEY: digest(other)})
        inputs += [dict(rec, first_id=rec.get("first_id", 0) + row0) for rec in om.inputs]
        starts.append((other, row0))
        copies += [(other, s, sid0 + s.id, row0) for s in om.shards]
        merged += [[sid0 + a, sid0 + b] for a, b in om.merged]
    with reporter.phase("copy", sum(c[1].rows for c in copies), "rows") as advance, \
            ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="copy") as pool:
        done = list(pool.map(lambda job: _copy_shard(store, *job, advance), copies))
    for other, row0 in starts:
        if user_ids.stored_kind(other.path, other.manifest.rows) is not None:
            user_ids.copy_parts(other.path, other.manifest.rows, store.path, row0)
    new = [ShardEntry(id=sid, offset=row0 + s.offset, rows=s.rows) for _, s, sid, row0 in copies]
    m.pending = PendingWrite(inputs, new, {c[2]: version for c, (version, _, _) in zip(copies, done)}, merged,
                             layout=STORES_KEYS)
    store.commit()
    acct.add("copy", time.perf_counter() - t, nbytes_read=sum(n for _, n, _ in done),
             nbytes_written=sum(n for _, n, linked in done if not linked))
    return sum(linked for _, _, linked in done)


def _copy_shard(store: Store, other: Store, shard: ShardEntry, sid: int, row0: int,
                advance: Callable[[int], None]) -> tuple[int, int, bool]:
    """Copy one shard of ``other`` to shard ``sid`` of ``store``, its graph's ids moved by ``row0``: its rows as
    hard links to the other store's chunk files where both allow it (Store.link_vectors), else copied. Returns
    the graph version written, the vector bytes read, and whether they were linked (nothing written)."""
    linked = store.link_vectors(sid, other, shard.id)
    if not linked:
        store.write_vectors(sid, other.read_vectors(shard.id))
    version = store.next_version(sid, None)
    store.write_graph(sid, version, shifted(other.read_graph(shard.id), row0, row0 + other.manifest.rows))
    advance(shard.rows)
    return version, shard.rows * other.manifest.dim * np.dtype(other.manifest.dtype).itemsize, linked

