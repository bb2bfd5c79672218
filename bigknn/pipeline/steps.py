"""The two compute steps every write path runs: GNND for shards without a graph, GGM for pending pairs.

They record progress in a ``Ledger`` and commit after each shard and each pair, so a killed run resumes
from the last commit. A build records straight into the manifest's shard list; an ingest records into
the manifest's ``pending`` section, which readers ignore until the ingest's final commit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from bigknn.backends import Backend, ShardPart
from bigknn.graph import ID_DTYPE, KnnGraph
from bigknn.metrics import kernel_metric
from bigknn.params import GnndParams
from bigknn.pipeline.schedule import round_robin
from bigknn.progress import Reporter
from bigknn.shards import ShardEntry, Store


@dataclass
class PhaseClock:
    """Seconds per phase in this run (reported at the end, and summed into the manifest)."""

    seconds: dict = field(default_factory=dict)

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds


class Ledger:
    """Where a build records progress: the manifest's own shard list and merged pairs."""

    def __init__(self, store: Store):
        self.store = store

    def shards(self) -> list[ShardEntry]:
        return self.store.manifest.shards

    def version(self, sid: int) -> int | None:
        return self.store.manifest.shards[sid].graph

    def set_version(self, sid: int, version: int) -> None:
        self.store.manifest.shards[sid].graph = version

    def done(self) -> set[tuple[int, int]]:
        return self.store.manifest.pairs_done()

    def add_pair(self, i: int, j: int) -> None:
        self.store.manifest.merged.append([i, j])

    def wanted(self, i: int, j: int) -> bool:
        """Pairs this run must merge: all of them for a build."""
        return True


def seed_for(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


def gnnd_pending(store: Store, ledger: Ledger, backend: Backend, reporter: Reporter, clock: PhaseClock) -> None:
    m = store.manifest
    todo = [s for s in ledger.shards() if ledger.version(s.id) is None]
    if not todo:
        return
    params = GnndParams(**m.params)
    metric = kernel_metric(m.metric)
    with reporter.phase("gnnd", sum(s.rows for s in todo), "rows") as advance:
        for shard in todo:
            t = time.perf_counter()
            x = store.read_vectors(shard.id)
            clock.add("read", time.perf_counter() - t)
            t = time.perf_counter()
            g = backend.gnnd(x, metric, params, seed=seed_for(m.seed, 0, shard.id))
            clock.add("gnnd", time.perf_counter() - t)
            t = time.perf_counter()
            ids = np.where(g.ids >= 0, g.ids.astype(np.int64) + shard.offset, -1).astype(ID_DTYPE)
            store.write_graph(shard.id, 1, KnnGraph(ids, g.dists))
            ledger.set_version(shard.id, 1)
            store.commit()
            clock.add("write", time.perf_counter() - t)
            advance(shard.rows)


def pairs_pending(ledger: Ledger) -> list[tuple[int, int]]:
    done = ledger.done()
    return [p for rnd in round_robin(len(ledger.shards())) for p in rnd if p not in done and ledger.wanted(*p)]


def merge_pending(store: Store, ledger: Ledger, backend: Backend, reporter: Reporter, clock: PhaseClock) -> None:
    m = store.manifest
    todo = pairs_pending(ledger)
    if not todo:
        return
    params = GnndParams(**m.params)
    metric = kernel_metric(m.metric)
    with reporter.phase("merge", len(todo), "pairs") as advance:
        for i, j in todo:
            t = time.perf_counter()
            a, b = (_load_part(store, ledger, s) for s in (i, j))
            clock.add("read", time.perf_counter() - t)
            t = time.perf_counter()
            ga, gb = backend.ggm(a, b, metric, params, seed=seed_for(m.seed, 1, i, j))
            clock.add("ggm", time.perf_counter() - t)
            t = time.perf_counter()
            for sid, g in ((i, ga), (j, gb)):
                version = ledger.version(sid) + 1
                store.write_graph(sid, version, g)
                ledger.set_version(sid, version)
            ledger.add_pair(i, j)
            store.commit()
            clock.add("write", time.perf_counter() - t)
            advance(1)


def _load_part(store: Store, ledger: Ledger, sid: int) -> ShardPart:
    shard = ledger.shards()[sid]
    return ShardPart(shard.offset, store.read_vectors(sid), store.read_graph(sid, ledger.version(sid)))


def record_timings(store: Store, clock: PhaseClock) -> None:
    for phase, s in clock.seconds.items():
        store.manifest.timings[phase] = round(store.manifest.timings.get(phase, 0.0) + s, 3)
    store.commit()
