"""``bigknn ingest``: fold new files into a finished store, crash-safe and idempotent.

Each new file becomes new shard(s) after the last existing id; each new shard gets GNND, then GGM against
every existing shard and every other new shard. All of it is staged in the manifest's ``pending``
section (new shards, staged graph versions, merged pairs) and committed step by step, so a killed ingest
resumes where it stopped; readers keep seeing the old graph until the final commit folds ``pending``
into the visible state at once. A file already ingested (same size and sha256) is skipped.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from bigknn.backends import Backend
from bigknn.errors import BadInput
from bigknn.formats import VECTOR_EXTENSIONS, VectorFile, check_finite, open_vectors
from bigknn.ggm import SEED_SHARDS, seeded_merge_fits
from bigknn.metrics import prepare_rows
from bigknn.params import GnndParams
from bigknn.pipeline.build import MAX_ROWS, fingerprint
from bigknn.pipeline.sharding import shard_sizes
from bigknn.pipeline.steps import Ledger, record_timings, run_pending
from bigknn.pipeline.workers import Accounting
from bigknn.progress import Reporter
from bigknn.shards import ShardEntry, Store, WriterLock


class IngestLedger(Ledger):
    """Records an ingest's progress in ``manifest.pending``; existing shards' visible versions stay put."""

    def __init__(self, store: Store):
        super().__init__(store)
        p = store.manifest.pending
        self.new = [s if isinstance(s, ShardEntry) else ShardEntry(**s) for s in p["shards"]]
        p["shards"] = self.new
        self.first_new = len(store.manifest.shards)

    @property
    def pending(self) -> dict:
        return self.store.manifest.pending

    def shards(self) -> list[ShardEntry]:
        return self.store.manifest.shards + self.new

    def version(self, sid: int) -> int | None:
        staged = self.pending["graphs"].get(str(sid))
        if staged is not None:
            return staged
        return self.store.manifest.shards[sid].graph if sid < self.first_new else None

    def set_version(self, sid: int, version: int) -> None:
        self.pending["graphs"][str(sid)] = version

    def done(self) -> set[tuple[int, int]]:
        return {(a, b) for a, b in self.pending["merged"]}

    def history(self) -> list:
        return self.pending["merged"]

    def add_pair(self, i: int, j: int) -> None:
        self.pending["merged"].append([i, j])

    def wanted(self, i: int, j: int) -> bool:
        return j >= self.first_new  # pairs among old shards were merged before

    def ordered(self, pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Old shards first, the largest first: a new shard's first merge (the paper's, the anchor of the
        seeded ones after it) should meet a full shard, not an earlier small batch."""
        rows = [s.rows for s in self.shards()]
        return sorted(pairs, key=lambda p: (p[0] >= self.first_new, -rows[p[0]]))

    def seed_shards(self, i: int, j: int, merged_with: list[int]) -> list[int]:
        """The merge of a new shard j into an old shard i, in an ingest small beside the store, is seeded
        through the old shards j was merged with last (its first merge has none: the paper's random fill)."""
        new_rows = sum(s.rows for s in self.new)
        if i >= self.first_new or j < self.first_new or not seeded_merge_fits(new_rows, self.store.manifest.rows):
            return []
        return [s for s in merged_with if s < self.first_new][-SEED_SHARDS:]

    def finish(self) -> None:
        """Fold the staged ingest into the visible state (the caller commits)."""
        m = self.store.manifest
        for sid, version in self.pending["graphs"].items():
            if int(sid) < self.first_new:
                m.shards[int(sid)].graph = version
        for shard in self.new:
            shard.graph = self.pending["graphs"][str(shard.id)]
        m.shards.extend(self.new)
        m.merged.extend(self.pending["merged"])
        m.inputs.extend(self.pending["inputs"])
        m.pending = None


