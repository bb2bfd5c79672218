"""Write-back and commits: one thread writes graphs and commits the manifest, so an fsync never holds up a worker.

What reaches the disk (the rule T8 of the design holds a default build to: bytes written <= the vectors' copy +
the final graph + CHECKPOINT_SHARE):

* A shard's graph is written once, when it is final (no merge left for it in the run), and only its k
  columns: the lists of the build's width (``params.width()``) are what merges need, not readers, and
  ``ShardCache`` pads a k-wide graph read back for a later merge (an ingest, a resumed run).
* Otherwise a graph reaches the disk only when host RAM (``--host-mem``) cannot hold it (the cache's
  pressure), or at a checkpoint that is due: ``checkpoint_s()`` after the oldest result not on disk, and
  only where its writes keep all checkpoints within CHECKPOINT_SHARE of the run's time (the next one waits
  ten times as long as the last one wrote; one whose writes, at the rate measured so far, would pass that
  share of the time since the run began waits) AND within CHECKPOINT_SHARE of the bytes the run must write
  (``allowance``; writes under pressure count against it too). A checkpoint that does not fit waits for the
  next interval. Where none fits (a short build whose cached graphs outweigh its allowance, or a long one
  past it), a crash redoes the merges since the last commit: set BIGKNN_CHECKPOINT_S to bound that.
* ``BIGKNN_CHECKPOINT_S`` set is an expert's (or a test's) choice: checkpoints at that interval, the time
  share kept, no byte allowance; 0 writes and commits every result at once.

Where the graphs come from is the sink's business: the in-process shard cache (``CacheSink``), or the
pending versions Dask workers hold (bigknn/engine/dask/flush.py, which writes them at the build's width). The
checkpoint clock, the pairs waiting for both their graphs and the commits are the same for both."""

from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Protocol

from bigknn.core import envvars
from bigknn.core.knn_graph import KnnGraph, final_columns
from bigknn.engine.accounting import Accounting
from bigknn.engine.shard_cache import IO_THREADS, ShardCache
from bigknn.shards import Store

# results reach the disk (and the manifest) at most this often, where a checkpoint fits its budget: each
# rewrites every graph changed since the last (10 s wrote T2's graphs 6 times: 5x the input)
CHECKPOINT_S = 60.0
# ... and checkpoints take at most this share of the run's time and of the bytes it must write: the next one
# waits ten times as long as the last one wrote (a billion rows' cached graphs, 63 GB, take ~36 s: every 6 min,
# not every minute, which would keep the disk writing more than half the time; bigknn plan models T7 so)
CHECKPOINT_SHARE = 0.1

Written = dict[int, tuple[int, int]]  # shard -> (graph version now on disk, generation it holds)


def checkpoint_s() -> float:
    """Seconds between write-back checkpoints at least (env BIGKNN_CHECKPOINT_S overrides; 0 commits every
    merge)."""
    return envvars.seconds("BIGKNN_CHECKPOINT_S", CHECKPOINT_S)


def checkpoint_allowance(must_write: int) -> int | None:
    """Bytes a run's checkpoints and evictions may write beside the ``must_write`` bytes of its vectors and
    final graphs; None (no limit) where BIGKNN_CHECKPOINT_S sets the interval."""
    if os.environ.get("BIGKNN_CHECKPOINT_S", "").strip():
        return None
    return int(CHECKPOINT_SHARE * must_write)


def checkpoint_interval(base_s: float, write_s: float) -> float:
    """Seconds to the next checkpoint after one whose writes took ``write_s``: ``base_s``, or longer where
    that would give the checkpoints more than CHECKPOINT_SHARE of the time (0: every merge committed, no
    checkpoints)."""
    return max(base_s, write_s / CHECKPOINT_SHARE) if base_s > 0 else base_s


class GraphSink(Protocol):
    """Where the graphs not yet on disk are, and how they get there."""

    def on_pressure(self, ask: Callable[[list[int]], None]) -> None:
        """Have ``ask(sids)`` called when results held in memory must be written to make room."""

    def dirty(self) -> list[int]:
        """Shards whose newest graph is not on disk."""

    def size(self, sids: Iterable[int]) -> int:
        """Bytes a checkpoint of ``sids`` would write (asked only by a Writer given an ``allowance``)."""

    def write(self, sids: Iterable[int], final: frozenset[int] = frozenset()) -> tuple[Written, int]:
        """Write the newest graphs of ``sids`` (those not on disk), those in ``final`` (no merge left) k wide
        where the sink can; what was written, and its bytes on disk."""

    def accept(self, done: Written) -> Written:
        """Of the writes ``done``, those to record (called under the writer's lock, before the ledger
        records them and the manifest is committed)."""

    def written(self, done: Written) -> None:
        """``done`` is recorded in the ledger (called after the commit, before the next write)."""

    def close(self) -> None:
        """Release the sink's threads."""


