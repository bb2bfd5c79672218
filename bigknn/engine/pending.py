"""The compute steps every write path runs: GNND for shards without a graph, GGM for pending pairs.

Progress is recorded in a ``Ledger`` and committed after each shard and each pair, so a killed run
resumes from the last commit. A build records straight into the manifest's shard list; an ingest
records into the manifest's ``pending`` section, which readers ignore until the ingest's final commit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import numpy as np

from bigknn.backends import Backend
from bigknn.core.errors import BadInput
from bigknn.engine import pair_order as schedule
from bigknn.engine.recall_sample import SampleTruth
from bigknn.engine.limits import MERGES_PER_SHARD_NOTE, too_many_merges
from bigknn.engine.pair_plan import plan_pairs
from bigknn.engine.accounting import Accounting
from bigknn.core.progress import Reporter
from bigknn.shards import Manifest, ShardEntry, Store
from bigknn.shards.sections import PendingWrite

if TYPE_CHECKING:  # the executor runs what this module plans: it imports this one
    from bigknn.engine.executor import Executor

HOST_MEM_FRACTION = 0.5  # of the machine's RAM for cached shards when --host-mem is not given
KEPT_INPUT_SHARE = 0.5  # of that budget, the most a partitioned build's input may take in RAM (input_fits_host)


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
        merged = self.history()
        return tuple(merged[-1]) if merged else None

    def history(self) -> list:
        """The pairs committed so far, in commit order."""
        return self.store.manifest.merged

    def wanted(self, i: int, j: int) -> bool:
        """Pairs this run must merge: a build's planned pairs (every pair of a contiguous store; none of a
        partitioned one until its plan is committed)."""
        return self.store.manifest.planned(i, j)

    def ordered(self, pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The order in which pairs are preferred (round-robin rounds, for a build)."""
        return pairs

    def todo_pairs(self, shards: int) -> list[tuple[int, int]]:
        """Pairs of the first ``shards`` shards this run must merge and has not, in the ledger's order (the
        one place that turns the schedule into a run's work)."""
        return self.ordered([p for p in schedule.pending_pairs(shards, self.done()) if self.wanted(*p)])

    def seed_shards(self, i: int, j: int, merged_with: list[int]) -> list[int]:
        """The shards the merge of (i, j) is seeded through (bigknn/algorithms/merge_setup.py), given the shards j was merged
        with, in order; none: the paper's merge (a build's shards are all of one size)."""
        return []


class StagedLedger(Ledger):
    """Records the progress of a write that adds shards to a finished store (an ingest, a merge of stores) in
    ``manifest.pending``: the new shards, the staged graph versions of new and old shards, the merged pairs;
    the visible state stays put until ``finish``. Every pair with a new shard is wanted (pairs among the old
    shards were merged before)."""

    def __init__(self, store: Store):
        super().__init__(store)
        self.new = store.manifest.pending.shards
        self.first_new = len(store.manifest.shards)

    @property
    def pending(self) -> PendingWrite:
        return self.store.manifest.pending

    def shards(self) -> list[ShardEntry]:
        return self.store.manifest.shards + self.new

    def version(self, sid: int) -> int | None:
        staged = self.pending.graphs.get(sid)
        if staged is not None:
            return staged
        return self.store.manifest.shards[sid].graph if sid < self.first_new else None

    def set_version(self, sid: int, version: int) -> None:
        self.pending.graphs[sid] = version

    def done(self) -> set[tuple[int, int]]:
        return {(a, b) for a, b in self.pending.merged}

    def history(self) -> list:
        return self.pending.merged

    def add_pair(self, i: int, j: int) -> None:
        self.pending.merged.append([i, j])

    def wanted(self, i: int, j: int) -> bool:
        return j >= self.first_new

    def finish(self) -> None:
        """Fold the staged write into the visible state (the caller commits)."""
        m = self.store.manifest
        for sid, version in self.pending.graphs.items():
            if sid < self.first_new:
                m.shards[sid].graph = version
        for shard in self.new:
            shard.graph = self.pending.graphs[shard.id]
        m.shards.extend(self.new)
        m.merged.extend(self.pending.merged)
        if m.pairs is not None:  # a planned store's merges stay its plan plus what this write merged
            m.pairs.extend(self.pending.merged)
        m.inputs.extend(self.pending.inputs)
        m.pending = None


