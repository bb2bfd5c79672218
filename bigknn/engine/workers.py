"""GNND and pairwise merges on one or more workers (one per GPU), with disk I/O overlapped with compute. The
parts live beside it: the shard cache (cache.py), the scheduler (scheduler.py), write-back and commits
(writer.py), the run's accounting (accounting.py).

* Shards live in a bounded host cache (vectors + latest graph). Shards arrive there from the sharding pass
  or GNND without a disk read; others are read (prefetched) from the store when a pair needs them. While a
  GPU merges a pair, the shards of the pairs likely next are copied to it (``CudaBackend.stage``), and a
  merge's results stay on the GPU for the next pair that reuses the shard.
* A scheduler hands out tasks: GNND of each shard as it arrives (first), and the merge of any pending pair
  whose shards both have a graph and are touched by no running merge (any order of the pairs gives the
  same all-pairs result), preferring a pair whose shards are cached, then one that shares a shard with the
  worker's last one. So merges start while the input is still being sharded, and a cache smaller than the
  store reads each shard a few times, not once per merge.
* Write-back: a GNND or merge result stays in the cache, newer than the disk ("dirty"), and is written at
  the next checkpoint (every ``checkpoint_s()`` seconds), when the cache must make room, when the shard has
  no merge left, or at the end. A shard merged several times between checkpoints is written once. A pair is
  committed when the written graphs of both its shards include it; a crash redoes only uncommitted pairs
  (re-merging a pair whose result one shard already holds is harmless). A commit (an fsync) never holds up
  a worker.
"""

from __future__ import annotations

import threading
import time
from typing import Iterable, Iterator

import numpy as np

from bigknn.backends import Backend
from bigknn.core.knn_graph import ShardPart, shard_graph_to_global
from bigknn.core.metric import metric as metric_of
from bigknn.engine.accounting import Accounting
from bigknn.engine.shard_cache import ShardCache
from bigknn.engine.scheduler import TASK_NAMES, Scheduler, task_parts
from bigknn.engine.writer import Writer
from bigknn.core.progress import Reporter
from bigknn.shards import ShardEntry, Store


