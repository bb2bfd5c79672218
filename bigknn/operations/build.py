"""``bigknn build``: read -> shard -> GNND per shard -> GGM per pair -> commit.

Every step ends in a manifest commit, so a run killed at any moment resumes from the last commit:
sharding is redone if it was not committed, shards without a graph get GNND, pairs not in
``merged`` get GGM.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from bigknn.backends import Backend
from bigknn.core.errors import BadInput, free_bytes
from bigknn.core.human import human_bytes
from bigknn.core.hostmem import filled_once
from bigknn.formats import VectorSource, cast_note, open_source
from bigknn.core.metric import metric as metric_of
from bigknn.core.metric import stored_dtype
from bigknn.core.params import GnndParams
from bigknn.algorithms.partition.labelling import layout, learn_from_file, shard_count
from bigknn.algorithms.partition.learn import DEFAULT_METHOD, METHODS, Partition
from bigknn.engine.recall_sample import SampleTruth, record_estimate
from bigknn.engine.executor import Executor, InProcess
from bigknn.operations.plan_model import auto_shard_rows, automatic_shards, resolve_partition, store_bytes
from bigknn.engine.sharding_pass import shard_sizes, stream_shards
from bigknn.engine.limits import build_shards, k_refusal, smallest_shard_rows
from bigknn.engine.pending import cache_shards, check_merge_count, input_fits_host, record_timings, run_build_steps
from bigknn.engine.accounting import Accounting
from bigknn.core.progress import Reporter
from bigknn.shards import Manifest, Store, WriterLock
from bigknn.shards.manifest import PARTITIONED_SINCE, REFERENCED_SINCE
from bigknn.shards.referenced import MODES, refusal
from bigknn.shards.sections import PartitionSpec
from bigknn.shards.creation import NewStore


@dataclass
class BuildRequest:
    input: Path
    store: Path
    metric: str = "l2"
    shard_rows: int = 0  # 0: automatic (plan_model.auto_shard_rows)
    params: GnndParams = field(default_factory=GnndParams)
    seed: int = 0
    wait_s: float = 0.0
    host_mem: int | None = None
    partition: str = DEFAULT_METHOD  # bigknn/algorithms/partition/: auto, kmeans, rptree or contiguous
    column: str | None = None  # the vector column of Parquet/Arrow inputs (None: the only fixed-size list)
    id_column: str | None = None  # the column of the user's ids, kept in the store (bigknn/shards/user_ids.py)
    vectors: str = "copy"  # or "reference": shards read the input file's rows (bigknn/shards/referenced.py)


def build(req: BuildRequest, backends: list[Backend], reporter: Reporter, executor: Executor | None = None) -> dict:
    """Build (or resume building) the graph of ``req.input`` into ``req.store``; return a summary.
    ``backends``: this process's (labelling, the pair plan, the recall estimate); ``executor``: where the
    GNND and merge tasks run (default: on ``backends``, in this process).

    Every refusal of the input or the request comes before anything is written (the lock file included),
    except a bad row found while sharding: then a store this run created is taken back whole (``NewStore``).
    An interruption or a failure keeps the store, so that the same command resumes it."""
    acct = Accounting()
    executor = executor or InProcess(backends)
    vf = open_source(req.input, req.column, req.id_column)
    if (cast := cast_note(vf)) is not None:
        reporter.note(cast)
    resuming = Store.exists(req.store)
    if resuming and not req.shard_rows:  # automatic size: the store's, whatever this machine would pick
        req = replace(req, shard_rows=Store.open(req.store, pin=False).manifest.shard_rows)
    elif not req.shard_rows:
        fits = auto_shard_rows(backends, vf.dim, vf.read_dtype.itemsize, req.params, rows=vf.rows)
        rows, method = automatic_shards(vf.rows, fits, executor.workers(), req.params.width(), req.partition)
        req = replace(req, shard_rows=rows, partition=method)
    _check_request(req, vf)
    req = replace(req, partition=resolve_partition(req.partition, vf.rows, req.shard_rows, req.params.width()))
    sizes = shard_sizes(vf.rows, req.shard_rows, req.params.width())
    method = req.partition if len(sizes) > 1 else "contiguous"  # one shard: nothing to partition
    if not resuming:
        _note_disk(req, vf, method, reporter)
    manifest = Store.open(req.store).manifest if resuming else _new_manifest(req, vf, method)
    if resuming:  # refuse another build before the lock is taken: a refusal writes nothing, .lock included
        _check_same_build(manifest, req, vf, method)
    elif req.vectors == "reference":
        _check_referable(req, vf, method)
    planned = len(manifest.shards) or build_shards(vf.rows, req.shard_rows, req.params.width(), method)
    check_merge_count(req.store, planned, planned * (planned - 1) // 2,  # before any pass over the input
                      f"use --shard-rows {smallest_shard_rows(vf.rows, req.params.width(), method):,} or more",
                      reporter)
    part, rows_of, kept = None, None, None
    if manifest.shards:
        sizes = [s.rows for s in manifest.shards]
    elif method != "contiguous":  # learn the partition and label every row (bad rows refused here)
        t = time.perf_counter()
        with acct.span("partition"):
            nearest = backends[0].nearest_centroids
            part = learn_from_file(vf, method, shard_count(vf.rows, req.shard_rows, req.params.width()),
                                   req.metric, req.seed, nearest)
            dtype = stored_dtype(req.metric, vf.read_dtype)
            if input_fits_host(vf.rows * vf.dim * dtype.itemsize, req.host_mem):  # one read of the input
                kept = filled_once((vf.rows, vf.dim), dtype)
            with reporter.phase("label", vf.rows, "rows") as advance:
                rows_of = layout(vf, part, req.metric, req.shard_rows, req.params.width(), nearest, advance, kept)
        acct.add("partition", time.perf_counter() - t, vf.rows * vf.dim * vf.dtype.itemsize)
        sizes = [len(r) for r in rows_of]
    cache_shards(manifest, req.store, max(sizes), len(backends), req.host_mem)
    new_store = None if resuming else NewStore(req.store)  # refuses a path that is not new or empty
    with WriterLock(req.store, req.wait_s):
        if Store.exists(req.store):  # again, under the lock: another writer may have created it meanwhile
            store = Store.open(req.store, pin=False)
            _check_same_build(store.manifest, req, vf, method)
            new_store = None
        else:
            store = Store.create(req.store, manifest)
        try:
            incoming = None
            streaming = not store.manifest.shards  # shard, with GNND running on each shard as it is written
            sample = SampleTruth.draw(vf, store.manifest, req.seed,
                                      from_stream=streaming and part is None and sizes == [vf.rows]
                                      and not vf.random_access) if (
                req.params.recall > 0 and store.manifest.estimate is None) else None
            if sample is not None and rows_of is not None:
                sample.place(rows_of, store.manifest.rows)
            if streaming:
                if part is not None:
                    acct.add_written(_record_partition(store, part))
                shards = stream_shards(store, vf, sizes, acct, layout=rows_of, kept=kept,
                                       reference=store.manifest.inputs[0].get("vectors") == "reference")
                incoming = (shards if sample is None else sample.taken_from(shards), sizes)
                kept = None  # the sharding pass holds the rows while it needs them
            run_build_steps(store, backends, executor, reporter, acct, req.host_mem, incoming, sample)
            if sample is not None:
                est = record_estimate(store, backends[0], sample)
                if est["recall"] < est["target"]:  # the promise broken is said aloud, never only recorded
                    reporter.note(f"{req.store}: recall@{est['at']} estimate {est['recall']:.4f} [{est['low']:.4f}, "
                                  f"{est['high']:.4f}] on {est['rows']} held-out rows is below the target "
                                  f"{est['target']}")
            record_timings(store, acct)
            acct.add_written(store.meta_bytes)
            store.close()
        except BadInput:
            if new_store is not None:  # a row refused while sharding: no store is left behind
                store.close()
                new_store.undo()
            raise
    return summary(store, acct, time.perf_counter() - acct.t0, resumed=resuming, backends=backends)


# ---- checks ---------------------------------------------------------------------------------------
def _note_disk(req: BuildRequest, vf: VectorSource, method: str, reporter: Reporter) -> None:
    """Say before any work when the disk cannot hold the finished store (a build stops at a full disk, hours
    in, and resumes only once there is room): its size as the plan counts it (plan_model.store_bytes)."""
    itemsize = stored_dtype(req.metric, vf.read_dtype).itemsize
    need = store_bytes(vf.rows, vf.dim, itemsize, req.params.k, req.vectors, method != "contiguous")["total"]
    free = free_bytes(req.store)
    if need > free:
        reporter.note(f"{req.store}: the finished store needs {human_bytes(need)} and {human_bytes(free)} is free "
                      "there: the build stops when the disk is full (rerun it once there is room: it resumes)")


def _check_request(req: BuildRequest, vf: VectorSource) -> None:
    k = req.params.k
    if (why := k_refusal(k, vf.rows)) is not None:
        raise BadInput(req.input, why)
    if req.shard_rows <= k:
        raise BadInput(req.input, f"--shard-rows {req.shard_rows} must exceed k = {k}")
    if req.partition not in METHODS:
        raise BadInput(req.input, f"--partition {req.partition} is not one of {', '.join(METHODS)}")


def _check_referable(req: BuildRequest, vf: VectorSource, method: str) -> None:
    """Refuse (exit 2, before anything is written) --vectors reference where the shards cannot read their rows
    as one byte range each of the input as it is."""
    if req.vectors not in MODES:
        raise BadInput(req.input, f"--vectors {req.vectors} is not one of {', '.join(MODES)}")
    flat = getattr(vf, "data", None) is not None and vf.data.flags.c_contiguous  # a Fortran .npy is not
    why = refusal(Path(vf.path).suffix.lower(), metric_of(req.metric).normalised, method, flat)
    if why is not None:
        raise BadInput(req.input, why)


def fingerprint(vf: VectorSource, sha256: str | None) -> dict:
    """Path, size, mtime, sha256, rows and dtype of an input as it was opened (a dataset's size is its parts'
    total, its mtime their latest), and its vector and id columns where it has them."""
    rec = {"path": str(Path(vf.path).resolve()), "size": vf.state.size, "mtime_ns": vf.state.mtime_ns,
           "sha256": sha256, "rows": vf.rows, "dtype": np.dtype(vf.read_dtype).str, "first_id": 0}
    rec.update({key: value for key, value in (("column", vf.column), ("id_column", vf.id_column)) if value})
    return rec


def _check_same_build(m: Manifest, req: BuildRequest, vf: VectorSource, method: str) -> None:
    want = {"dim": vf.dim, "metric": req.metric, "k": req.params.k, "shard_rows": req.shard_rows,
            "params": req.params.to_manifest(), "seed": req.seed, "partition": method}
    have = {"dim": m.dim, "metric": m.metric, "k": m.k, "shard_rows": m.shard_rows, "params": m.params.to_manifest(),
            "seed": m.seed, "partition": m.partition_method}
    src = m.inputs[0] if m.inputs else {}
    want["vectors"], have["vectors"] = req.vectors, src.get("vectors", "copy")
    diff = [f"{key} {have[key]} (asked {want[key]})" for key in want if have[key] != want[key]]
    if src.get("id_column") != vf.id_column:
        diff.append(f"id column {src.get('id_column')} (asked {vf.id_column})")
    if src.get("path") != str(Path(vf.path).resolve()) or src.get("size") != vf.state.size:
        diff.insert(0, f"input {src.get('path')}")
    elif src.get("mtime_ns") != vf.state.mtime_ns and (src.get("sha256") is None or
                                                        vf.sha256() != src.get("sha256")):
        raise BadInput(vf.path, f"changed since {req.store} was built from it (sha256 differs); "
                                "build into a new store")
    if diff:
        raise BadInput(req.store, "holds another build (" + "; ".join(diff) +
                       "); use a new store path or remove this one")


# ---- steps ----------------------------------------------------------------------------------------
def _new_manifest(req: BuildRequest, vf: VectorSource, method: str) -> Manifest:
    m = Manifest(dim=vf.dim, dtype=stored_dtype(req.metric, vf.read_dtype).str, metric=req.metric,
                 k=req.params.k, shard_rows=req.shard_rows, params=req.params, seed=req.seed,
                 inputs=[fingerprint(vf, sha256=None)])  # the sharding pass records the sha256
    if req.vectors == "reference":
        m.format, m.inputs[0]["vectors"] = max(m.format, REFERENCED_SINCE), "reference"
    if method != "contiguous":  # the arrays come with the sharding pass's commit (_record_partition)
        m.format, m.partition = max(m.format, PARTITIONED_SINCE), PartitionSpec(method, [], 0)
    m.hold_ids_of(vf.rows)
    return m


def _record_partition(store: Store, part: Partition) -> int:
    """Write the learnt partition's arrays (returns their bytes); the sharding pass's commit makes them (and
    the shards) visible."""
    arrays = part.arrays()
    nbytes = sum(store.write_partition(name, data) for name, data in arrays.items())
    store.manifest.partition = PartitionSpec(part.method, sorted(arrays), part.shards)
    return nbytes


def summary(store: Store, acct: Accounting, wall: float, resumed: bool, backends: list[Backend]) -> dict:
    m = store.manifest
    n = len(m.shards)
    return {"store": str(store.path), "rows": m.rows, "dim": m.dim, "k": m.k, "metric": m.metric,
            "shards": n, "merges_done": len(m.merged), "merges_total": m.merges_total, "all_pairs": n * (n - 1) // 2,
            "partition": m.partition_method,
            "backend": backends[0].name, "workers": len(backends), "resumed": resumed, "wall_s": round(wall, 3),
            **acct.summary(),
            "read_gb": round(acct.bytes_read / 1e9, 3), "written_gb": round(acct.bytes_written / 1e9, 3),
            "written_bytes": acct.bytes_written, "read_bytes": acct.bytes_read,
            "busy_frac": {w: round(s / wall, 3) for w, s in acct.busy.items()} if wall > 0 else {},
            "recall_estimate": m.estimate}
