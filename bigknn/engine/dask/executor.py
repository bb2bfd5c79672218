"""The client's side of a run on a Dask cluster: ``DaskExecutor``, the ``Executor`` (bigknn/engine/executor.py)
whose pending work runs as Dask tasks.

The same ``Scheduler`` as in-process decides what may run (GNND of each shard as it arrives; the merge of a
pending pair once both shards have a graph and no running merge touches either), with one client thread per
worker thread of the cluster: each takes a task, submits it (``tasks.gnnd`` / ``tasks.merge``) with the
graph versions it must read, and waits for its result.

A task keeps its new graphs pending in its worker's memory (bigknn/engine/dask/worker_tasks.py); the client's
``Writer``, the in-process one, has them written (``flush.ClusterSink``) at checkpoints, when a shard has no
merge left, to make room, and at the end, and commits a pair once both its graphs are on disk. So a shard
merged many times between checkpoints is written once. The client is the only committer, and a pair is
committed once: the scheduler hands each pending pair out once, and a task's retries all end in one
result.

Where a task runs (``holdings.place``): on the worker holding its shards' pending versions while it has a
thread free; a shard pending on another worker is handed over (``tasks.hand_over``: Dask moves the graph
from worker to worker, not through the disk). Every task is pinned to its worker (``connect.pinned_result``:
Dask would steal it for an idle worker that lacks the graphs). A worker that dies takes its pending
versions with it (the client sees it leave while it waits on a task there: ``WorkerGone``): the shards
revert to their newest written versions, and the pairs that reached the lost versions and were not
committed go back to the scheduler (merging a pair again is harmless). A task that fails otherwise is
submitted again with the shards' current versions (``ATTEMPTS`` in all).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from itertools import chain
from typing import Callable, Iterable

from bigknn.engine.dask import worker_tasks as tasks
from bigknn.engine.dask.connect import Cluster, WorkerGone, pinned_result
from bigknn.engine.dask.flush import ClusterSink
from bigknn.engine.dask.holdings import Holdings, place
from bigknn.engine.dask.worker_tasks import PendingLost, ShardRef, StoreSpec, TaskResult
from bigknn.core.errors import BadInput
from bigknn.engine.accounting import Accounting
from bigknn.engine.recall_sample import SampleTruth
from bigknn.engine.scheduler import TASK_NAMES, Pair, Scheduler, task_parts
from bigknn.engine.pending import Ledger
from bigknn.engine.workers import seed_for
from bigknn.engine.writer import Writer
from bigknn.core.progress import Reporter
from bigknn.shards import ShardEntry, Store

log = logging.getLogger("bigknn")
ATTEMPTS = 3  # submissions of one task before its error ends the run


class DaskExecutor:
    """``Executor`` on a Dask cluster (bigknn/engine/dask/connect.py ``dask_executor``): the tasks run on its
    workers, the client schedules them and commits."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def workers(self) -> int:
        return self.cluster.workers()

    def run_pending(self, store: Store, ledger, reporter: Reporter, acct: Accounting, host_mem: int | None = None,
                    incoming: tuple[Iterable, list[int]] | None = None, sample: SampleTruth | None = None,
                    plan: Callable[[], None] | None = None) -> None:
        """``Executor.run_pending``; ``host_mem`` goes unused: the client caches no shards."""
        run_on_cluster(self.cluster, store, ledger, reporter, acct, incoming, sample)
        if plan is not None:
            plan()
            run_on_cluster(self.cluster, store, Ledger(store), reporter, acct)


def run_on_cluster(cluster: Cluster, store: Store, ledger, reporter: Reporter, acct: Accounting,
                   incoming: tuple[Iterable, list[int]] | None = None, sample: SampleTruth | None = None) -> None:
    """GNND for every shard without a graph and GGM for every pending pair, on the cluster's workers
    (``Executor.run_pending``'s contract: progress committed as it goes, ``incoming`` taken as it is sharded)."""
    check_visible(cluster, store)
    shards = ledger.shards()
    new_sizes = incoming[1] if incoming else []
    todo = [s for s in shards if ledger.version(s.id) is None]
    source: Iterable | None = ((s, None) for s in todo) if todo else None  # the workers read the vectors
    if incoming:
        source = chain(source or (), incoming[0])
    slots = cluster.slots()
    sched = Scheduler(ledger.todo_pairs(len(shards) + len(new_sizes)),
                      ready=[s.id for s in shards if ledger.version(s.id) is not None],
                      feeding=source is not None, queue_limit=slots + 1)
    tasks_total = len(sched.pending) + len(todo) + len(new_sizes)
    if not tasks_total:
        return
    run = _Run(cluster, store, ledger, acct, sched, sample)
    parts = task_parts(len(todo) + len(new_sizes), len(sched.pending))
    with reporter.phase("build", tasks_total, "tasks", parts) as advance:
        run.go(slots, source, advance)


