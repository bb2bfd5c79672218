"""GNND and pairwise merges on one or more workers (one per GPU), with disk I/O overlapped with compute.

* Shards live in a bounded host cache (vectors + latest graph). Shards arrive there from the sharding pass
  or GNND without a disk read; others are read (prefetched) from the store when a pair needs them.
* A scheduler hands out pending pairs whose shards no running merge touches (any order of the pairs gives
  the same all-pairs result), preferring a pair that shares a shard with the worker's last one.
* Write-back: a GNND graph is written at once. A merge result stays in the cache, newer than the disk
  ("dirty"), and is written at the next checkpoint (every ``checkpoint_s()`` seconds), when the cache must
  make room, or at the end. A shard merged several times between checkpoints is written once. A pair is
  committed when the written graphs of both its shards include it; a crash redoes only uncommitted pairs
  (re-merging a pair whose result one shard already holds is harmless).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np

from bigknn.backends import Backend, ShardPart
from bigknn.graph import ID_DTYPE, KnnGraph
from bigknn.metrics import kernel_metric
from bigknn.params import GnndParams
from bigknn.pipeline.schedule import round_robin
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
    t0: float = field(default_factory=time.perf_counter)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, phase: str, seconds: float, nbytes_read: int = 0, nbytes_written: int = 0) -> None:
        with self.lock:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds
            self.bytes_read += nbytes_read
            self.bytes_written += nbytes_written

    def add_busy(self, worker: str, seconds: float) -> None:
        with self.lock:
            self.busy[worker] = self.busy.get(worker, 0.0) + seconds

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
            self.put(sid, part)
            return part
        finally:
            with self._lock:
                self._loading.pop(sid).set()

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


class PairScheduler:
    """Pending pairs handed out so that no two running merges share a shard."""

    def __init__(self, pairs: list[tuple[int, int]]):
        self.pending = list(pairs)
        self.busy: set[int] = set()
        self.cond = threading.Condition()
        self.failed = False

    def take(self, prefer: set[int]) -> tuple[int, int] | None:
        with self.cond:
            while True:
                if self.failed or not self.pending:
                    return None
                free = [p for p in self.pending if p[0] not in self.busy and p[1] not in self.busy]
                if free:
                    pair = max(free, key=lambda p: (p[0] in prefer) + (p[1] in prefer))
                    self.pending.remove(pair)
                    self.busy.update(pair)
                    return pair
                self.cond.wait()

    def upcoming(self, prefer: set[int], count: int) -> list[tuple[int, int]]:
        """The pairs likely to be taken next, those reusing ``prefer`` first (for prefetching)."""
        with self.cond:
            ranked = sorted(self.pending, key=lambda p: -((p[0] in prefer) + (p[1] in prefer)))
            return ranked[:count]

    def release(self, pair: tuple[int, int]) -> None:
        with self.cond:
            self.busy.difference_update(pair)
            self.cond.notify_all()

    def fail(self) -> None:
        with self.cond:
            self.failed = True
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
            self.finished.append((*pair, gen_i, gen_j))
        if self.interval <= 0:
            self.jobs.put(list(pair))

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
        last = time.monotonic()
        while True:
            with self._lock:
                waiting = bool(self.finished)
            timeout = max(0.0, last + self.interval - time.monotonic()) if waiting else None
            try:
                job = self.jobs.get(timeout=timeout)
            except queue.Empty:
                job = "checkpoint"
            if job is None or job == "checkpoint":
                sids, last = self.cache.dirty(), time.monotonic()
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
        snaps = {sid: snap for sid in dict.fromkeys(sids) if (snap := self.cache.snapshot(sid)) is not None}
        t = time.perf_counter()
        versions = {sid: (self.ledger.version(sid) or 0) + 1 for sid in snaps}
        list(self.pool.map(lambda sid: self.store.write_graph(sid, versions[sid], snaps[sid][0]), snaps))
        with self.store.lock, self._lock:
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


def shards_from_store(store: Store, shards: list[ShardEntry], acct: Accounting) -> Iterator[tuple[ShardEntry, np.ndarray]]:
    """(shard, vectors) of shards already in the store, read one after the other."""
    for shard in shards:
        t = time.perf_counter()
        x = store.read_vectors(shard.id)
        acct.add("read", time.perf_counter() - t, x.nbytes)
        yield shard, x


def run_gnnd(store: Store, ledger, backends: list[Backend], reporter: Reporter, acct: Accounting,
             cache: ShardCache, writer: Writer, source: Iterable[tuple[ShardEntry, np.ndarray]], rows: int,
             phase: str = "gnnd") -> None:
    """GNND for every (shard, vectors) of ``source`` (``rows`` rows in all), shards spread over the workers.
    Each result goes into the cache with its vectors (merges need no disk read) and is written at once."""
    m = store.manifest
    params, metric = GnndParams(**m.params), kernel_metric(m.metric)
    # one feeder thread keeps the next shards' vectors ready while the workers compute
    loaded: queue.Queue = queue.Queue(maxsize=len(backends) + 1)
    feed_error: list[BaseException] = []
    stop = threading.Event()

    def put(item) -> bool:
        """Queue ``item`` unless the workers have stopped (then nobody would take it)."""
        while not stop.is_set():
            try:
                loaded.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def feeder() -> None:
        items = iter(source)
        try:
            for item in items:
                if not put(item):  # the workers failed: end the source (a sharding pass) too
                    getattr(items, "close", lambda: None)()
                    return
        except BaseException as e:  # noqa: BLE001 - raised by the workers below
            feed_error.append(e)
        for _ in backends:
            put(None)

    def work(backend: Backend, name: str, advance) -> None:
        while (item := loaded.get()) is not None:
            shard, x = item
            t = time.perf_counter()
            g = backend.gnnd(x, metric, params, seed=seed_for(m.seed, 0, shard.id))
            dt = time.perf_counter() - t
            acct.add("gnnd", dt)
            acct.add_busy(name, dt)
            ids = np.where(g.ids >= 0, g.ids.astype(np.int64) + shard.offset, -1).astype(ID_DTYPE)
            cache.put(shard.id, ShardPart(shard.offset, x, KnnGraph(ids, g.dists)), dirty=True)
            writer.write_now(shard.id)
            advance(shard.rows)
        if feed_error:
            raise feed_error[0]

    with acct.span(phase), reporter.phase(phase, rows, "rows") as advance:
        feeding = threading.Thread(target=feeder, daemon=True, name="gnnd-feed")
        feeding.start()
        try:
            _run_workers(backends, lambda b, name: work(b, name, advance))
        finally:
            stop.set()
            feeding.join()


def run_merges(store: Store, ledger, pairs: list[tuple[int, int]], backends: list[Backend], reporter: Reporter,
               acct: Accounting, cache: ShardCache, writer: Writer) -> None:
    """GGM for every pair in ``pairs`` (each exactly once), spread over the workers."""
    if not pairs:
        return
    m = store.manifest
    params, metric = GnndParams(**m.params), kernel_metric(m.metric)
    sched = PairScheduler(pairs)

    def work(backend: Backend, name: str, advance) -> None:
        last: set[int] = set(ledger.last_pair() or ())
        try:
            while (pair := sched.take(last)) is not None:
                i, j = pair
                cache.prefetch(s for p in sched.upcoming(set(pair), cache.capacity) for s in p if s not in pair)
                a, b = cache.get(i), cache.get(j)
                t = time.perf_counter()
                ga, gb = backend.ggm(a, b, metric, params, seed=seed_for(m.seed, 1, i, j))
                dt = time.perf_counter() - t
                acct.add("ggm", dt)
                acct.add_busy(name, dt)
                gen_i = cache.put(i, ShardPart(a.offset, a.vectors, ga), dirty=True)
                gen_j = cache.put(j, ShardPart(b.offset, b.vectors, gb), dirty=True)
                writer.merged(pair, gen_i, gen_j)
                sched.release(pair)
                advance(1)
                last = set(pair)
                cache.wait_for_room(2 * len(backends))
        except BaseException:
            sched.fail()
            raise

    with acct.span("merge"), reporter.phase("merge", len(pairs), "pairs") as advance:
        _run_workers(backends, lambda b, name: work(b, name, advance))


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


def pending_pairs(ledger) -> list[tuple[int, int]]:
    done = ledger.done()
    return [p for rnd in round_robin(len(ledger.shards())) for p in rnd if p not in done and ledger.wanted(*p)]
