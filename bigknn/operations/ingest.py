"""``bigknn ingest``: fold new files into a finished store, crash-safe and idempotent.

A small file (at most a quarter of ``shard_rows`` rows, into a contiguous store) joins the graph by searching it
and goes to the store's tail shard, in one commit (bigknn/operations/ingest_join.py says what that reads and
writes). Small shards an older bigknn left at the end of the store are regrouped first (pipeline/compact.py). A larger file becomes new shard(s) after the last existing id; each new shard gets GNND, then GGM against
every existing shard and every other new shard. All of it is staged in the manifest's ``pending``
section (new shards, staged graph versions, merged pairs) and committed step by step, so a killed ingest
resumes where it stopped; readers keep seeing the old graph until the final commit folds ``pending``
into the visible state at once. A file already ingested (same size and sha256) is skipped. Each file is
opened once and what is hashed is what is ingested: a file that changes during the run is refused.
"""

from __future__ import annotations

import time
from contextlib import suppress
from pathlib import Path

import numpy as np

from bigknn.backends import Backend
from bigknn.core.errors import BadInput, StoreBusy
from bigknn.formats import INPUT_EXTENSIONS, FileState, VectorSource, cast_note, file_state, open_source
from bigknn.algorithms.merge_setup import SEED_SHARDS, seeded_merge_fits
from bigknn.core.knn_graph import id_dtype
from bigknn.core.metric import prepare_rows
from bigknn.core.params import GnndParams
from bigknn.algorithms.partition import load as load_partition
from bigknn.algorithms.partition.labelling import LABEL_CHUNK_ROWS
from bigknn.algorithms.partition.pairs import near_shards
from bigknn.operations import merge_stores
from bigknn.operations.build import fingerprint
from bigknn.operations.merge_checks import staged
from bigknn.operations.compact import regroup_small_shards
from bigknn.operations.ingest_join import Declined, join_batch, joins
from bigknn.engine.sharding_pass import shard_sizes
from bigknn.engine.executor import Executor, InProcess
from bigknn.engine.pending import StagedLedger, cache_shards, check_merge_count, record_timings
from bigknn.engine.accounting import Accounting
from bigknn.core.progress import Reporter
from bigknn.shards import ShardEntry, Store, WriterLock
from bigknn.shards import user_ids
from bigknn.shards.sections import PendingWrite


