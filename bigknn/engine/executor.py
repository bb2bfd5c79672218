"""Where a write path's tasks run: the ``Executor`` a build, ingest or merge is handed, in this process
(``InProcess``: the backends' worker threads) or on a Dask cluster (bigknn/engine/dask/executor.py
``DaskExecutor``). The caller picks one and passes it down, so the engine never asks where it runs."""

from __future__ import annotations

from itertools import chain
from typing import Callable, Iterable, Protocol

from bigknn.backends import Backend, CallShape
from bigknn.core.metric import metric as metric_of
from bigknn.core.human import human_duration
from bigknn.engine.accounting import Accounting
from bigknn.engine.shard_cache import ShardCache
from bigknn.engine.recall_sample import SampleTruth
from bigknn.engine.scheduler import Scheduler
from bigknn.engine.pending import Ledger, cache_shards, must_write
from bigknn.engine.workers import run_tasks, shards_from_store
from bigknn.engine.writer import CacheSink, Writer, checkpoint_allowance
from bigknn.core.progress import Reporter
from bigknn.shards import Store

Incoming = tuple[Iterable, list[int]]  # (stream of (shard, vectors), their sizes) from a sharding pass


class Executor(Protocol):
    """Runs a store's pending work (GNND for every shard without a graph, GGM for every pending pair) and
    says over how many workers it spreads it (what an automatic shard size is divided by)."""

    def workers(self) -> int: ...

    def run_pending(self, store: Store, ledger: Ledger, reporter: Reporter, acct: Accounting,
                    host_mem: int | None = None, incoming: Incoming | None = None,
                    sample: SampleTruth | None = None, plan: Callable[[], None] | None = None) -> None:
        """GNND for every shard without a graph and GGM for every pending pair, as one set of tasks: a pair is
        merged as soon as both its shards have a graph; progress committed in ``ledger`` as it goes.

        ``incoming``: shards from a sharding pass still running, taken as they arrive; shards already in the
        store without a graph are read from it. ``sample``: the build's recall sample, whose exact neighbours
        GNND's workers gather from each shard they see. ``plan``: a partitioned build's plan step (it commits
        the pairs to merge), called once every shard has a graph; the pairs it chose are merged in the same
        run."""
        ...


class InProcess:
    """The tasks on this process's backends, one worker thread each, through a host cache of shards."""

    def __init__(self, backends: list[Backend]):
        self.backends = backends

    def workers(self) -> int:
        return len(self.backends)

    def run_pending(self, store: Store, ledger: Ledger, reporter: Reporter, acct: Accounting,
                    host_mem: int | None = None, incoming: Incoming | None = None,
                    sample: SampleTruth | None = None, plan: Callable[[], None] | None = None) -> None:
        """``Executor.run_pending``. A partitioned build's chosen pairs are merged from the same cache as its
        GNND: the shards' graphs are neither written nor read back in between."""
        backends = self.backends
        m = store.manifest
        warm_up(backends, reporter, CallShape(m.dim, m.dtype, metric_of(m.metric), m.params))
        shards = ledger.shards()
        new_sizes = incoming[1] if incoming else []
        todo = [s for s in shards if ledger.version(s.id) is None]
        if len(shards) + len(new_sizes) == 1 and len(todo) + len(new_sizes) == 1 and plan is None:
            backends = across(backends)
        source = shards_from_store(store, todo, acct) if todo else None
        if incoming:
            source = chain(source or (), incoming[0])
        biggest = max([s.rows for s in shards] + new_sizes)
        cache = ShardCache(store, ledger, cache_shards(store.manifest, store.path, biggest, len(backends), host_mem),
                           acct, len(shards) + len(new_sizes))
        writer = Writer(store, ledger, acct, CacheSink(store, ledger, cache, sample.keep_final if sample else None),
                        checkpoint_allowance(must_write(store.manifest, sum(s.rows for s in shards) + sum(new_sizes),
                                                        sum(s.rows for s in shards if s.source is None)
                                                        + sum(new_sizes))))
        # pairs of cached shards first only where the cache cannot hold them all: elsewhere the schedule's own
        # order, so that a build resumed before its first merge redoes the uninterrupted one bit for bit
        held = cache.holds if cache.tight else None
        sched = Scheduler(ledger.todo_pairs(len(shards) + len(new_sizes)),
                          ready=[s.id for s in shards if ledger.version(s.id) is not None],
                          feeding=source is not None, queue_limit=len(backends) + 1, held=held,
                          planning=plan is not None)
        if cache.tight:
            cache.eviction_order = sched.eviction_order
        completed = False
        try:
            run_tasks(store, ledger, backends, reporter, acct, cache, writer, sched, source,
                      len(todo) + len(new_sizes), sample)
            if plan is not None:
                plan()
                have = [s.id for s in ledger.shards()
                        if ledger.version(s.id) is not None or cache.peek(s.id) is not None]
                sched = Scheduler(ledger.todo_pairs(len(ledger.shards())), ready=have, queue_limit=len(backends) + 1,
                                  held=held)
                if cache.tight:
                    cache.eviction_order = sched.eviction_order
                run_tasks(store, ledger, backends, reporter, acct, cache, writer, sched, None, 0)
            completed = True
        finally:
            writer.close(final=completed)  # what finished is written and committed, also when a worker failed
            cache.close()


def across(backends: list[Backend]) -> list[Backend]:
    """The workers of a plan with one GNND and nothing else: the first backend spanning all of them where it can
    (Backend.spanning), since the others would sit idle; else the workers as they are."""
    wide = backends[0].spanning(backends[1:]) if len(backends) > 1 else None
    return [wide] if wide is not None else backends


def warm_up(backends: list[Backend], reporter: Reporter, like: CallShape) -> None:
    """Compile the backends' kernels for calls ``like`` before the first task (a first CPU run: minutes; a GPU
    compiles in the background while the input is read), saying so, so that the compile is in no task's time:
    not in the progress rates and ETAs, nor in the timings `bigknn plan --store` reads."""
    seconds = sum(b.warm_up(reporter.note, like) for b in backends)
    if seconds > 0:
        reporter.info(f"kernels ready in {human_duration(seconds)}")
