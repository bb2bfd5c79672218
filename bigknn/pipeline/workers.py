"""GNND and pairwise merges on one or more workers (one per GPU), with disk I/O overlapped with compute.

* Shards live in a bounded host cache: a worker that takes a pair finds its shards there when they were
  prefetched or used by its previous pair; results replace the cached graphs at once, so the next pair
  sees them before they reach the disk.
* A scheduler hands out pending pairs whose shards no running merge touches (any order of the pairs gives
  the same all-pairs result), preferring a pair that shares a shard with the worker's last one.
* One writer thread writes finished graphs and commits the manifest, in completion order, so a crash
  loses at most the merges not yet committed, and the rerun redoes exactly those.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from bigknn.backends import Backend, ShardPart
from bigknn.graph import ID_DTYPE, KnnGraph
from bigknn.metrics import kernel_metric
from bigknn.params import GnndParams
from bigknn.pipeline.schedule import round_robin
from bigknn.progress import Reporter
from bigknn.shards import Store

WRITE_QUEUE = 4  # finished results waiting for the disk before workers pause (bounds host memory)
IO_THREADS = 4  # concurrent shard reads (prefetch) and array writes: one zarr stream moves ~1.6 GB/s


@dataclass
class Accounting:
    """What a run did: seconds per phase (summed over workers), bytes moved, each worker's busy time."""

    seconds: dict = field(default_factory=dict)
    bytes_read: int = 0
    bytes_written: int = 0
    busy: dict = field(default_factory=dict)  # worker name -> seconds inside backend calls
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, phase: str, seconds: float, nbytes_read: int = 0, nbytes_written: int = 0) -> None:
        with self.lock:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds
            self.bytes_read += nbytes_read
            self.bytes_written += nbytes_written

    def add_busy(self, worker: str, seconds: float) -> None:
        with self.lock:
            self.busy[worker] = self.busy.get(worker, 0.0) + seconds


def seed_for(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


class ShardCache:
    """Latest vectors and graph of recently used shards, least recently used evicted first.

    A merge result is *dirty* until the writer has put it on disk: it is never evicted before that, or a
    later read from disk would return the graph from before the merge.
    """

    def __init__(self, store: Store, ledger, capacity: int, acct: Accounting):
        self.store, self.ledger, self.capacity, self.acct = store, ledger, max(2, capacity), acct
        self._parts: OrderedDict[int, ShardPart] = OrderedDict()
        self._dirty: dict[int, KnnGraph] = {}
        self._loading: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
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

    def put(self, sid: int, part: ShardPart, dirty: bool = False) -> None:
        with self._lock:
            self._parts[sid] = part
            self._parts.move_to_end(sid)
            if dirty:
                self._dirty[sid] = part.graph
            self._evict()

    def written(self, sid: int, graph: KnnGraph) -> None:
        """The writer stored ``graph``: the cached copy may go once it is no newer than that."""
        with self._lock:
            if self._dirty.get(sid) is graph:
                del self._dirty[sid]
            self._evict()

    def _evict(self) -> None:
        for sid in list(self._parts):
            if len(self._parts) <= self.capacity:
                return
            if sid not in self._dirty:
                del self._parts[sid]

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
    """One thread that writes results and commits them, in the order they were finished."""

    def __init__(self, store: Store, ledger, acct: Accounting, advance, cache: ShardCache | None = None):
        self.store, self.ledger, self.acct, self.advance, self.cache = store, ledger, acct, advance, cache
        self.jobs: queue.Queue = queue.Queue(maxsize=WRITE_QUEUE)
        self.pool = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="write")
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def submit(self, graphs: dict[int, KnnGraph], pair: tuple[int, int] | None, units: int) -> None:
        if self.error is not None:
            raise self.error
        self.jobs.put((graphs, pair, units))

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()
        self.pool.shutdown(wait=True)
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            if self.error is not None:
                continue
            graphs, pair, units = job
            try:
                t = time.perf_counter()
                versions = {sid: (self.ledger.version(sid) or 0) + 1 for sid in graphs}
                list(self.pool.map(lambda sid: self.store.write_graph(sid, versions[sid], graphs[sid]), graphs))
                for sid, version in versions.items():
                    self.ledger.set_version(sid, version)
                nbytes = sum(g.ids.nbytes + g.dists.nbytes for g in graphs.values())
                if pair is not None:
                    self.ledger.add_pair(*pair)
                self.store.commit()
                if self.cache is not None:
                    for sid, g in graphs.items():
                        self.cache.written(sid, g)
                self.acct.add("write", time.perf_counter() - t, nbytes_written=nbytes)
                self.advance(units)
            except BaseException as e:  # noqa: BLE001 - handed to the main thread by submit/close
                self.error = e


