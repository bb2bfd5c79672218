"""GNND and pairwise merges on one or more workers (one per GPU), with disk I/O overlapped with compute.

* Shards live in a bounded host cache (vectors + latest graph). Shards arrive there from the sharding pass
  or GNND without a disk read; others are read (prefetched) from the store when a pair needs them. While a
  GPU merges a pair, the shards of the pairs likely next are copied to it (``CudaBackend.stage``), and a
  merge's results stay on the GPU for the next pair that reuses the shard.
* A scheduler hands out tasks: GNND of each shard as it arrives (first), and the merge of any pending pair
  whose shards both have a graph and are touched by no running merge (any order of the pairs gives the
  same all-pairs result), preferring a pair that shares a shard with the worker's last one. So merges
  start while the input is still being sharded.
* Write-back: a GNND graph is written at once. A merge result stays in the cache, newer than the disk
  ("dirty"), and is written at the next checkpoint (every ``checkpoint_s()`` seconds), when the cache must
  make room, or at the end. A shard merged several times between checkpoints is written once. A pair is
  committed when the written graphs of both its shards include it; a crash redoes only uncommitted pairs
  (re-merging a pair whose result one shard already holds is harmless). A commit (an fsync) never holds up
  a worker.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np

from bigknn.backends import Backend
from bigknn.graph import ID_DTYPE, KnnGraph, ShardPart
from bigknn.metrics import kernel_metric
from bigknn.params import GnndParams
from bigknn.pipeline import schedule
from bigknn.progress import Reporter
from bigknn.shards import ShardEntry, Store

IO_THREADS = 4  # concurrent shard reads (prefetch) and array writes: one zarr stream moves ~1-1.6 GB/s
CHECKPOINT_S = 10.0  # merge results reach the disk (and the manifest) at least this often


def checkpoint_s() -> float:
    """Seconds between write-back checkpoints (env BIGKNN_CHECKPOINT_S overrides; 0 commits every merge)."""
    return float(os.environ.get("BIGKNN_CHECKPOINT_S", CHECKPOINT_S))


@dataclass
class Accounting:
    """What a run did: seconds per phase (summed over workers), bytes moved, each worker's busy time, and
    the wall-clock span of each phase."""

    seconds: dict = field(default_factory=dict)
    bytes_read: int = 0
    bytes_written: int = 0
    busy: dict = field(default_factory=dict)  # worker name -> seconds inside backend calls
    spans: dict = field(default_factory=dict)  # phase -> [start, end] seconds since t0
    descents: dict = field(default_factory=dict)  # "gnnd" / "ggm" -> how recall-targeted descents ended
    t0: float = field(default_factory=time.perf_counter)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, phase: str, seconds: float, nbytes_read: int = 0, nbytes_written: int = 0) -> None:
        with self.lock:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds
            self.bytes_read += nbytes_read
            self.bytes_written += nbytes_written

    def add_descent(self, phase: str, report: dict | None) -> None:
        """Count a descent's iterations, widenings and how it ended (bigknn/recall.py Stopper.report)."""
        if report is None:
            return
        with self.lock:
            d = self.descents.setdefault(phase, {"count": 0, "iterations": 0, "widened": 0, "stops": {}})
            d["count"] += 1
            d["iterations"] += len(report["trace"])
            d["widened"] += report["widened"]
            reason = report["stop"].split(":")[0]
            d["stops"][reason] = d["stops"].get(reason, 0) + 1

    def add_busy(self, worker: str, seconds: float) -> None:
        with self.lock:
            self.busy[worker] = self.busy.get(worker, 0.0) + seconds

    def extend_span(self, phase: str, start: float, end: float) -> None:
        """Widen ``phase``'s span to cover [start, end] (perf_counter times; phases of tasks interleave)."""
        with self.lock:
            lo, hi = self.spans.get(phase, [math.inf, -math.inf])
            self.spans[phase] = [round(min(lo, start - self.t0), 3), round(max(hi, end - self.t0), 3)]

    @contextmanager
    def span(self, phase: str) -> Iterator[None]:
        start = time.perf_counter() - self.t0
        try:
            yield
        finally:
            self.spans[phase] = [round(start, 3), round(time.perf_counter() - self.t0, 3)]


