"""The Dask side of write-back: the pending graph versions the workers hold, written by a ``tasks.flush``
on each holder when the client's ``Writer`` (bigknn/engine/writer.py) asks, at checkpoints, for a
finished shard, to make room on a worker, or at the end. The checkpoint clock, the pairs waiting for
both graphs, and the commits are the in-process ones."""

from __future__ import annotations

import uuid
from typing import Callable, Iterable

from bigknn.engine.dask import worker_tasks as tasks
from bigknn.engine.dask.connect import WorkerGone, pinned_result
from bigknn.engine.dask.holdings import Holdings
from bigknn.engine.dask.part_cache import CACHE_PARTS
from bigknn.engine.dask.worker_tasks import StoreSpec
from bigknn.engine.writer import Written


class ClusterSink:
    """Writes pending versions through flush tasks, one per holding worker, side by side. A version its
    worker does not hold (it died) goes to ``on_lost(sids, worker)``."""

    def __init__(self, client, spec: StoreSpec, holdings: Holdings,
                 on_lost: Callable[[list[int], str], None]):
        self.client, self.spec, self.holdings, self.on_lost = client, spec, holdings, on_lost
        self.ask: Callable[[list[int]], None] = lambda sids: None

    def on_pressure(self, ask: Callable[[list[int]], None]) -> None:
        self.ask = ask

    def make_room(self, worker: str) -> None:
        """Have the shards pending on ``worker`` beyond its cache's size written."""
        excess = self.holdings.excess(worker, CACHE_PARTS)
        if excess:
            self.ask(excess)

    def dirty(self) -> list[int]:
        return sorted(sid for held in self.holdings.pending().values() for sid in held)

    def size(self, sids: Iterable[int]) -> int:
        """Not known here: a Dask run's Writer has no allowance (its checkpoints follow the interval)."""
        return 0

    def write(self, sids: Iterable[int], final: frozenset[int] = frozenset()) -> tuple[Written, int]:
        # at the build's width, ``final`` or not: the workers write what they hold; on the holder only (connect.pinned_result): a flush elsewhere would find the versions missing
        held = self.holdings.pending(set(sids))
        futures = {worker: self.client.submit(tasks.flush, self.spec, versions, pure=False,
                                              key=f"flush-{uuid.uuid4().hex[:8]}", workers=[worker],
                                              allow_other_workers=False)
                   for worker, versions in held.items()}
        done: Written = {}
        nbytes = 0
        for worker, future in futures.items():
            try:
                res = pinned_result(self.client, future, {worker})
            except WorkerGone:  # the holder died with the versions
                self.client.cancel([future])
                self.on_lost(list(held[worker]), worker)
                continue
            finally:
                future.release()
            done.update({sid: (v, v) for sid, v in res.written.items()})
            nbytes += res.bytes_written
            if res.missing:
                self.on_lost(res.missing, worker)
        return done, nbytes

    def accept(self, done: Written) -> Written:
        """Record the writes as durable, but those of versions lost with a worker before their write was
        reported (under the writer's lock, as ``Writer.forget`` reverts: the two never interleave)."""
        return {sid: vg for sid, vg in done.items() if self.holdings.written(sid, vg[0])}

    def written(self, done: Written) -> None:
        """Nothing more: the workers keep the written graphs as ordinary cached parts."""

    def close(self) -> None:
        """Nothing to release: the flushes ran on the workers."""
