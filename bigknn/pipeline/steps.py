"""The compute steps every write path runs: GNND for shards without a graph, GGM for pending pairs.

Progress is recorded in a ``Ledger`` and committed after each shard and each pair, so a killed run
resumes from the last commit. A build records straight into the manifest's shard list; an ingest
records into the manifest's ``pending`` section, which readers ignore until the ingest's final commit.
"""

from __future__ import annotations

import numpy as np

from bigknn.backends import Backend
from bigknn.errors import BadInput
from bigknn.params import GnndParams
from bigknn.pipeline.workers import Accounting, pending_pairs, run_gnnd, run_merges
from bigknn.progress import Reporter
from bigknn.shards import ShardEntry, Store


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

    def last_pair(self) -> tuple[int, int] | None:
        """The pair committed last: a resumed run prefers the same next pair as the killed one would."""
        merged = self.store.manifest.merged
        return tuple(merged[-1]) if merged else None

    def wanted(self, i: int, j: int) -> bool:
        """Pairs this run must merge: all of them for a build."""
        return True


def run_pending(store: Store, ledger: Ledger, backends: list[Backend], reporter: Reporter, acct: Accounting,
                host_mem: int | None = None) -> None:
    """GNND for every shard without a graph, then GGM for every pending pair."""
    run_gnnd(store, ledger, backends, reporter, acct)
    run_merges(store, ledger, pending_pairs(ledger), backends, reporter, acct,
               cache_shards(store, len(backends), host_mem))


def cache_shards(store: Store, workers: int, host_mem: int | None) -> int:
    """Shards held in host RAM: two per worker plus two being prefetched, or as many as ``host_mem`` holds."""
    need = 2 * workers
    if host_mem is None:
        return need + 2
    m = store.manifest
    width = GnndParams(**m.params).width()
    biggest = max(s.rows for s in m.shards + [ShardEntry(**s) if isinstance(s, dict) else s
                                              for s in (m.pending or {}).get("shards", [])])
    per_shard = biggest * (m.dim * np.dtype(m.dtype).itemsize + width * 8)
    fits = host_mem // per_shard
    if fits < need:
        raise BadInput(store.path, f"--host-mem {host_mem >> 20} MiB holds {fits} shard(s) of {per_shard >> 20} MiB; "
                                   f"{workers} worker(s) need {need}: use a smaller --shard-rows")
    return fits


def record_timings(store: Store, acct: Accounting) -> None:
    """Add this run's compute seconds to the manifest (the rates `bigknn plan` reads); a run that
    computed nothing commits nothing."""
    if not any(p in acct.seconds for p in ("shard", "gnnd", "ggm")):
        return
    for phase, s in acct.seconds.items():
        store.manifest.timings[phase] = round(store.manifest.timings.get(phase, 0.0) + s, 3)
    store.commit()