def ingest(store_path: Path, inputs: list[Path], backends: list[Backend], reporter: Reporter,
           wait_s: float = 0.0, host_mem: int | None = None) -> dict:
    """Ingest ``inputs`` in order; returns what was ingested, skipped and the time per phase."""
    t0 = time.perf_counter()
    acct = Accounting()
    store = Store.open(store_path, pin=False)
    # every check runs before the lock is taken, so a refused input leaves the store untouched
    _check_finished(store)
    files = [open_vectors(p) for p in inputs]  # headers of every file first: fail fast
    for vf in files:
        _check_compatible(store, vf)
    fingerprints = []
    t = time.perf_counter()
    for vf in files:
        fp = _seen(store, vf) or fingerprint(vf)
        if not _already_ingested(store, fp):
            check_finite(vf)
        fingerprints.append(fp)
    acct.add("read", time.perf_counter() - t, sum(fp["size"] for fp in fingerprints))
    report = {"store": str(store_path), "ingested": [], "skipped": [], "rows_added": 0}
    with WriterLock(store_path, wait_s):
        store = Store.open(store_path, pin=False)  # re-read: another writer may have committed while we waited
        _check_finished(store)
        if store.manifest.pending:
            report["resumed"] = store.manifest.pending["inputs"][0]["path"]
            resume_pending(store, backends, reporter, acct, host_mem)
            report["ingested"].append(report["resumed"])
        for vf, fp in zip(files, fingerprints):
            if _already_ingested(store, fp):
                report["skipped"].append(fp["path"])
                reporter.note(f"{fp['path']}: already ingested (same size and sha256); skipped")
                continue
            _stage(store, vf, dict(fp), reporter, acct)
            report["rows_added"] += vf.rows
            resume_pending(store, backends, reporter, acct, host_mem)
            report["ingested"].append(fp["path"])
        record_timings(store, acct)
        store.close()
    report.update({"rows": store.manifest.rows, "shards": len(store.manifest.shards),
                   "wall_s": round(time.perf_counter() - t0, 3),
                   "phase_s": {p: round(s, 3) for p, s in acct.seconds.items()}, "phase_wall_s": acct.spans})
    return report


def drop_folder_files(folder: Path) -> list[Path]:
    """Input files in a drop folder, oldest first (files being written should arrive by rename)."""
    if not folder.is_dir():
        raise BadInput(folder, "no such directory")
    files = [p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in VECTOR_EXTENSIONS]
    return sorted(files, key=lambda p: (p.stat().st_mtime_ns, p.name))


def _check_compatible(store: Store, vf: VectorFile) -> None:
    m = store.manifest
    if vf.dim != m.dim:
        raise BadInput(vf.path, f"has dimension {vf.dim}; the store holds dimension {m.dim}")
    want = m.inputs[0].get("dtype") if m.inputs else None
    if want is not None and np.dtype(vf.read_dtype).str != want:
        raise BadInput(vf.path, f"holds {np.dtype(vf.read_dtype).name} values; the store was built from "
                                f"{np.dtype(want).name}")
    if m.rows + vf.rows > MAX_ROWS:
        raise BadInput(vf.path, f"would take the store past {MAX_ROWS} rows (int32 ids)")


def _check_finished(store: Store) -> None:
    m = store.manifest
    n = len(m.shards)
    if not n or any(s.graph is None for s in m.shards) or len(m.merged) != n * (n - 1) // 2:
        raise BadInput(store.path, "the store's build is not finished; run `bigknn merge` first")


def _seen(store: Store, vf: VectorFile) -> dict | None:
    """The recorded fingerprint of this very file (same path, size and mtime): no need to hash it again."""
    st = os.stat(vf.path)
    path = str(Path(vf.path).resolve())
    for rec in store.manifest.inputs:
        if rec.get("path") == path and rec.get("size") == st.st_size and rec.get("mtime_ns") == st.st_mtime_ns:
            return rec
    return None


def _already_ingested(store: Store, fp: dict) -> bool:
    return any(i.get("size") == fp["size"] and i.get("sha256") == fp["sha256"] for i in store.manifest.inputs)


def _stage(store: Store, vf: VectorFile, fp: dict, reporter: Reporter, acct: Accounting) -> None:
    """Write the new rows as new shards and commit them as a pending ingest (invisible to readers)."""
    m = store.manifest
    t = time.perf_counter()
    offset, first = m.rows, len(m.shards)
    fp["first_id"] = offset
    sizes = shard_sizes(vf.rows, m.shard_rows, GnndParams(**m.params).width())
    new, start = [], 0
    with reporter.phase("shard", vf.rows, "rows") as advance:
        for i, rows in enumerate(sizes):
            x = prepare_rows(vf.read(start, start + rows), m.metric)
            store.write_vectors(first + i, x.astype(np.dtype(m.dtype), copy=False))
            new.append(asdict(ShardEntry(id=first + i, offset=offset + start, rows=rows)))
            start += rows
            advance(rows)
    m.pending = {"inputs": [fp], "shards": new, "graphs": {}, "merged": []}
    store.commit()
    acct.add("shard", time.perf_counter() - t, nbytes_written=vf.rows * vf.dim * vf.dtype.itemsize)


def resume_pending(store: Store, backends: list[Backend], reporter: Reporter, acct: Accounting,
                   host_mem: int | None = None) -> None:
    """Run the staged ingest's remaining GNND and merges, then make it visible in one commit."""
    ledger = IngestLedger(store)
    run_pending(store, ledger, backends, reporter, acct, host_mem)
    ledger.finish()
    store.commit()
