"""The scheduler of a run's tasks: GNND of arriving shards first, then merges of ready pairs no running merge
touches (bigknn/engine/workers.py runs them)."""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Iterable

Pair = tuple[int, int]
RECHECK_S = 0.5  # a worker thread that ``choose`` told to wait asks again this often
TASK_NAMES = {"gnnd": "shards' GNND", "merge": "pair merges"}  # what progress calls each kind of task


def task_parts(gnnd: int, merges: int) -> dict[str, int]:
    """A run's tasks by kind, as progress reports them (bigknn/core/progress.py ``parts``)."""
    return {TASK_NAMES["gnnd"]: gnnd, TASK_NAMES["merge"]: merges}


class Scheduler:
    """The work of a run as tasks for the workers: GNND of each shard that arrives, and the merge of each
    pending pair once both its shards have a graph ("ready") and no running merge touches either.

    GNND comes first (it unblocks pairs and frees the memory of queued shards). Among the pairs, one that shares
    a shard with the worker's previous pair is preferred. Where the host cache is smaller than the store, the
    pipeline says which shards it ``held`` (no read), and reads decide first: a pair with more shards held, then
    one that finishes a shard (its shard with the fewest pairs left: once done, it leaves the cache for good),
    then one whose shard to read has the most pairs left with held shards. Without these rules an LRU cache of 4
    of 8 shards reads 30 shards for the 28 merges; with the first, 9; near pairs of 61 shards through a cache of
    10 read a quarter fewer with the other two (docs/perf-notes.md, session 49).
    """

    def __init__(self, pairs: list[tuple[int, int]], ready: Iterable[int], feeding: bool = False,
                 queue_limit: int = 2, held: Callable[[int], bool] | None = None, planning: bool = False):
        self.held = held
        # a partitioned build's pairs are planned once every shard has its graph: until then each shard may
        # have merges to come, so none is final (written k wide only to be merged and written again)
        self.planning = planning
        self.pending = list(pairs)
        self.partners: dict[int, set[int]] = {}  # each shard's partners in pending pairs
        for pair in self.pending:
            self._pair_pending(pair)
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
    def next_task(self, prefer: set[int], choose: Callable[[list[Pair]], Pair | None] | None = None
                  ) -> tuple[str, object] | None:
        """("gnnd", (shard, vectors)) or ("merge", (i, j)); None when all is done or the run stopped.
        ``choose`` picks among the free pairs (called under the scheduler's lock), or None: none of them
        now, ask again when a task ends (or after ``RECHECK_S``); by default the one sharing most shards
        with ``prefer``."""
        with self.cond:
            while True:
                if self.stopped:
                    return None
                if self.shards:
                    item = self.shards.popleft()
                    self.cond.notify_all()
                    return "gnnd", item
                free = self._free()
                pair = None
                if free:
                    pair = choose(free) if choose is not None else self._ranked(free, prefer)[0]
                if pair is not None:
                    self.pending.remove(pair)
                    self.partners[pair[0]].discard(pair[1])
                    self.partners[pair[1]].discard(pair[0])
                    self.busy.update(pair)
                    return "merge", pair
                if not self.pending and not self.feeding:
                    return None
                self.cond.wait(RECHECK_S if free else None)

    def has_free_pair(self) -> bool:
        """Whether a pending pair is ready and touches no running merge (next_task would hand it out now)."""
        with self.cond:
            return bool(self._free())

    def _ranked(self, pairs: list[Pair], prefer: set[int], count: int = 1) -> list[Pair]:
        """The first ``count`` of ``pairs`` in the order of preference (the class docstring), ties in their order:
        the reads a pair saves, then its shards shared with ``prefer``. The third read rule (pairs left with
        held shards) orders only the pairs the first two leave tied at the top."""
        def shared(pair: Pair) -> int:
            return (pair[0] in prefer) + (pair[1] in prefer)

        if self.held is None:
            return sorted(pairs, key=shared, reverse=True)[:count]
        held = {s: bool(self.held(s)) for s in self.partners}
        with_held = {s: sum(held[o] for o in others) for s, others in self.partners.items()}

        def reads(pair: Pair) -> tuple[int, int]:
            return held[pair[0]] + held[pair[1]], -min(len(self.partners[pair[0]]), len(self.partners[pair[1]]))

        def unlocks(pair: Pair) -> int:
            return sum(with_held[s] for s in pair if not held[s])

        keyed = [(reads(p), p) for p in pairs]
        best = max((k for k, _ in keyed), default=None)
        top = sorted((p for k, p in keyed if k == best), key=lambda p: (unlocks(p), shared(p)), reverse=True)
        if len(top) >= count:
            return top[:count]
        rest = sorted(((k, shared(p), p) for k, p in keyed if k != best), key=lambda t: t[:2], reverse=True)
        return (top + [p for *_, p in rest])[:count]

    def _pair_pending(self, pair: Pair) -> None:
        self.partners.setdefault(pair[0], set()).add(pair[1])
        self.partners.setdefault(pair[1], set()).add(pair[0])

    def _free(self) -> list[Pair]:
        """The pending pairs both of whose shards are ready and in no running merge (the lock held)."""
        return [p for p in self.pending if p[0] in self.ready and p[1] in self.ready
                and p[0] not in self.busy and p[1] not in self.busy]

    def shard_ready(self, sid: int) -> None:
        with self.cond:
            self.ready.add(sid)
            self.cond.notify_all()

    def needs(self, sid: int) -> bool:
        """Whether a pending pair, or the plan still to come, may merge shard ``sid``."""
        with self.cond:
            return self.planning or bool(self.partners.get(sid))

    def release(self, pair: tuple[int, int]) -> list[int]:
        """Free the shards of a finished merge; returns those of them that no pending pair needs any more."""
        with self.cond:
            self.busy.difference_update(pair)
            self.cond.notify_all()
            return [s for s in pair if not self.partners.get(s)]

    def requeue(self, pairs: Iterable[Pair], shards: Iterable = ()) -> None:
        """Take back work whose results were lost (a Dask worker died holding them): ``pairs`` to merge
        again, and (shard, vectors) items to GNND again, not ready until then."""
        with self.cond:
            for item in shards:
                self.ready.discard(item[0].id)
                self.shards.appendleft(item)
            for pair in pairs:
                if pair not in self.pending:
                    self.pending.append(pair)
                    self._pair_pending(pair)
            self.cond.notify_all()

    def has_work(self) -> bool:
        """Whether tasks wait to be handed out (after a round's end: work taken back)."""
        with self.cond:
            return bool(self.pending or self.shards)

    def eviction_order(self, sids: list[int], cached: set[int]) -> list[int]:
        """``sids`` (cached, least recently used first) in the order a host cache of the ``cached`` shards should
        drop them: those with the fewest pending partners in the cache first (no pair left: none), then the
        fewest pending partners in all, ties least recently used first; shards of running merges left out.
        Replayed on the build's order, this reads a sixth to a fifth fewer shards than least recently used
        alone where the cache holds a sixth of 61 shards (docs/perf-notes.md, session 53)."""
        with self.cond:
            def rank(sid: int) -> tuple[int, int]:
                partners = self.partners.get(sid, ())
                return sum(p in cached for p in partners), len(partners)

            return sorted((s for s in sids if s not in self.busy), key=rank)

    def upcoming(self, prefer: set[int], count: int) -> list[tuple[int, int]]:
        """The pairs likely to be taken next, in ``next_task``'s order of preference (for prefetching)."""
        with self.cond:
            return self._ranked(self.pending, prefer, count)

    def stop(self) -> None:
        """End the run (done, or a worker failed): every waiting feeder and worker returns."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