def run_gnnd(store: Store, ledger, backends: list[Backend], reporter: Reporter, acct: Accounting) -> None:
    """GNND for every shard without a graph, shards spread over the workers."""
    m = store.manifest
    todo = [s for s in ledger.shards() if ledger.version(s.id) is None]
    if not todo:
        return
    params, metric = GnndParams(**m.params), kernel_metric(m.metric)
    # one reader thread keeps the next shards' vectors ready while the workers compute
    loaded: queue.Queue = queue.Queue(maxsize=len(backends) + 1)
    read_error: list[BaseException] = []

    def reader() -> None:
        try:
            for shard in todo:
                t = time.perf_counter()
                x = store.read_vectors(shard.id)
                acct.add("read", time.perf_counter() - t, x.nbytes)
                loaded.put((shard, x))
        except BaseException as e:  # noqa: BLE001 - raised by the workers below
            read_error.append(e)
        finally:
            for _ in backends:
                loaded.put(None)

    def work(backend: Backend, name: str, writer: Writer) -> None:
        while (item := loaded.get()) is not None:
            shard, x = item
            t = time.perf_counter()
            g = backend.gnnd(x, metric, params, seed=seed_for(m.seed, 0, shard.id))
            dt = time.perf_counter() - t
            acct.add("gnnd", dt)
            acct.add_busy(name, dt)
            ids = np.where(g.ids >= 0, g.ids.astype(np.int64) + shard.offset, -1).astype(ID_DTYPE)
            writer.submit({shard.id: KnnGraph(ids, g.dists)}, None, shard.rows)
        if read_error:
            raise read_error[0]

    with reporter.phase("gnnd", sum(s.rows for s in todo), "rows") as advance:
        threading.Thread(target=reader, daemon=True).start()
        _run_workers(store, ledger, backends, acct, advance, work)


def run_merges(store: Store, ledger, pairs: list[tuple[int, int]], backends: list[Backend], reporter: Reporter,
               acct: Accounting, cache_shards: int) -> None:
    """GGM for every pair in ``pairs`` (each exactly once), spread over the workers."""
    if not pairs:
        return
    m = store.manifest
    params, metric = GnndParams(**m.params), kernel_metric(m.metric)
    sched = PairScheduler(pairs)
    cache = ShardCache(store, ledger, cache_shards, acct)

    def work(backend: Backend, name: str, writer: Writer) -> None:
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
                cache.put(i, ShardPart(a.offset, a.vectors, ga), dirty=True)
                cache.put(j, ShardPart(b.offset, b.vectors, gb), dirty=True)
                writer.submit({i: ga, j: gb}, pair, 1)
                sched.release(pair)
                last = set(pair)
        except BaseException:
            sched.fail()
            raise

    with reporter.phase("merge", len(pairs), "pairs") as advance:
        try:
            _run_workers(store, ledger, backends, acct, advance, work, cache)
        finally:
            cache.close()


def _run_workers(store, ledger, backends, acct, advance, work, cache: ShardCache | None = None) -> None:
    writer = Writer(store, ledger, acct, advance, cache)
    errors: list[BaseException] = []

    def guarded(backend, name):
        try:
            work(backend, name, writer)
        except BaseException as e:  # noqa: BLE001 - re-raised below in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(b, f"{b.name}:{n}"), daemon=True)
               for n, b in enumerate(backends)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    writer.close()
    if errors:
        raise errors[0]


def pending_pairs(ledger) -> list[tuple[int, int]]:
    done = ledger.done()
    return [p for rnd in round_robin(len(ledger.shards())) for p in rnd if p not in done and ledger.wanted(*p)]
