"""The client's side of a run on a Dask cluster: ``steps.run_pending``'s work as Dask tasks.

The same ``Scheduler`` as in-process decides what may run (GNND of each shard as it arrives; the merge of a
pending pair once both shards have a graph and no running merge touches either), with one client thread per
worker thread of the cluster: each takes a task, submits it (``tasks.gnnd`` / ``tasks.merge``) with the
graph versions it must read, waits for its result and commits it. The client is the only committer, and a
pair is committed once: the scheduler hands each pending pair out once, and a task's retries and Dask's
reruns all end in that one future's single result.

A task whose worker dies is rerun by Dask on another worker; a task that fails is submitted again with the
shards' current versions (``ATTEMPTS`` in all). Each submission carries a ``workers=`` hint (``pick_worker``):
the worker that last held one of its shards (it keeps them in memory) if it has a thread free, else the
worker with the fewest of the run's tasks, so every worker has two tasks (one computing, one reading or
writing: connect.TASK_THREADS); Dask overrules a hint naming a worker that is gone (``allow_other_workers``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from itertools import chain
from typing import Callable, Iterable

from bigknn.errors import BadInput
from bigknn.cluster import tasks
from bigknn.cluster.connect import Cluster
from bigknn.cluster.tasks import ShardRef, StoreSpec, TaskResult
from bigknn.pipeline.estimate import SampleTruth
from bigknn.pipeline.accounting import Accounting
from bigknn.pipeline.scheduler import Scheduler
from bigknn.pipeline.workers import seed_for
from bigknn.progress import Reporter
from bigknn.shards import ShardEntry, Store

log = logging.getLogger("bigknn")
ATTEMPTS = 3  # submissions of one task before its error ends the run


def run_on_cluster(cluster: Cluster, store: Store, ledger, reporter: Reporter, acct: Accounting,
                   incoming: tuple[Iterable, list[int]] | None = None, sample: SampleTruth | None = None) -> None:
    """GNND for every shard without a graph and GGM for every pending pair, on the cluster's workers
    (``steps.run_pending``'s contract: progress committed as it goes, ``incoming`` taken as it is sharded)."""
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
    with reporter.phase("build", tasks_total, "tasks") as advance:
        run.go(slots, source, advance)


def check_visible(cluster: Cluster, store: Store) -> None:
    """Refuse (exit 2) a store that a worker cannot see, before any task is submitted."""
    path = str(store.path.resolve())
    seen = cluster.client.run(tasks.sees_store, path)
    blind = sorted(addr for addr, ok in seen.items() if not ok)
    if blind:
        raise BadInput(store.path, f"Dask worker {blind[0]} cannot see this store ({len(blind)} of {len(seen)} "
                                   "workers); put it on a path every worker sees (a shared file system)")


def pick_worker(holders: list[str | None], threads: dict[str, int], inflight: Counter[str]) -> str | None:
    """The worker with the fewest tasks in flight, the first of ``holders`` (workers holding the task's shards
    in memory) among equals (None: no worker). A worker computes one task at a time (tasks.COMPUTE_LOCK):
    sending a second task to a holder while another worker idles made one GPU of two 14 % busy (50M x 96)."""
    rank = {w: i for i, w in enumerate(holders) if w is not None}
    ranked = sorted(threads, key=lambda w: (inflight[w], rank.get(w, len(rank))))
    return ranked[0] if ranked else None


class _Run:
    """One run's client threads, the commits of their results, and where each shard was last held."""

    def __init__(self, cluster: Cluster, store: Store, ledger, acct: Accounting, sched: Scheduler,
                 sample: SampleTruth | None):
        self.cluster, self.store, self.ledger, self.acct, self.sched = cluster, store, ledger, acct, sched
        self.spec = StoreSpec.of(store, cluster.backend, cluster.gpu_mem)
        self.seed = store.manifest.seed
        self.sample = sample
        # the sample's vectors go to every worker once, not with each GNND task
        self.sample_data = (cluster.client.scatter(sample.vectors, broadcast=True) if sample is not None
                            else None)
        self.holder: dict[int, str] = {}  # shard -> the worker that wrote its latest graph
        self.inflight: Counter[str] = Counter()  # worker -> this run's tasks submitted to it and not done
        self.merged_with: dict[int, list[int]] = {}  # the shards each shard was merged with, in order
        for i, j in ledger.history():
            self._record(i, j)
        self.lock = threading.Lock()

    def go(self, slots: int, source: Iterable | None, advance: Callable[[int], None]) -> None:
        """Feed ``source`` to the scheduler and run ``slots`` client threads until every task is done."""
        errors: list[BaseException] = []
        feeder = threading.Thread(target=self._feed, args=(source, errors), daemon=True, name="gnnd-feed")
        threads = [threading.Thread(target=self._slot, args=(advance, errors), daemon=True, name=f"dask-{n}")
                   for n in range(slots)]
        if source is not None:
            feeder.start()
        for th in threads:
            th.start()
        try:
            for th in threads:
                th.join()
        finally:
            self.sched.stop()  # wakes a feeder still waiting to queue a shard
            if source is not None:
                feeder.join()
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

    def _slot(self, advance: Callable[[int], None], errors: list[BaseException]) -> None:
        last: set[int] = set(self.ledger.last_pair() or ())
        try:
            while (task := self.sched.next_task(last)) is not None:
                kind, what = task
                if kind == "gnnd":
                    self._gnnd(what[0])
                else:
                    self._merge(what)
                    last = set(what)
                advance(1)
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread by go()
            errors.append(e)
            self.sched.stop()

    # ---- tasks ---------------------------------------------------------------------------------
    def _gnnd(self, shard: ShardEntry) -> None:
        sample_k = self.sample.m + 1 if self.sample is not None else 0
        res = self._call(f"gnnd-{shard.id}", [], lambda: (
            tasks.gnnd, self.spec, ShardRef(shard.id, shard.offset, None), seed_for(self.seed, 0, shard.id),
            self.sample_data, sample_k))
        if self.sample is not None and res.truth is not None:
            self.sample.fold(shard.id, res.truth)
        self._commit(res, None, "gnnd")
        self.sched.shard_ready(shard.id)

    def _merge(self, pair: tuple[int, int]) -> None:
        i, j = pair
        try:
            res = self._call(f"merge-{i}-{j}", [i, j], lambda: (
                tasks.merge, self.spec, self._ref(i), self._ref(j),
                [self._ref(s) for s in self.ledger.seed_shards(i, j, self.merged_with.get(j, []))],
                seed_for(self.seed, 1, i, j)))
            self._commit(res, pair, "ggm")
        finally:
            self.sched.release(pair)

    def _ref(self, sid: int) -> ShardRef:
        with self.store.lock:
            return ShardRef(sid, self.ledger.shards()[sid].offset, self.ledger.version(sid))

    def _call(self, name: str, shards: list[int], task: Callable[[], tuple]) -> TaskResult:
        """Submit ``task()`` (function and arguments, made anew for each attempt: a retry reads the shards'
        current versions) near the worker holding ``shards``; its result, or the last attempt's error."""
        client = self.cluster.client
        attempt = 1
        while True:
            fn, *args = task()
            worker = self._place(shards)
            future = client.submit(fn, *args, key=f"{name}-{uuid.uuid4().hex[:8]}", pure=False,
                                   workers=[worker] if worker else None, allow_other_workers=worker is not None)
            try:
                return future.result()
            except Exception as e:  # noqa: BLE001 - a worker's error, retried, then re-raised
                if attempt == ATTEMPTS or isinstance(e, BadInput):
                    raise
                log.warning("%s failed on attempt %d (%s); submitting it again", name, attempt, e)
            finally:
                future.release()
                if worker is not None:
                    with self.lock:
                        self.inflight[worker] -= 1
            attempt += 1

    def _place(self, shards: list[int]) -> str | None:
        """The worker to hint for a task on ``shards`` (``pick_worker``), counted in flight there."""
        threads = self.cluster.client.nthreads()  # the workers now: a restarted one has a new address
        with self.lock:
            worker = pick_worker([self.holder.get(s) for s in shards], threads, self.inflight)
            if worker is not None:
                self.inflight[worker] += 1
            return worker

    # ---- commits -------------------------------------------------------------------------------
    def _commit(self, res: TaskResult, pair: tuple[int, int] | None, phase: str) -> None:
        """Record a task's graph versions (and its pair) in the manifest and commit: the one committer."""
        with self.store.lock:
            for sid, version in res.versions.items():
                self.ledger.set_version(sid, version)
            if pair is not None:
                self.ledger.add_pair(*pair)
            self.store.commit()
        with self.lock:
            for sid in res.versions:
                self.holder[sid] = res.worker
            if pair is not None:
                self._record(*pair)
        end = time.perf_counter()
        self.acct.add(phase, res.seconds, res.bytes_read, res.bytes_written)
        self.acct.add_busy(res.worker, res.seconds)
        self.acct.extend_span(phase, end - res.seconds, end)
        self.acct.add_descent(phase, res.report)

    def _record(self, i: int, j: int) -> None:
        self.merged_with.setdefault(i, []).append(j)
        self.merged_with.setdefault(j, []).append(i)
