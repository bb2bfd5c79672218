"""The bounded host cache of shards (vectors + latest graph) the workers merge from, with prefetching and the
dirty-shard bookkeeping the writer relies on (bigknn/engine/writer.py)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from bigknn.core.knn_graph import KnnGraph, ShardPart, widened
from bigknn.engine.accounting import Accounting
from bigknn.shards import Store

IO_THREADS = 4  # concurrent shard reads (prefetch) and array writes: one zarr stream moves ~1-1.6 GB/s


class ShardCache:
    """Latest vectors and graph of recently used shards, evicted in ``eviction_order`` (the Scheduler's: the
    shards its pending pairs need least soon) where one is set, else least recently used first.

    Each shard's graph has a generation, raised by every ``put(..., dirty=True)``. A dirty shard (cached
    graph newer than the disk's) is never evicted: when only dirty shards could make room, the cache asks
    ``on_pressure`` (the writer) to write them, and evicts them once ``written``.

    ``tight``: the cache holds fewer than the store's ``shards``. Merges then prefer pairs of cached shards
    (Scheduler ``held``) and read ahead only the next pair's missing shards: reading further ahead evicts
    shards the cache-aware order is about to use (10 shards through 4 on the CPU, one worker: 46 shard reads
    against 20; the LRU replay of the plan counts 19).
    """

    def __init__(self, store: Store, ledger, capacity: int, acct: Accounting, shards: int):
        self.store, self.ledger, self.capacity, self.acct = store, ledger, max(2, capacity), acct
        self.tight = self.capacity < shards
        self.on_pressure = lambda sids: None
        self.eviction_order: Callable[[list[int], set[int]], list[int]] | None = None
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
            vectors, graph = self.store.read_vectors(sid), self.store.read_graph(sid, self.ledger.version(sid))
            self.acct.add("read", time.perf_counter() - t, vectors.nbytes + graph.ids.nbytes + graph.dists.nbytes)
            part = ShardPart(shard.offset, vectors, widened(graph, self.store.manifest.params.width()))
            self.acct.extend_span("read", t, time.perf_counter())
            self.put(sid, part)
            return part
        finally:
            with self._lock:
                self._loading.pop(sid).set()

    def touch(self, sids) -> None:
        """Mark the cached ones of ``sids`` just used: a merge touches its pair first, so that reading one of
        its shards never evicts the other (which was then read again)."""
        with self._lock:
            for sid in sids:
                if sid in self._parts:
                    self._parts.move_to_end(sid)

    def holds(self, sid: int) -> bool:
        """Whether ``sid`` is cached now, read without the lock: a hint for choosing work (the scheduler asks
        under its own lock), never a promise."""
        return sid in self._parts

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
        """Clean shards out in eviction order, never the one just put or used: where every other shard is
        dirty, a shard read (or read ahead) was the only one to go, dropped as it arrived (a 10-shard CPU build
        through 4 read 68 shards for 45 merges, 41 with the narrower read-ahead alone, 20 with both)."""
        if len(self._parts) <= self.capacity:  # room: no order to ask the Scheduler for
            return
        lru = list(self._parts)
        order = self.eviction_order(lru, set(lru)) if self.eviction_order is not None else lru
        for sid in order:
            if len(self._parts) <= self.capacity:
                return
            if sid != lru[-1] and sid not in self._dirty:
                del self._parts[sid]
        over = len(self._parts) - self.capacity
        if over > 0:  # only dirty shards left to drop: have the first of them in eviction order written
            ask = [s for s in order if s in self._dirty and s not in self._asked and s != lru[-1]][:over]
            self._asked.update(ask)
            if ask:
                self.on_pressure(ask)

    def read_ahead(self) -> int:
        """Upcoming pairs whose shards ``prefetch`` should be given: one where the cache is tight, else as
        many as it holds."""
        return 1 if self.tight else self.capacity

    def prefetch(self, sids) -> None:
        """Start reading the first shards of ``sids`` in the background: as many as the cache holds beside
        the two of the running pair (other entries make room, in eviction order)."""
        wanted = list(dict.fromkeys(sids))[:max(0, self.capacity - 2)]
        with self._lock:
            todo = [s for s in wanted if s not in self._parts and s not in self._loading]
        for sid in todo:
            self._pool.submit(self.get, sid)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