class IngestLedger(StagedLedger):
    """Records an ingest's progress in ``manifest.pending``; existing shards' visible versions stay put."""

    def wanted(self, i: int, j: int) -> bool:
        """Pairs with a new shard (pairs among old shards were merged before); in a partitioned store only
        the old shards near the batch (``pending.near``, chosen before the first merge) and every shard an
        earlier ingest added."""
        near = self.pending.near
        if near is None or i >= self.first_new:
            return j >= self.first_new
        return j >= self.first_new and (i in near or i >= self.store.manifest.partition.shards)

    def ordered(self, pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Old shards first, the largest first: a new shard's first merge (the paper's, the anchor of the
        seeded ones after it) should meet a full shard, not an earlier small batch."""
        rows = [s.rows for s in self.shards()]
        return sorted(pairs, key=lambda p: (p[0] >= self.first_new, -rows[p[0]]))

    def seed_shards(self, i: int, j: int, merged_with: list[int]) -> list[int]:
        """The merge of a new shard j into an old shard i, in an ingest small beside the store, is seeded
        through the old shards j was merged with last (its first merge has none: the paper's random fill).

        Never in a partitioned store: there a new row's neighbours in the shards merged before lie in other
        regions, so seeds through them land in the wrong clusters of shard i, whose graph does not lead
        across clusters; the paper's random fill reaches every cluster (new-row recall 0.945 seeded, 0.990
        random, on a k-means store: docs/design.md)."""
        new_rows = sum(s.rows for s in self.new)
        if (i >= self.first_new or j < self.first_new or self.store.manifest.partition is not None
                or not seeded_merge_fits(new_rows, self.store.manifest.rows)):
            return []
        return [s for s in merged_with if s < self.first_new][-SEED_SHARDS:]


def ingest(store_path: Path, inputs: list[Path], backends: list[Backend], reporter: Reporter,
           wait_s: float = 0.0, host_mem: int | None = None, listed: dict[Path, FileState] | None = None,
           column: str | None = None, executor: Executor | None = None) -> dict:
    """Ingest ``inputs`` in order; returns what was ingested, skipped and the time per phase.

    Each file is opened once; its rows are checked and its bytes hashed in one pass over that opening, and
    the same opening is ingested. A file that changes meanwhile is refused (exit 2) before its rows are
    committed. ``listed``: the files of a drop folder as listed (``--watch-dir``); there a file that changed
    since the listing or changes during the run is still being written: it is skipped with a note, and the
    next run takes it. ``column``: the vector column of Parquet/Arrow inputs (default: the only fixed-size list
    column); a store that keeps user ids takes them from each input's column of the name it was built with.
    ``executor``: where the GNND and merge tasks run (default: on ``backends``, in this process)."""
    t0 = time.perf_counter()
    acct = Accounting()
    executor = executor or InProcess(backends)
    store = _finished_store(store_path, wait_s)
    report = {"store": str(store_path), "ingested": [], "skipped": [], "still_being_written": [], "rows_added": 0,
              "joined": []}
    # every check runs before the lock is taken, so a refused input or request leaves the store untouched
    store.manifest.require_complete(store.path)
    id_column = store.manifest.inputs[0].get("id_column") if store.manifest.inputs else None
    files = [vf for p in inputs if (vf := _open_input(p, listed, report, reporter, column, id_column)) is not None]
    for vf in files:  # headers of every file first: fail fast
        _check_compatible(store, vf)
    unseen = [vf for vf in files if _seen(store, vf) is None]
    _check_id_room(store, unseen)
    _check_resources(store, unseen, len(backends), host_mem, reporter)
    checked = []
    t = time.perf_counter()
    for vf in files:
        fp = _seen(store, vf) or fingerprint(vf, vf.check_and_hash())
        if _unchanged(vf, listed is not None, report, reporter):
            checked.append((vf, fp))
    acct.add("read", time.perf_counter() - t, sum(vf.state.size for vf, _ in checked))
    with WriterLock(store_path, wait_s):
        store = Store.open(store_path, pin=False)  # re-read: another writer may have committed while we waited
        store.manifest.require_complete(store.path)
        if store.manifest.pending:
            report["resumed"] = store.manifest.pending.inputs[0]["path"]
            resume_pending(store, executor, reporter, acct, host_mem)
            report["ingested"].append(report["resumed"])
        for vf, fp in checked:
            if _already_ingested(store, fp):
                report["skipped"].append(fp["path"])
                reporter.note(f"{fp['path']}: already ingested (same size and sha256); skipped")
                continue
            if "regrouped" not in report:  # an older store's small shards, before the first new batch
                report["regrouped"] = regroup_small_shards(store, reporter)
            route = _join(store, vf, dict(fp), backends[0], listed is not None, report, reporter, acct) \
                if joins(store.manifest, vf.rows) else "shards"
            if route == "changed":
                continue
            if route != "joined":  # the next join into the store is checked again (ingest_join._check_due)
                staged = dict(fp, join_declined=True) if route == "declined" else dict(fp)
                if not _stage(store, vf, staged, listed is not None, report, reporter, acct):
                    continue
                resume_pending(store, executor, reporter, acct, host_mem)
            report["rows_added"] += vf.rows
            report["ingested"].append(fp["path"])
        record_timings(store, acct)
        store.close()
    _say_if_short(store, acct, store.manifest.rows - report["rows_added"], reporter)
    report.update({"rows": store.manifest.rows, "shards": len(store.manifest.shards),
                   "wall_s": round(time.perf_counter() - t0, 3), **acct.summary()})
    return report


def _say_if_short(store: Store, acct: Accounting, first_new: int, reporter: Reporter) -> None:
    """A GNND or merge of this run that ended below the store's recall target is said aloud, with the command
    that measures the rows it added (a merge's probe is mostly the batch's rows: the new rows fall short)."""
    target = store.manifest.params.recall
    short = acct.short_of(target) if target > 0 else []
    if short:
        est, rows = short[0]["estimate"], store.manifest.rows
        reporter.note(f"{store.path}: {len(short)} of this ingest's descents ended below the recall target "
                      f"{target}, the lowest (a {short[0]['phase']}) at estimate {est['recall']:.4f} "
                      f"[{est['low']:.4f}, {est['high']:.4f}] ({short[0]['stop']}); `bigknn eval recall "
                      f"{store.path} --rows {first_new}:{rows}` measures the rows it added")


def _finished_store(store_path: Path, wait_s: float) -> Store:
    """The store, opened to read its manifest. An unfinished one may be a build or merge still running: then
    the answer is that it runs (StoreBusy), or, with ``wait_s``, the store once it ended; only a store no
    writer holds is refused as unfinished (run ``bigknn merge``)."""
    store = Store.open(store_path, pin=False)
    if store.manifest.complete:
        return store
    try:
        with WriterLock(store_path, wait_s):
            return Store.open(store_path, pin=False)
    except StoreBusy as e:
        raise StoreBusy(f"{e}; the store is not finished: a build or merge is running on it "
                        "(ingest once it ends)") from None


def drop_folder_files(folder: Path) -> dict[Path, FileState]:
    """Input files in a drop folder as listed now, oldest first. Hidden names are skipped: they are how
    copying tools and bigknn's own writers name files still being written (``.name.XXXX``); files should
    arrive by rename."""
    if not folder.is_dir():
        raise BadInput(folder, "no such directory")
    listed = {}
    for p in folder.iterdir():
        if not p.name.startswith(".") and p.suffix.lower() in INPUT_EXTENSIONS and p.is_file():
            with suppress(FileNotFoundError):  # renamed away since the listing
                listed[p] = FileState.of(p.stat())
    return dict(sorted(listed.items(), key=lambda item: (item[1].mtime_ns, item[0].name)))


def _open_input(path: Path, listed: dict[Path, FileState] | None, report: dict, reporter: Reporter,
                column: str | None, id_column: str | None) -> VectorSource | None:
    """The opened input, or None for a drop-folder file that changed since it was listed (still being
    written: a header that does not match the size yet is no reason to refuse the whole run)."""
    if listed is None:
        vf = open_source(path, column, id_column)
        if (cast := cast_note(vf)) is not None:
            reporter.note(cast)
        return vf
    try:
        vf = open_source(path, column, id_column)
    except BadInput:
        change = listed[path].change_to(file_state(path))
        if change is None:
            raise
        _skip_growing(path, f"{change} since the drop folder was listed", report, reporter)
        return None
    if (change := listed[path].change_to(vf.state)) is not None:
        _skip_growing(path, f"{change} since the drop folder was listed", report, reporter)
        return None
    return vf


def _unchanged(vf: VectorSource, watching: bool, report: dict, reporter: Reporter) -> bool:
    """Whether the file is still the one opened; a changed one is refused, or skipped in a drop folder."""
    if not watching:
        vf.check_unchanged()
    elif (change := vf.changed()) is not None:
        _skip_growing(Path(vf.path), f"{change} while it was being read", report, reporter)
        return False
    return True


def _skip_growing(path: Path, change: str, report: dict, reporter: Reporter) -> None:
    report["still_being_written"].append(str(path))
    reporter.note(f"{path}: {change}: still being written; skipped (the next run takes it)")


def _check_resources(store: Store, new: list[VectorSource], workers: int, host_mem: int | None,
                     reporter: Reporter) -> None:
    """Refuse, before anything is written, an ingest whose shards do not fit ``host_mem`` or whose merges
    cannot finish (the new files' shards against every shard, a pending ingest's included)."""
    m = store.manifest
    width = m.params.width()
    pending = m.pending.shards if m.pending else []
    sizes = [s.rows for s in m.shards] + [s.rows for s in pending]
    shards, merges = len(sizes), len(pending) * len(m.shards) + len(pending) * (len(pending) - 1) // 2
    merges -= len(m.pending.merged) if m.pending else 0
    for vf in new:
        if joins(m, vf.rows):  # joins the graph: no shard of its own, no merge (bigknn/operations/ingest_join.py)
            continue
        new_sizes = shard_sizes(vf.rows, m.shard_rows, width)
        merges += len(new_sizes) * shards + len(new_sizes) * (len(new_sizes) - 1) // 2
        shards += len(new_sizes)
        sizes += new_sizes
    cache_shards(m, store.path, max(sizes), workers, host_mem)
    check_merge_count(store.path, shards, merges, "ingest smaller files, or rebuild with a larger --shard-rows",
                      reporter)


def _check_compatible(store: Store, vf: VectorSource) -> None:
    m = store.manifest
    if vf.dim != m.dim:
        raise BadInput(vf.path, f"has dimension {vf.dim}; the store holds dimension {m.dim}")
    want = m.inputs[0].get("dtype") if m.inputs else None
    if want is not None and np.dtype(vf.read_dtype).str != want:
        raise BadInput(vf.path, f"holds {np.dtype(vf.read_dtype).name} values; the store was built from "
                                f"{np.dtype(want).name}")


def _check_id_room(store: Store, new: list[VectorSource]) -> None:
    """A format-1 store (no checksums) cannot take ids past int32: int64 ids make a store format 5, whose
    readers take an array without checksums for damage."""
    m, rows = store.manifest, store.manifest.rows
    for vf in new:
        rows += vf.rows
        if not m.checksummed and id_dtype(rows).itemsize > m.id_dtype.itemsize:
            raise BadInput(vf.path, f"would take the store to {rows:,} rows, past int32 ids, which format-1 stores "
                                    f"(no checksums) cannot hold: rebuild the store with this bigknn first")


def _seen(store: Store, vf: VectorSource) -> dict | None:
    """The recorded fingerprint of this very file (same path, size and mtime): no need to hash it again."""
    path = str(Path(vf.path).resolve())
    for rec in store.manifest.inputs:
        if (rec.get("path"), rec.get("size"), rec.get("mtime_ns")) == (path, vf.state.size, vf.state.mtime_ns):
            return rec
    return None


def _already_ingested(store: Store, fp: dict) -> bool:
    return any(i.get("size") == fp["size"] and i.get("sha256") == fp["sha256"] for i in store.manifest.inputs)


def _stage(store: Store, vf: VectorSource, fp: dict, watching: bool, report: dict, reporter: Reporter,
           acct: Accounting) -> bool:
    """Write the new rows as new shards and commit them as a pending ingest (invisible to readers). The
    commit comes only if the file is still the one checked and hashed; otherwise the new shards' arrays are
    removed and the file refused, or skipped (False) in a drop folder."""
    m = store.manifest
    t = time.perf_counter()
    offset, first = m.rows, len(m.shards)
    fp["first_id"] = offset
    sizes = shard_sizes(vf.rows, m.shard_rows, m.params.width())
    new, start = [], 0
    with reporter.phase("shard", vf.rows, "rows") as advance:
        for i, rows in enumerate(sizes):
            x = prepare_rows(vf.read(start, start + rows), m.metric)
            store.write_vectors(first + i, x.astype(np.dtype(m.dtype), copy=False))
            new.append(ShardEntry(id=first + i, offset=offset + start, rows=rows))
            start += rows
            advance(rows)
    new_ids = range(first, first + len(sizes))
    try:
        if vf.id_column is not None:
            _stage_user_ids(store, vf, offset)
        unchanged = _unchanged(vf, watching, report, reporter)
    except BadInput:
        _take_back(store, new_ids, offset)
        raise
    if not unchanged:
        _take_back(store, new_ids, offset)
        return False
    m.pending = PendingWrite([fp], new, near=_near(store, vf))
    m.hold_ids_of(offset + vf.rows)  # past 2^31 rows: this ingest writes every graph it touches with int64 ids
    store.commit()
    acct.add("shard", time.perf_counter() - t, nbytes_written=vf.rows * vf.dim * vf.dtype.itemsize)
    return True


def _join(store: Store, vf: VectorSource, fp: dict, backend: Backend, watching: bool, report: dict,
          reporter: Reporter, acct: Accounting) -> str:
    """Join a small batch to the graph in one commit (bigknn/operations/ingest_join.py): "joined"; "changed",
    writing nothing, for a drop-folder file that changed while it was read; "declined", writing nothing, where
    the join fell short of the store's recall target (the batch then becomes new shards). Its counts go to
    ``report["joined"]``."""
    offset = store.manifest.rows
    fp["first_id"] = offset
    try:
        if vf.id_column is not None:
            _stage_user_ids(store, vf, offset)
        cost = join_batch(store, vf, fp, backend, reporter, acct,
                          lambda: _unchanged(vf, watching, report, reporter))
    except BadInput:
        user_ids.remove_part(store.path, offset)
        raise
    if cost is None:
        user_ids.remove_part(store.path, offset)
        return "changed"
    if isinstance(cost, Declined):
        user_ids.remove_part(store.path, offset)
        report["joined"].append({"path": fp["path"], "rows": vf.rows, "declined": True, **cost.to_dict()})
        reporter.note(f"{fp['path']}: the join fell short of the recall target at every effort; "
                      "ingesting it as new shards instead")
        return "declined"
    report["joined"].append({"path": fp["path"], "rows": vf.rows, **cost})
    return "joined"


def _stage_user_ids(store: Store, vf: VectorSource, offset: int) -> None:
    """Write the new rows' user ids after the store's, refusing ids of another type than the store keeps."""
    have = user_ids.stored_kind(store.path, offset)
    kind, _ = user_ids.write_part(store.path, offset, vf.path, vf.user_ids())
    if have is not None and have != kind:
        raise BadInput(vf.path, f"holds {kind} ids in {vf.id_column!r}; the store keeps {have} ids")


def _take_back(store: Store, new_ids: range, offset: int) -> None:
    """Remove what a refused or skipped input wrote: its uncommitted shards and user ids."""
    store.remove_uncommitted_shards(new_ids)
    user_ids.remove_part(store.path, offset)


def _near(store: Store, vf: VectorSource) -> list[int] | None:
    """The build shards near a new batch in a partitioned store (bigknn/algorithms/partition/pairs.py near_shards): a cold
    ingest reads those, not the whole store. None: a contiguous store, whose every shard is merged."""
    m = store.manifest
    if m.partition is None or m.pairs is None:
        return None
    part = load_partition(store)
    primary = np.zeros(part.shards, np.int64)
    for _, block in vf.chunks(LABEL_CHUNK_ROWS):
        primary += np.bincount(part.cost(prepare_rows(block, m.metric)).argmin(axis=1), minlength=part.shards)
    built = [p for p in m.pairs if max(p) < m.partition.shards]
    return near_shards(primary, built, m.params.recall or GnndParams().recall)


def resume_pending(store: Store, executor: Executor, reporter: Reporter, acct: Accounting,
                   host_mem: int | None = None) -> None:
    """Run the staged ingest's remaining GNND and merges, then make it visible in one commit."""
    if staged(store.manifest.pending):  # a merge of stores was interrupted, not an ingest
        merge_stores.resume(store, executor, reporter, acct, host_mem)
        return
    ledger = IngestLedger(store)
    executor.run_pending(store, ledger, reporter, acct, host_mem)
    ledger.finish()
    store.commit()
