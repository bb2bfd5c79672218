"""The client's view of where each shard's newest graph is during a Dask run: on disk (durable), or pending
in one worker's memory, and which worker to send a task to (``place``).

A shard's versions form one line, numbered upwards (``tasks.claim_version``): each task makes the next from
the one before. A pending version lives on the worker whose task made it, and every task reading it runs
there, so a shard's pending versions are all on one worker; when that worker is lost they revert to the
shard's newest durable version."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass


@dataclass
class Holding:
    """One shard: its newest version (None: no graph), the worker holding it pending (None: on disk), the
    newest version on disk, the worker that last had the shard in memory, and the version ranges (low,
    high] lost with a worker: a write of one of them that reports late must not count."""

    version: int | None
    owner: str | None = None
    durable: int | None = None
    seen: str | None = None
    lost: tuple[tuple[int, int], ...] = ()


class Holdings:
    """Every shard's ``Holding``, shared by the client's threads."""

    def __init__(self, versions: dict[int, int | None]):
        self._held = {sid: Holding(v, durable=v) for sid, v in versions.items()}
        self._lock = threading.Lock()

    def get(self, sid: int) -> Holding:
        with self._lock:
            h = self._held.setdefault(sid, Holding(None))
            return Holding(h.version, h.owner, h.durable, h.seen, h.lost)

    def made(self, sid: int, version: int, worker: str) -> None:
        """A task on ``worker`` made ``version``, pending there."""
        with self._lock:
            h = self._held.setdefault(sid, Holding(None))
            h.version, h.owner, h.seen = version, worker, worker

    def written(self, sid: int, version: int) -> bool:
        """``version`` is on disk: the shard is durable if that is its newest. False (nothing changes) if
        the version was lost with a worker before its write was reported."""
        with self._lock:
            h = self._held[sid]
            if any(low < version <= high for low, high in h.lost):
                return False
            h.durable = max(version, h.durable or 0)
            if h.version == version:
                h.owner = None
            return True

    def lost(self, sid: int, worker: str | None) -> tuple[bool, int | None]:
        """``worker`` lost the shard's pending versions: back to its newest durable version. Whether it
        reverted (not if its pending versions are elsewhere by now), and the durable version."""
        with self._lock:
            h = self._held[sid]
            if h.owner is None or h.owner != worker:
                return False, h.durable
            h.lost += ((h.durable or 0, h.version),)
            h.version, h.owner = h.durable, None
            return True, h.durable

    def pending(self, sids=None) -> dict[str, dict[int, int]]:
        """worker -> {shard: pending version} of ``sids`` (all shards if None)."""
        out: dict[str, dict[int, int]] = {}
        with self._lock:
            for sid, h in self._held.items():
                if h.owner is not None and (sids is None or sid in sids):
                    out.setdefault(h.owner, {})[sid] = h.version
        return out

    def excess(self, worker: str, limit: int) -> list[int]:
        """The shards pending on ``worker`` beyond ``limit``, to be written to make room there."""
        held = self.pending().get(worker, {})
        return list(held)[:max(0, len(held) - limit)]


def place(held: list[Holding], threads: dict[str, int], inflight: Counter[str]) -> tuple[str | None, list[int]]:
    """The worker for a task on the shards ``held`` (None: no worker) and the indexes of those it must be
    handed over (pending on another worker). A worker with a thread free first (a worker runs as many
    tasks as it has threads: one computes while the other reads or writes; one GPU of two was 14 % busy
    when tasks queued on the holder, 50M x 96), then the fewest tasks in flight plus moves (a move costs
    about a task: an idle worker takes a pair whose shard is pending on a worker with a thread free only if
    nothing moves), then the fewest moves, then the one holding most of the shards in memory."""
    if not threads:
        return None, []

    def moves(w: str) -> list[int]:  # a holder that left counts too: the wait finds it gone (WorkerGone)
        return [n for n, h in enumerate(held) if h.owner is not None and h.owner != w]

    order = {w: n for n, w in enumerate(threads)}
    best = min(threads, key=lambda w: (inflight[w] >= threads[w], inflight[w] + len(moves(w)), len(moves(w)),
                                       -sum(h.seen == w for h in held), order[w]))
    return best, moves(best)
