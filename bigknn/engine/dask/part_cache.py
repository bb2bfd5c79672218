"""A Dask worker's shard parts in memory: the last few it read, and the graphs its tasks made that are not on
disk yet (pending versions, written when the client asks: bigknn/engine/dask/worker_tasks.py ``flush``).

Keys are (store path, shard, graph version): a version never changes once made, so a hit is always current.
A pending part is never evicted; it goes when it is written (then it is an ordinary cached part), when a
task on this worker made a newer version from it ("superseded": the client learns of the newer one from
that task's result), or when it is handed over to a task on another worker."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from bigknn.core.knn_graph import ShardPart

# parts a worker keeps, pending ones included: its two running tasks' four shards and the pairs before (a
# 1M x 96 shard with lists of 48: 0.8 GB, so 6.4 GB); the client has pending parts written past this many
CACHE_PARTS = 8
HISTORY_KEPT = 1024  # keys of pending parts written, superseded or handed over, for a flush that asks late

Key = tuple[str, int, int | None]


class PartCache:
    """Shard parts of this worker process, least recently used evicted first, pending ones never (the
    client has them written when a worker holds more than ``capacity``)."""

    def __init__(self, capacity: int = CACHE_PARTS):
        self.capacity = capacity
        self._parts: OrderedDict[Key, ShardPart] = OrderedDict()
        self._pending: set[Key] = set()
        self._history: OrderedDict[Key, str] = OrderedDict()  # "written", "superseded" or "handed"
        self._lock = threading.Lock()
        self.flushing = threading.Lock()  # one flush at a time: two never write one version side by side

    def get(self, key: Key) -> ShardPart | None:
        with self._lock:
            part = self._parts.get(key)
            if part is not None:
                self._parts.move_to_end(key)
            return part

    def put(self, key: Key, part: ShardPart) -> None:
        """Keep ``part`` (read from the store); the shard's other cached versions go, pending ones stay."""
        with self._lock:
            self._drop_clean(key)
            self._parts[key] = part
            self._evict()

    def put_pending(self, key: Key, part: ShardPart, made_from: int | None) -> None:
        """Keep ``part``, a new graph not on disk, made from version ``made_from`` of the shard (superseded
        now if it was pending here)."""
        with self._lock:
            self._drop_clean(key)
            old = (key[0], key[1], made_from)
            if old in self._pending:
                self._pending.discard(old)
                del self._parts[old]
                self._remember(old, "superseded")
            self._parts[key] = part
            self._pending.add(key)
            self._evict()

    def state(self, key: Key) -> tuple[str, ShardPart | None]:
        """For a flush: ("pending", part), or (what became of it, None): "written" (on disk already),
        "superseded", "handed" (over to another worker), or "missing": this process never had it (it
        restarted, or the task ran elsewhere)."""
        with self._lock:
            if key in self._pending:
                return "pending", self._parts[key]
            return self._history.get(key, "missing"), None

    def hand_over(self, key: Key) -> ShardPart | None:
        """Give up the pending ``key`` (another worker holds it from now on); None if it is not pending here.
        The shard's vectors stay, as an ordinary cached part without a graph: a later task here on the shard
        reads only its graph (the shards of an all-pairs build come back to a worker several times; dropping
        them re-read each 2.75 times on 2 workers, 40k x 16 in 8 shards)."""
        with self._lock:
            if key not in self._pending:
                return None
            self._pending.discard(key)
            self._remember(key, "handed")
            part = self._parts.pop(key)
            self._parts[(key[0], key[1], None)] = ShardPart(part.offset, part.vectors, None)
            return part

    def written(self, key: Key) -> None:
        """The pending ``key`` is on disk now: an ordinary cached part."""
        with self._lock:
            self._pending.discard(key)
            self._remember(key, "written")
            self._evict()

    def drop_pending(self, path: str) -> int:
        """Forget the pending parts of the store at ``path`` (a client that died left them; the store has
        one writer at a time, so none of them is wanted); how many."""
        with self._lock:
            gone = [k for k in self._pending if k[0] == path]
            for k in gone:
                self._pending.discard(k)
                del self._parts[k]
            return len(gone)

    def vectors(self, path: str, shard_id: int) -> np.ndarray | None:
        """The vectors of any cached part of the shard (every version of a shard has the same vectors)."""
        with self._lock:
            return next((p.vectors for (where, sid, _), p in self._parts.items()
                         if where == path and sid == shard_id), None)

    def _remember(self, key: Key, what: str) -> None:
        self._history[key] = what
        while len(self._history) > HISTORY_KEPT:
            self._history.popitem(last=False)

    def _drop_clean(self, key: Key) -> None:
        for old in [k for k in self._parts if k[:2] == key[:2] and k not in self._pending]:
            del self._parts[old]

    def _evict(self) -> None:
        """Drop the oldest written parts while more than ``capacity`` parts are held, pending ones counted."""
        clean = [k for k in self._parts if k not in self._pending]
        for k in clean[:max(0, len(self._parts) - self.capacity)]:
            del self._parts[k]