def seed_for(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


class ShardCache:
    """Latest vectors and graph of recently used shards, least recently used evicted first.

    Each shard's graph has a generation, raised by every ``put(..., dirty=True)``. A dirty shard (cached
    graph newer than the disk's) is never evicted: when only dirty shards could make room, the cache asks
    ``on_pressure`` (the writer) to write them, and evicts them once ``written``.
    """

    def __init__(self, store: Store, ledger, capacity: int, acct: Accounting):
        self.store, self.ledger, self.capacity, self.acct = store, ledger, max(2, capacity), acct
        self.on_pressure = lambda sids: None
        self._parts: OrderedDict[int, ShardPart] = OrderedDict()
        self._gen: dict[int, int] = {}  # kept across evictions: generations only grow
        self._dirty: set[int] = set()
        self._asked: set[int] = set()  # dirty shards the writer was asked to write
        self._loading: dict[int, threading.Event] = {}
        self._lock = threading.Condition()
        self._pool = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="prefetch")

    def get(self, sid: int) -> ShardPart:
        with self._lock:
            if sid in self._parts:
                self._parts.move_to_end(sid)
                return self._parts[sid]
            event = self._loading.get(sid)
            mine = event is None
            if mine:
                event = self._loading[sid] = threading.Event()
        if not mine:  # someone (the prefetcher) is reading it: wait for that read
            event.wait()
            return self.get(sid)
        try:
            t = time.perf_counter()
            shard = self.ledger.shards()[sid]
            part = ShardPart(shard.offset, self.store.read_vectors(sid),
                             self.store.read_graph(sid, self.ledger.version(sid)))
            self.acct.add("read", time.perf_counter() - t,
                          part.vectors.nbytes + part.graph.ids.nbytes + part.graph.dists.nbytes)
            self.acct.extend_span("read", t, time.perf_counter())
            self.put(sid, part)
            return part
        finally:
            with self._lock:
                self._loading.pop(sid).set()

    def peek(self, sid: int) -> ShardPart | None:
        """The cached part of ``sid`` if it is here; never reads."""
        with self._lock:
            return self._parts.get(sid)

    def put(self, sid: int, part: ShardPart, dirty: bool = False) -> int:
        """Cache ``part``; a dirty put is a new graph not yet on disk. Returns the graph's generation."""
        with self._lock:
            self._parts[sid] = part
            self._parts.move_to_end(sid)
            if dirty:
                self._gen[sid] = self._gen.get(sid, 0) + 1
                self._dirty.add(sid)
                self._asked.discard(sid)
            self._evict()
            return self._gen.get(sid, 0)

    def snapshot(self, sid: int) -> tuple[KnnGraph, int] | None:
        """The cached graph of a dirty shard and its generation (None if the disk already has it)."""
        with self._lock:
            if sid not in self._dirty:
                return None
            return self._parts[sid].graph, self._gen[sid]

    def dirty(self) -> list[int]:
        with self._lock:
            return sorted(self._dirty)

    def written(self, sid: int, gen: int) -> None:
        """The writer stored generation ``gen``: the shard is clean unless a newer result arrived since."""
        with self._lock:
            if self._gen.get(sid) == gen:
                self._dirty.discard(sid)
            self._asked.discard(sid)
            self._evict()
            self._lock.notify_all()

    def wait_for_room(self, slack: int) -> None:
        """Block while the cache holds more than ``capacity + slack`` shards (the writer is behind)."""
        with self._lock:
            while len(self._parts) > self.capacity + slack and self._dirty:
                self._lock.wait(1.0)

    def _evict(self) -> None:
        for sid in list(self._parts):
            if len(self._parts) <= self.capacity:
                return
            if sid not in self._dirty:
                del self._parts[sid]
        over = len(self._parts) - self.capacity
        if over > 0:  # only dirty shards left to drop: have the oldest written
            ask = [s for s in self._parts if s not in self._asked][:over]
            self._asked.update(ask)
            if ask:
                self.on_pressure(ask)

    def prefetch(self, sids) -> None:
        """Start reading the first shards of ``sids`` in the background: as many as the cache holds beside
        the two of the running pair (older entries make room, least recently used first)."""
        wanted = list(dict.fromkeys(sids))[:max(0, self.capacity - 2)]
        with self._lock:
            todo = [s for s in wanted if s not in self._parts and s not in self._loading]
        for sid in todo:
            self._pool.submit(self.get, sid)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class Scheduler:
    """The work of a run as tasks for the workers: GNND of each shard that arrives, and the merge of each
    pending pair once both its shards have a graph ("ready") and no running merge touches either.

    GNND comes first (it unblocks pairs and frees the memory of queued shards). Among the pairs, one that
    shares a shard with the worker's previous pair is preferred (that shard is at hand).
    """

    def __init__(self, pairs: list[tuple[int, int]], ready: Iterable[int], feeding: bool = False,
                 queue_limit: int = 2):
        self.pending = list(pairs)
        self.ready = set(ready)
        self.busy: set[int] = set()
        self.shards: deque = deque()  # (shard, vectors) waiting for GNND
        self.feeding = feeding  # more shards will arrive
        self.queue_limit = queue_limit
        self.cond = threading.Condition()
        self.stopped = False

    # -- the feeder's side
    def add_shard(self, item) -> bool:
        """Queue a shard for GNND, waiting while ``queue_limit`` wait already; False once the run stopped."""
        with self.cond:
            while len(self.shards) >= self.queue_limit and not self.stopped:
                self.cond.wait()
            if self.stopped:
                return False
            self.shards.append(item)
            self.cond.notify_all()
            return True

    def feed_done(self) -> None:
        with self.cond:
            self.feeding = False
            self.cond.notify_all()

    # -- the workers' side
    def next_task(self, prefer: set[int]) -> tuple[str, object] | None:
        """("gnnd", (shard, vectors)) or ("merge", (i, j)); None when all is done or the run stopped."""
        with self.cond:
            while True:
                if self.stopped:
                    return None
                if self.shards:
                    item = self.shards.popleft()
                    self.cond.notify_all()
                    return "gnnd", item
                free = [p for p in self.pending if p[0] in self.ready and p[1] in self.ready
                        and p[0] not in self.busy and p[1] not in self.busy]
                if free:
                    pair = max(free, key=lambda p: (p[0] in prefer) + (p[1] in prefer))
                    self.pending.remove(pair)
                    self.busy.update(pair)
                    return "merge", pair
                if not self.pending and not self.feeding:
                    return None
                self.cond.wait()

    def shard_ready(self, sid: int) -> None:
        with self.cond:
            self.ready.add(sid)
            self.cond.notify_all()

    def release(self, pair: tuple[int, int]) -> list[int]:
        """Free the shards of a finished merge; returns those of them that no pending pair needs any more."""
        with self.cond:
            self.busy.difference_update(pair)
            self.cond.notify_all()
            return [s for s in pair if not any(s in p for p in self.pending)]

    def upcoming(self, prefer: set[int], count: int) -> list[tuple[int, int]]:
        """The pairs likely to be taken next, those reusing ``prefer`` first (for prefetching)."""
        with self.cond:
            ranked = sorted(self.pending, key=lambda p: -((p[0] in prefer) + (p[1] in prefer)))
            return ranked[:count]

    def stop(self) -> None:
        """End the run (done, or a worker failed): every waiting feeder and worker returns."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()


class Writer:
    """One thread that writes graphs and commits the manifest.

    ``write_now(sid)`` writes a shard's cached graph at once (GNND results). ``merged(pair, gi, gj)`` records
    a finished merge whose results are in the cache at generations gi, gj; it is committed once both are
    written, at a checkpoint, under cache pressure, or at ``close()``, which writes everything still dirty.
    """

    def __init__(self, store: Store, ledger, acct: Accounting, cache: ShardCache):
        self.store, self.ledger, self.acct, self.cache = store, ledger, acct, cache
        self.jobs: queue.Queue = queue.Queue()
        self.pool = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="write")
        self.error: BaseException | None = None
        self.finished: list[tuple[int, int, int, int]] = []  # merged pairs not yet committed, with gens
        self.written_gen: dict[int, int] = {}
        self.oldest = 0.0  # when the oldest uncommitted merge finished
        self._lock = threading.Lock()
        self.interval = checkpoint_s()
        cache.on_pressure = lambda sids: self.jobs.put(list(sids))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def write_now(self, sid: int) -> None:
        self._raise()
        self.jobs.put([sid])

    def merged(self, pair: tuple[int, int], gen_i: int, gen_j: int) -> None:
        self._raise()
        with self._lock:
            first = not self.finished
            if first:  # the checkpoint clock runs from the oldest merge not yet on disk
                self.oldest = time.monotonic()
            self.finished.append((*pair, gen_i, gen_j))
        if self.interval <= 0:
            self.jobs.put(list(pair))
        elif first:
            self.jobs.put("tick")  # wake the writer to start the clock

    def close(self) -> None:
        """Write every dirty shard, commit, stop the thread; raise the first write error."""
        self.jobs.put(None)
        self.thread.join()
        self.pool.shutdown(wait=True)
        self._raise()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        while True:
            with self._lock:
                due = self.oldest + self.interval if self.finished else None
            try:
                job = self.jobs.get(timeout=None if due is None else max(0.0, due - time.monotonic()))
            except queue.Empty:
                job = "checkpoint"
            if job == "tick":
                continue
            if job is None or job == "checkpoint":
                sids = self.cache.dirty()
                with self._lock:  # merges finishing while this checkpoint writes wait for the next one
                    self.oldest = time.monotonic()
            else:
                sids = job
            if self.error is None:
                try:
                    self._write(sids)
                except BaseException as e:  # noqa: BLE001 - handed to the workers by _raise
                    self.error = e
            if job is None:
                return

    def _write(self, sids: Iterable[int]) -> None:
        """Write the cached graphs of ``sids``, record them and the pairs they complete, and commit."""
        snaps = {sid: snap for sid in dict.fromkeys(sids) if (snap := self.cache.snapshot(sid)) is not None}
        t = time.perf_counter()
        versions = {sid: self.store.next_version(sid, self.ledger.version(sid)) for sid in snaps}
        list(self.pool.map(lambda sid: self.store.write_graph(sid, versions[sid], snaps[sid][0]), snaps))
        with self.store.lock:
            with self._lock:  # not held during the commit: a worker reporting a merge never waits for an fsync
                for sid, version in versions.items():
                    self.ledger.set_version(sid, version)
                    self.written_gen[sid] = snaps[sid][1]
                done = [f for f in self.finished
                        if self.written_gen.get(f[0], 0) >= f[2] and self.written_gen.get(f[1], 0) >= f[3]]
                for f in done:
                    self.ledger.add_pair(f[0], f[1])
                    self.finished.remove(f)
            if snaps or done:
                self.store.commit()
        for sid, (graph, gen) in snaps.items():
            self.cache.written(sid, gen)
        nbytes = sum(g.ids.nbytes + g.dists.nbytes for g, _ in snaps.values())
        self.acct.add("write", time.perf_counter() - t, nbytes_written=nbytes)
        if snaps:
            self.acct.extend_span("write", t, time.perf_counter())


def shards_from_store(store: Store, shards: list[ShardEntry], acct: Accounting) -> Iterator[tuple[ShardEntry, np.ndarray]]:
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
    params, metric = GnndParams(**m.params), kernel_metric(m.metric)
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
        g = backend.gnnd(x, metric, params, seed=seed_for(m.seed, 0, shard.id))
        if sample is not None:  # the recall sample's exact neighbours among this shard's rows, while in memory
            sample.add(backend, shard.id, shard.offset, x)
        _account(acct, "gnnd", name, t)
        acct.add_descent("gnnd", g.report)
        # local -> global ids in place: int64 temporaries cost ~0.3 s of held GIL per 1M-row shard
        ids = np.asarray(g.ids, dtype=ID_DTYPE)
        np.add(ids, shard.offset, out=ids, where=ids >= 0)
        cache.put(shard.id, ShardPart(shard.offset, x, KnnGraph(ids, g.dists)), dirty=True)
        writer.write_now(shard.id)
        sched.shard_ready(shard.id)

    def merge(backend: Backend, name: str, pair: tuple[int, int]) -> None:
        i, j = pair
        cache.prefetch(s for p in sched.upcoming(set(pair), cache.capacity) for s in p if s not in pair)
        a, b = cache.get(i), cache.get(j)
        # a GPU backend copies the next pair's shards during this merge
        upcoming = [cache.peek(s) for p in sched.upcoming(set(pair), 2) for s in p if s not in pair]
        backend.stage([arr for part in upcoming if part is not None
                       for arr in (part.vectors, part.graph.ids, part.graph.dists)])
        vias = [cache.get(s) for s in ledger.seed_shards(i, j, merged_with.get(j, []))]
        t = time.perf_counter()
        ga, gb = backend.ggm(a, b, metric, params, seed=seed_for(m.seed, 1, i, j), vias=vias)
        _account(acct, "ggm", name, t)
        acct.add_descent("ggm", ga.report)
        record(i, j)
        gen_i = cache.put(i, ShardPart(a.offset, a.vectors, ga), dirty=True)
        gen_j = cache.put(j, ShardPart(b.offset, b.vectors, gb), dirty=True)
        writer.merged(pair, gen_i, gen_j)
        for sid in sched.release(pair):
            writer.write_now(sid)

    def work(backend: Backend, name: str, advance) -> None:
        last: set[int] = set(ledger.last_pair() or ())
        try:
            while (task := sched.next_task(last)) is not None:
                kind, what = task
                if kind == "gnnd":
                    gnnd(backend, name, *what)
                    advance(1)
                else:
                    merge(backend, name, what)
                    advance(1)
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
    cache.prefetch(s for p in sched.upcoming(set(), cache.capacity) for s in p if s in sched.ready)
    with reporter.phase("build", tasks, "tasks") as advance:
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


def _account(acct: Accounting, phase: str, worker: str, t: float) -> None:
    """Book a backend call that started at ``t``: phase seconds, the worker's busy time, the phase's span."""
    end = time.perf_counter()
    acct.add(phase, end - t)
    acct.add_busy(worker, end - t)
    acct.extend_span(phase, t, end)


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


def pending_pairs(ledger, shards: int) -> list[tuple[int, int]]:
    """Pairs of the first ``shards`` shards this run must merge, in the ledger's order (a build: round-robin)."""
    return ledger.ordered([p for p in schedule.pending_pairs(shards, ledger.done()) if ledger.wanted(*p)])