def must_write(m: Manifest, graph_rows: int, copied_rows: int) -> int:
    """Bytes a run must write: the final graphs (k wide) of ``graph_rows`` rows and the vectors of the
    ``copied_rows`` the store holds a copy of (rows it references in the input are not written)."""
    return copied_rows * m.dim * np.dtype(m.dtype).itemsize + graph_rows * m.k * (m.id_dtype.itemsize + 4)


def run_build_steps(store: Store, backends: list[Backend], executor: Executor, reporter: Reporter,
                    acct: Accounting, host_mem: int | None = None, incoming: tuple[Iterable, list[int]] | None = None,
                    sample: SampleTruth | None = None) -> None:
    """A build's compute (``executor.run_pending``), and for a partitioned store the plan step between its
    shards' GNND and its merges: the near pairs are chosen, on ``backends[0]``, once every shard has a graph
    (bigknn/engine/pair_plan.py)."""
    m = store.manifest
    plan = (lambda: plan_pairs(store, backends[0], sample, reporter)) if (
        m.partition is not None and m.pairs is None) else None
    executor.run_pending(store, Ledger(store), reporter, acct, host_mem, incoming, sample, plan)


def cache_shards(m: Manifest, where: Path, biggest: int, workers: int, host_mem: int | None = None) -> int:
    """Shards held in host RAM: as many as ``host_mem`` (default: half the machine's RAM) holds; at least
    two per worker plus two being prefetched. Refuses (exit 2) a ``host_mem`` below two shards per worker;
    the write paths call it before they write anything, so that the refusal leaves the store untouched."""
    per_shard = biggest * (m.dim * np.dtype(m.dtype).itemsize + m.params.width() * 8)
    fits = cache_parts(per_shard, workers, host_mem)
    if host_mem is not None and fits < 2 * workers:
        raise BadInput(where, f"--host-mem {host_mem >> 20} MiB holds {fits} shard(s) of {per_shard >> 20} MiB; "
                              f"{workers} worker(s) need {2 * workers}: use a smaller --shard-rows")
    return fits


def input_fits_host(nbytes: int, host_mem: int | None) -> bool:
    """Whether a partitioned build holds its whole input (``nbytes`` as stored) in host RAM from the labelling
    pass to the sharding pass, which then gathers its shards from RAM instead of reading the file again: at
    most KEPT_INPUT_SHARE of the host budget (``host_mem``, else HOST_MEM_FRACTION of the machine's RAM), the
    rest left to the shard cache."""
    budget = host_mem if host_mem is not None else int(physical_memory() * HOST_MEM_FRACTION)
    return nbytes <= budget * KEPT_INPUT_SHARE


def cache_parts(per_shard: int, workers: int, host_mem: int | None = None) -> int:
    """Shards of ``per_shard`` bytes the host cache holds: as many as ``host_mem`` holds, or without it half
    the machine's RAM, and at least two per worker plus two being prefetched."""
    if host_mem is not None:
        return host_mem // per_shard
    return max(2 * workers + 2, int(physical_memory() * HOST_MEM_FRACTION) // per_shard)


def check_merge_count(where: Path, shards: int, merges: int, advice: str, reporter: Reporter) -> None:
    """Refuse (exit 2, no prompt) a run of more than MAX_MERGES merges, which cannot finish in useful time
    (a tiny --shard-rows: the merges grow with the square of the shard count); note a run whose merges
    exceed MERGES_PER_SHARD_NOTE per shard, where a larger --shard-rows would finish sooner."""
    if (refusal := too_many_merges(shards, merges)) is not None:
        raise BadInput(where, f"{refusal}; {advice}")
    if merges > MERGES_PER_SHARD_NOTE * shards:
        reporter.note(f"{where}: {shards:,} shards need {merges:,} merges (they grow with the square of the "
                      "shard count); a larger --shard-rows finishes sooner")


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def record_timings(store: Store, acct: Accounting) -> None:
    """Add this run's compute seconds to the manifest (the rates `bigknn plan` reads); a run that
    computed nothing commits nothing."""
    if not any(p in acct.seconds for p in ("shard", "gnnd", "ggm")):
        return
    for phase, s in acct.seconds.items():
        store.manifest.timings[phase] = round(store.manifest.timings.get(phase, 0.0) + s, 3)
    store.commit()