def seed_for(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


def shards_from_store(store: Store, shards: list[ShardEntry],
                      acct: Accounting) -> Iterator[tuple[ShardEntry, np.ndarray]]:
    """(shard, vectors) of shards already in the store, read one after the other."""
    for shard in shards:
        t = time.perf_counter()
        x = store.read_vectors(shard.id)
        acct.add("read", time.perf_counter() - t, x.nbytes)
        yield shard, x


def run_tasks(store: Store, ledger, backends: list[Backend], reporter: Reporter, acct: Accounting,
              cache: ShardCache, writer: Writer, sched: Scheduler,
              source: Iterable[tuple[ShardEntry, np.ndarray]] | None = None, gnnd_count: int = 0,
              sample=None) -> None:
    """Run every task of ``sched`` on the workers: GNND of each (shard, vectors) from ``source`` as it
    arrives, and the merges. A GNND result goes into the cache with its vectors (its merges need no disk
    read) and is written at once; a shard whose last pair is merged is written at once too (it is final)."""
    m = store.manifest
    params, metric = m.params, metric_of(m.metric)
    feed_error: list[BaseException] = []
    merged_with: dict[int, list[int]] = {}  # the shards each shard was merged with, in order (seeded merges)

    def record(i: int, j: int) -> None:
        merged_with.setdefault(i, []).append(j)
        merged_with.setdefault(j, []).append(i)

    for i, j in ledger.history():
        record(i, j)

    def feeder() -> None:
        items = iter(source)
        try:
            for item in items:
                if not sched.add_shard(item):  # the workers failed: end the source (a sharding pass) too
                    getattr(items, "close", lambda: None)()
                    return
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread below
            feed_error.append(e)
            sched.stop()
        finally:
            sched.feed_done()

    def gnnd(backend: Backend, name: str, shard: ShardEntry, x: np.ndarray) -> None:
        t = time.perf_counter()
        probe, sample_s = None, 0.0
        if sample is not None:  # the recall sample's exact neighbours among this shard's rows, while in memory
            backend.stage([x])  # one upload of the rows on a GPU: the sample's search and the GNND both read it
            truth = sample.add(backend, shard.id, shard.offset, x)
            sample_s = time.perf_counter() - t
            probe = sample.probe(shard.offset, len(x), truth, params.width(), sample_s)
        g = backend.gnnd(x, metric, params, seed=seed_for(m.seed, 0, shard.id), probe=probe)
        acct.add_task(name, "gnnd", t, time.perf_counter(), g.report,
                      stages=dict(backend.last_stats, sample_s=sample_s))
        cache.put(shard.id, ShardPart(shard.offset, x, shard_graph_to_global(g, shard.offset)), dirty=True)
        writer.gnnd_done(shard.id, final=not sched.needs(shard.id))
        sched.shard_ready(shard.id)

    def merge(backend: Backend, name: str, pair: tuple[int, int]) -> None:
        i, j = pair
        cache.touch(pair)  # first: what is read ahead must not evict this pair's shards
        ahead = sched.upcoming(set(pair), cache.read_ahead())
        cache.prefetch(s for p in ahead for s in p if s not in pair)
        a, b = cache.get(i), cache.get(j)
        # a GPU backend copies the next pair's shards during this merge
        upcoming = [cache.peek(s) for p in sched.upcoming(set(pair), 2) for s in p if s not in pair]
        backend.stage([arr for part in upcoming if part is not None
                       for arr in (part.vectors, part.graph.ids, part.graph.dists)])
        vias = [cache.get(s) for s in ledger.seed_shards(i, j, merged_with.get(j, []))]
        t = time.perf_counter()
        ga, gb = backend.ggm(a, b, metric, params, seed=seed_for(m.seed, 1, i, j), vias=vias)
        acct.add_task(name, "ggm", t, time.perf_counter(), ga.report, stages=backend.last_stats)
        record(i, j)
        gen_i = cache.put(i, ShardPart(a.offset, a.vectors, ga), dirty=True)
        gen_j = cache.put(j, ShardPart(b.offset, b.vectors, gb), dirty=True)
        writer.merged(pair, gen_i, gen_j, final=sched.release(pair))

    def work(backend: Backend, name: str, advance) -> None:
        last: set[int] = set(ledger.last_pair() or ())
        try:
            while (task := sched.next_task(last)) is not None:
                kind, what = task
                if kind == "gnnd":
                    gnnd(backend, name, *what)
                    advance(1, TASK_NAMES[kind])
                else:
                    merge(backend, name, what)
                    advance(1, TASK_NAMES[kind])
                    last = set(what)
                    cache.wait_for_room(2 * len(backends))
        except BaseException:
            sched.stop()
            raise

    tasks = len(sched.pending) + gnnd_count
    if not tasks:
        return
    feeding = threading.Thread(target=feeder, daemon=True, name="gnnd-feed") if source is not None else None
    # shards that already have a graph (an ingest's old shards) are read while the first GNND runs
    cache.prefetch(s for p in sched.upcoming(set(), cache.read_ahead()) for s in p if s in sched.ready)
    with reporter.phase("build", tasks, "tasks", task_parts(gnnd_count, len(sched.pending))) as advance:
        if feeding is not None:
            feeding.start()
        try:
            _run_workers(backends, lambda b, name: work(b, name, advance))
        finally:
            sched.stop()  # wakes a feeder still waiting to queue a shard
            if feeding is not None:
                feeding.join()
    if feed_error:
        raise feed_error[0]


def _run_workers(backends: list[Backend], work) -> None:
    """``work(backend, name)`` on one thread per backend; re-raises the first error here."""
    errors: list[BaseException] = []

    def guarded(backend, name):
        try:
            work(backend, name)
        except BaseException as e:  # noqa: BLE001 - re-raised below in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(b, f"{b.name}:{n}"), daemon=True)
               for n, b in enumerate(backends)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