def check_visible(cluster: Cluster, store: Store) -> None:
    """Refuse (exit 2) a store that a worker cannot see, before any task is submitted."""
    path = str(store.path.resolve())
    seen = cluster.client.run(tasks.sees_store, path)
    blind = sorted(addr for addr, ok in seen.items() if not ok)
    if blind:
        raise BadInput(store.path, f"Dask worker {blind[0]} cannot see this store ({len(blind)} of {len(seen)} "
                                   "workers); put it on a path every worker sees (a shared file system)")


class _Redo(Exception):
    """A shard of the task lost its only graph with a worker: its GNND runs again first."""


class _Run:
    """One run's client threads, where each shard's graph is (``Holdings``), and its writer."""

    def __init__(self, cluster: Cluster, store: Store, ledger, acct: Accounting, sched: Scheduler,
                 sample: SampleTruth | None):
        self.cluster, self.store, self.ledger, self.acct, self.sched = cluster, store, ledger, acct, sched
        self.spec = StoreSpec.of(store, cluster.backend, cluster.gpu_mem)
        self.seed = store.manifest.seed
        self.sample = sample
        self._sample_future = None  # the sample's vectors on the workers (_sample_data)
        cluster.client.run(tasks.drop_pending, self.spec.path)  # a killed client's, on a cluster that lives on
        self.holdings = Holdings({s.id: ledger.version(s.id) for s in ledger.shards()})
        self.sink = ClusterSink(cluster.client, self.spec, self.holdings, self._lost)
        self.writer = Writer(store, ledger, acct, self.sink)
        self.threads = cluster.client.nthreads()
        self.inflight: Counter[str] = Counter()  # worker -> this run's tasks submitted to it and not done
        self.merged_with: dict[int, list[int]] = {}  # the shards each shard was merged with, in order
        for i, j in ledger.history():
            self._record(i, j)
        self.lock = threading.Lock()

    def go(self, slots: int, source: Iterable | None, advance: Callable[..., None]) -> None:
        """Feed ``source`` to the scheduler and run ``slots`` client threads until every task is done and its
        graphs are written; rounds again while a lost worker's work came back to the scheduler."""
        errors: list[BaseException] = []
        feeder = threading.Thread(target=self._feed, args=(source, errors), daemon=True, name="gnnd-feed")
        if source is not None:
            feeder.start()
        try:
            while not errors:
                threads = [threading.Thread(target=self._slot, args=(advance, errors), daemon=True,
                                            name=f"dask-{n}") for n in range(slots)]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join()
                if errors:
                    break
                self.writer.write_sync(self.sink.dirty())
                for worker, held in self.holdings.pending().items():  # superseded by a result never used
                    self._lost(list(held), worker)
                if not self.sched.has_work():
                    break
        finally:
            self.sched.stop()  # wakes a feeder still waiting to queue a shard
            if source is not None:
                feeder.join()
            self.writer.close()  # what finished is written and committed, also when a task failed
        if errors:
            raise errors[0]

    def _feed(self, source: Iterable, errors: list[BaseException]) -> None:
        items = iter(source)
        try:
            for item in items:
                if not self.sched.add_shard(item):  # a task failed: end the source (a sharding pass) too
                    getattr(items, "close", lambda: None)()
                    return
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread by go()
            errors.append(e)
            self.sched.stop()
        finally:
            self.sched.feed_done()

    def _slot(self, advance: Callable[..., None], errors: list[BaseException]) -> None:
        last: set[int] = set(self.ledger.last_pair() or ())
        try:
            while (task := self.sched.next_task(last, lambda free: self._choose(free, last))) is not None:
                kind, what = task
                if kind == "gnnd":
                    self._gnnd(what[0])
                else:
                    self._merge(what)
                    last = set(what)
                advance(1, TASK_NAMES[kind])
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread by go()
            errors.append(e)
            self.sched.stop()

    def _choose(self, free: list[Pair], last: set[int]) -> Pair | None:
        """The free pair to merge next (called under the scheduler's lock): the one ``place`` ranks first
        (fewest tasks in flight plus graphs to hand over), then the one whose moved shard has the most pairs
        left with the shards its new worker holds (one move buys several merges), then the most in
        its worker's memory, then sharing a shard with this thread's last pair. None (wait for a task to
        end) if that pair needs a graph handed over and its worker is computing: the task frees shards on
        that worker."""
        held_on = self.holdings.pending()
        partners: dict[int, set[int]] = {}  # the shards each shard has a pair left with
        for a, b in self.sched.pending:
            partners.setdefault(a, set()).add(b)
            partners.setdefault(b, set()).add(a)

        def cost(pair: Pair) -> tuple:
            held = [self.holdings.get(s) for s in pair]
            worker, moves = place(held, self.threads, self.inflight)
            busy = self.inflight[worker] if worker is not None else 0
            there = held_on.get(worker, {}).keys()
            gain = sum(len(partners.get(pair[n], set()) & there) for n in moves)
            return (bool(moves) and busy > 0, busy + len(moves), len(moves), -gain,
                    -sum(h.seen == worker for h in held), -len(set(pair) & last))

        with self.lock:
            best = min(free, key=cost)
            return None if cost(best)[0] else best

    # ---- tasks ---------------------------------------------------------------------------------
    def _sample_data(self):
        """The recall sample's vectors on the workers (None without a sample): sent to every worker once, not
        with each GNND task, and sent again once a worker's death lost them (Dask then cancels every task
        that needs them, "lost dependencies", retries included: a CI run failed so)."""
        if self.sample is None:
            return None
        with self.lock:
            if self._sample_future is None or self._sample_future.status != "finished":
                self._sample_future = self.cluster.client.scatter(self.sample.vectors, broadcast=True)
            return self._sample_future

    def _gnnd(self, shard: ShardEntry) -> None:
        sample_k = self.sample.m + 1 if self.sample is not None else 0
        self.store.vectors_written(shard.id)  # the worker reads the rows from the store, not from the pass
        res = self._submit(f"gnnd-{shard.id}", [], lambda _: (
            tasks.gnnd, self.spec, ShardRef(shard.id, shard.offset, None), seed_for(self.seed, 0, shard.id),
            self._sample_data(), sample_k))
        if self.sample is not None and res.truth is not None:
            self.sample.fold(shard.id, res.truth)
        self._made(res, "gnnd")
        self.writer.gnnd_done(shard.id)
        self.sched.shard_ready(shard.id)

    def _merge(self, pair: Pair) -> None:
        i, j = pair
        try:
            res = self._submit(f"merge-{i}-{j}", [i, j], lambda handed: (
                tasks.merge, self.spec, self._ref(i), self._ref(j),
                [ref for s in self.ledger.seed_shards(i, j, self.merged_with.get(j, []))
                 if (ref := self._durable_ref(s)).version is not None],
                seed_for(self.seed, 1, i, j), handed))
            self._made(res, "ggm")  # before the pair's shards are free: the next task reads the new versions
            with self.lock:
                self._record(i, j)
            self.writer.merged(pair, res.versions[i], res.versions[j])
        except _Redo:
            self.sched.requeue([pair])
            return
        finally:
            finished = self.sched.release(pair)
        for sid in finished:  # no merge left: final, written now
            self.writer.write_now(sid)

    def _ref(self, sid: int) -> ShardRef:
        """The shard's newest graph, pending on the worker the task goes to if it is pending."""
        h = self.holdings.get(sid)
        return ShardRef(sid, self.ledger.shards()[sid].offset, h.version, h.owner is not None)

    def _durable_ref(self, sid: int) -> ShardRef:
        """The shard's newest graph on disk (a seed of the merge: other tasks may be making newer ones)."""
        return ShardRef(sid, self.ledger.shards()[sid].offset, self.holdings.get(sid).durable)

    def _submit(self, name: str, shards: list[int], task: Callable[[dict], tuple]) -> TaskResult:
        """Run ``task(handed)`` (function and arguments, made anew for each attempt: a retry reads the
        shards' current versions; ``handed``: the graphs other workers hand over) where ``_place`` puts it;
        its result, or the last attempt's error. Pending versions found lost revert (``_lost``) and the task
        runs again, not counted as an attempt."""
        client = self.cluster.client
        attempt = 1
        while True:
            owners = {s: self.holdings.get(s).owner for s in shards}
            worker, handed = self._place(shards)
            fn, *args = task(handed)
            future = client.submit(fn, *args, key=f"{name}-{uuid.uuid4().hex[:8]}", pure=False,
                                   workers=[worker] if worker else None, allow_other_workers=False)
            try:
                return pinned_result(client, future, {w for w in (worker, *(owners[s] for s in handed)) if w})
            except PendingLost as e:  # from the task, or from a hand-over it waited for
                for sid in e.shards:
                    self._lost([sid], owners.get(sid))
            except WorkerGone as e:  # its graphs pending there are lost; the task runs again, on a worker here
                client.cancel([future, *handed.values()])
                for sid, owner in owners.items():
                    if owner in e.workers:
                        self._lost([sid], owner)
            except Exception as e:  # noqa: BLE001 - a worker's error, retried, then re-raised
                if attempt == ATTEMPTS or isinstance(e, BadInput):
                    raise
                log.warning("%s failed on attempt %d (%s); submitting it again", name, attempt, e)
                attempt += 1
            finally:
                for f in [future, *handed.values()]:
                    f.release()
                if worker is not None:
                    with self.lock:
                        self.inflight[worker] -= 1

    def _place(self, shards: list[int]) -> tuple[str | None, dict]:
        """The worker for a task on ``shards`` (``holdings.place``), counted in flight there, and the
        hand-overs (shard -> future of ``tasks.hand_over``) of those pending on other workers: their graphs
        go from worker to worker, not through the disk. ``_Redo`` if a shard has no graph any more."""
        held = [self.holdings.get(s) for s in shards]
        if any(h.version is None for h in held):
            raise _Redo(shards)
        threads = self.cluster.client.nthreads()  # the workers now: a restarted one has a new address
        with self.lock:
            self.threads = threads
            worker, moves = place(held, threads, self.inflight)
            if worker is not None:
                self.inflight[worker] += 1
        return worker, {shards[n]: self.cluster.client.submit(
            tasks.hand_over, self.spec, shards[n], held[n].version, key=f"hand-{shards[n]}-{uuid.uuid4().hex[:8]}",
            pure=False, workers=[held[n].owner], allow_other_workers=False) for n in moves}

    # ---- results -------------------------------------------------------------------------------
    def _made(self, res: TaskResult, phase: str) -> None:
        """Record a task's pending versions and account it; have its worker's excess written."""
        for sid, version in res.versions.items():
            self.holdings.made(sid, version, res.worker)
        self.sink.make_room(res.worker)
        end = time.perf_counter()
        self.acct.add_task(res.worker, phase, end - res.seconds, end, res.report, res.bytes_read)

    def _lost(self, sids: list[int], worker: str | None) -> None:
        """``worker`` no longer holds the pending versions of ``sids``: back to their written versions, and
        the uncommitted pairs that reached the lost ones (or shards with no graph left) to the scheduler."""
        for sid in sids:
            back_to: list[int | None] = []  # the version the shard went back to, if it did

            def revert(sid: int = sid) -> bool:
                reverted, version = self.holdings.lost(sid, worker)
                back_to.extend([version] if reverted else [])
                return reverted

            pairs = self.writer.forget(sid, revert)
            if not back_to:
                continue
            redo = [(self.ledger.shards()[sid], None)] if back_to[0] is None else []
            log.warning("worker %s lost the pending graph of shard %d: %d merge(s)%s to run again", worker, sid,
                        len(pairs), " and its GNND" if redo else "")
            self.sched.requeue(pairs, redo)

    def _record(self, i: int, j: int) -> None:
        self.merged_with.setdefault(i, []).append(j)
        self.merged_with.setdefault(j, []).append(i)