class CacheSink:
    """In-process: the dirty graphs of the shard cache, written by ``IO_THREADS`` threads."""

    def __init__(self, store: Store, ledger, cache: ShardCache,
                 on_final: Callable[[int, int, int, KnnGraph], None] | None = None):
        """``on_final(shard, version, offset, graph)``: told of each final graph as it is written (the recall
        sample keeps its rows' lists: SampleTruth.keep_final)."""
        self.store, self.ledger, self.cache, self.on_final = store, ledger, cache, on_final
        self.pool = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="write")

    def on_pressure(self, ask: Callable[[list[int]], None]) -> None:
        self.cache.on_pressure = ask

    def dirty(self) -> list[int]:
        return self.cache.dirty()

    def size(self, sids: Iterable[int]) -> int:
        """Bytes the cached graphs of ``sids`` not on disk would write at the build's width."""
        snaps = [snap for sid in sids if (snap := self.cache.snapshot(sid)) is not None]
        return sum(g.ids.nbytes + g.dists.nbytes for g, _ in snaps)

    def write(self, sids: Iterable[int], final: frozenset[int] = frozenset()) -> tuple[Written, int]:
        snaps = {sid: snap for sid in dict.fromkeys(sids) if (snap := self.cache.snapshot(sid)) is not None}
        versions = {sid: self.store.next_version(sid, self.ledger.version(sid)) for sid in snaps}
        k = self.store.manifest.k

        def write(sid: int) -> int:
            g = snaps[sid][0]
            if sid not in final:
                return self.store.write_graph(sid, versions[sid], g)
            nbytes = self.store.write_graph(sid, versions[sid], final_columns(g, k))
            if self.on_final is not None:
                self.on_final(sid, versions[sid], self.ledger.shards()[sid].offset, g)
            return nbytes

        nbytes = sum(self.pool.map(write, snaps))
        return {sid: (versions[sid], snaps[sid][1]) for sid in snaps}, nbytes

    def accept(self, done: Written) -> Written:
        return done

    def written(self, done: Written) -> None:
        for sid, (_, gen) in done.items():  # evictable once the ledger names the version a re-read takes
            self.cache.written(sid, gen)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class Writer:
    """One thread that writes graphs and commits the manifest.

    ``write_now(sid)`` writes a shard's final graph at once (a shard with no merge left). ``gnnd_done(sid)``
    and ``merged(pair, gi, gj)`` record results held by the sink (a merge's at generations gi, gj): those of
    shards with no merge left (``final``) are written at once, the others at the next checkpoint that fits the
    budget (the module's docstring; at once with an interval of 0), under memory pressure, or at ``close()``,
    which writes everything still dirty; a merge is committed once both its graphs are written. ``write_sync``
    writes in the caller's thread (the end of a Dask round, which must know what was lost). ``allowance``: bytes
    checkpoints and evictions may write (None: no limit).
    """

    def __init__(self, store: Store, ledger, acct: Accounting, sink: GraphSink, allowance: int | None = None):
        self.store, self.ledger, self.acct, self.sink = store, ledger, acct, sink
        self.allowance = allowance
        self.spent = 0  # bytes written that are not a final graph (checkpoints, evictions)
        self.checkpoint_s = 0.0  # seconds the checkpoints' writes took
        self.write_s, self.write_bytes = 0.0, 0  # of every write: the rate a checkpoint's time is guessed at
        self.final: set[int] = set()  # shards with no merge left in this run
        self.jobs: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.finished: list[tuple[int, int, int, int]] = []  # merged pairs not yet committed, with gens
        self.written_gen: dict[int, int] = {}
        self.since: float | None = None  # when the oldest result not yet on disk was made
        self._lock = threading.Lock()
        self.base_interval = self.interval = checkpoint_s()
        sink.on_pressure(lambda sids: self.jobs.put(list(sids)))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def write_now(self, sid: int) -> None:
        """``sid`` has no merge left: write its graph, final, at once."""
        self._raise()
        with self._lock:
            self.final.add(sid)
        self.jobs.put([sid])

    def write_sync(self, sids: Iterable[int]) -> None:
        self._raise()
        self._write(sids)

    def gnnd_done(self, sid: int, final: bool = False) -> None:
        """A shard's GNND result is in the sink; ``final``: no merge of it is left (written final at once)."""
        if final:
            self.write_now(sid)
            return
        self._raise()
        if self.interval <= 0:
            self.jobs.put([sid])
        else:
            self._start_clock()

    def merged(self, pair: tuple[int, int], gen_i: int, gen_j: int, final: Iterable[int] = ()) -> None:
        """A merge's results are in the sink; ``final``: those of its shards with no merge left, written final
        at once. Marked final before any write of the pair is queued, so a shard's last graph is never
        written at the work width first and then found clean (the stored width would depend on a race)."""
        self._raise()
        final = list(final)
        with self._lock:
            self.finished.append((*pair, gen_i, gen_j))
            self.final.update(final)
        if self.interval <= 0:
            self.jobs.put(list(pair))
            return
        self._start_clock()
        if final:
            self.jobs.put(final)

    def forget(self, sid: int, revert: Callable[[], bool]) -> list[tuple[int, int]]:
        """The sink lost ``sid``'s graphs not yet written (a Dask worker died): ``revert()`` it (False: it
        had nothing to lose) and drop the uncommitted pairs that reached it in a generation newer than its
        written one; they must be merged again. Under the writer's lock: no write of it is recorded
        halfway."""
        with self._lock:
            if not revert():
                return []
            gen = self.written_gen.get(sid, 0)
            lost = [f for f in self.finished if (f[0] == sid and f[2] > gen) or (f[1] == sid and f[3] > gen)]
            for f in lost:
                self.finished.remove(f)
        return [(f[0], f[1]) for f in lost]

    def _start_clock(self) -> None:
        """The checkpoint clock runs from the oldest result not yet on disk: start it and wake the writer."""
        with self._lock:
            first = self.since is None
            if first:
                self.since = time.monotonic()
        if first:
            self.jobs.put("tick")

    def close(self, final: bool = False) -> None:
        """Write every dirty shard (``final``: the run ended with no merge left, so every graph is final),
        commit, stop the thread; raise the first write error."""
        if final:
            with self._lock:
                self.final.update(self.sink.dirty())
        self.jobs.put(None)
        self.thread.join()
        self.sink.close()
        self._raise()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        while True:
            with self._lock:
                due = None if self.since is None else self.since + self.interval
            try:
                job = self.jobs.get(timeout=None if due is None else max(0.0, due - time.monotonic()))
            except queue.Empty:
                job = "checkpoint"
            if job == "tick":
                continue
            sids = self.sink.dirty() if job is None or job == "checkpoint" else job
            t = time.monotonic()
            if job == "checkpoint" and not self._fits(sids):
                sids = []
            if self.error is None:
                try:
                    self._write(sids)
                except BaseException as e:  # noqa: BLE001 - handed to the workers by _raise
                    self.error = e
            if job is None:
                return
            if job == "checkpoint":  # results made while it wrote wait for the next one
                with self._lock:
                    self.since = time.monotonic() if self.finished or self.sink.dirty() else None
                    if sids:
                        self.checkpoint_s += time.monotonic() - t
                        self.interval = checkpoint_interval(self.base_interval, time.monotonic() - t)

    def _fits(self, sids: list[int]) -> bool:
        """Whether a checkpoint of ``sids`` keeps the checkpoints within their share of the run's bytes
        (``allowance``) and of its time (its writes at the rate measured so far). Without an allowance
        (BIGKNN_CHECKPOINT_S set), the interval alone decides."""
        if self.allowance is None:
            return True
        nbytes = self.sink.size(sids)
        if self.spent + nbytes > self.allowance:
            return False
        guess_s = nbytes * self.write_s / self.write_bytes if self.write_bytes else 0.0
        return self.checkpoint_s + guess_s <= CHECKPOINT_SHARE * (time.perf_counter() - self.acct.t0)

    def _write(self, sids: Iterable[int]) -> None:
        """Write the graphs of ``sids``, record them and the pairs they complete, and commit."""
        t = time.perf_counter()
        sids = list(sids)
        with self._lock:
            final = frozenset(self.final.intersection(sids))
        versions: Written = {}
        nbytes = 0
        for group in (sorted(final), [sid for sid in sids if sid not in final]):
            if group:
                done, n = self.sink.write(group, final)
                versions.update(done)
                nbytes += n
                if group[0] not in final:
                    self.spent += n
        with self.store.lock:
            with self._lock:  # not held during the commit: a worker reporting a merge never waits for an fsync
                versions = self.sink.accept(versions)
                for sid, (version, gen) in versions.items():
                    if gen > self.written_gen.get(sid, 0):  # a slower write of an older graph changes nothing
                        self.ledger.set_version(sid, version)
                        self.written_gen[sid] = gen
                done = [f for f in self.finished
                        if self.written_gen.get(f[0], 0) >= f[2] and self.written_gen.get(f[1], 0) >= f[3]]
                for f in done:
                    self.ledger.add_pair(f[0], f[1])
                    self.finished.remove(f)
            if versions or done:
                self.store.commit()
        self.sink.written(versions)
        self.write_s += time.perf_counter() - t
        self.write_bytes += nbytes
        self.acct.add("write", time.perf_counter() - t, nbytes_written=nbytes)
        if versions:
            self.acct.extend_span("write", t, time.perf_counter())
