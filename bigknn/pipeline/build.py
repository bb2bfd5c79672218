"""``bigknn build``: read -> shard -> GNND per shard -> GGM per pair -> commit.

Every step ends in a manifest commit, so a run killed at any moment resumes from the last commit:
sharding is redone if it was not committed, shards without a graph get GNND, pairs not in
``merged`` get GGM.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from bigknn.backends import Backend
from bigknn.errors import BadInput
from bigknn.formats import VectorFile, open_vectors
from bigknn.graph import ID_DTYPE
from bigknn.metrics import stored_dtype
from bigknn.params import GnndParams
from bigknn.pipeline.plan import auto_shard_rows
from bigknn.pipeline.sharding import sha256_of, shard_sizes, stream_shards
from bigknn.pipeline.steps import Ledger, record_timings, run_pending
from bigknn.pipeline.workers import Accounting
from bigknn.progress import Reporter
from bigknn.shards import Manifest, Store, WriterLock

MAX_ROWS = np.iinfo(ID_DTYPE).max  # ids are int32


@dataclass
class BuildRequest:
    input: Path
    store: Path
    metric: str = "l2"
    shard_rows: int = 0  # 0: automatic (pipeline.plan.auto_shard_rows)
    params: GnndParams = field(default_factory=GnndParams)
    seed: int = 0
    wait_s: float = 0.0
    host_mem: int | None = None


def build(req: BuildRequest, backends: list[Backend], reporter: Reporter) -> dict:
    """Build (or resume building) the graph of ``req.input`` into ``req.store``; return a summary."""
    acct = Accounting()
    vf = open_vectors(req.input)
    resuming = Store.exists(req.store)
    if resuming and not req.shard_rows:  # automatic size: the store's, whatever this machine would pick
        req = replace(req, shard_rows=Store.open(req.store, pin=False).manifest.shard_rows)
    elif not req.shard_rows:
        req = replace(req, shard_rows=auto_shard_rows(backends, vf.dim, vf.read_dtype.itemsize, req.params))
    _check_request(req, vf)
    if resuming:  # refuse another build before the lock is taken: a refusal writes nothing, .lock included
        _check_same_build(Store.open(req.store, pin=False).manifest, req, vf)
    created_here = False
    try:
        with WriterLock(req.store, req.wait_s):
            if Store.exists(req.store):  # again, under the lock: another writer may have created it meanwhile
                store = Store.open(req.store, pin=False)
                _check_same_build(store.manifest, req, vf)
            else:
                store = _create_store(req, vf)
                created_here = True
            incoming = None
            if not store.manifest.shards:  # shard, with GNND running on each shard as it is written
                sizes = shard_sizes(vf.rows, store.manifest.shard_rows, req.params.width())
                incoming = (stream_shards(store, vf, sizes, acct), sizes)
            run_pending(store, Ledger(store), backends, reporter, acct, req.host_mem, incoming)
            record_timings(store, acct)
            store.close()
    except BadInput:
        if created_here:  # a refused input (NaN/Inf found while sharding) leaves no store behind
            shutil.rmtree(req.store, ignore_errors=True)
        raise
    return summary(store, acct, time.perf_counter() - acct.t0, resumed=resuming, backends=backends)


# ---- checks ---------------------------------------------------------------------------------------
def _check_request(req: BuildRequest, vf: VectorFile) -> None:
    k = req.params.k
    if k < 1:
        raise BadInput(req.input, f"k must be at least 1, got {k}")
    if k >= vf.rows:
        raise BadInput(req.input, f"k = {k} needs more than {k} rows; the file has {vf.rows}")
    if vf.rows > MAX_ROWS:
        raise BadInput(req.input, f"{vf.rows} rows exceed the {MAX_ROWS} that int32 ids can address")
    if req.shard_rows <= k:
        raise BadInput(req.input, f"--shard-rows {req.shard_rows} must exceed k = {k}")


def fingerprint(vf: VectorFile, with_sha256: bool = True) -> dict:
    """Path, size, mtime, sha256, rows and dtype of an input file (one streaming pass for the hash)."""
    st = os.stat(vf.path)
    return {"path": str(Path(vf.path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "sha256": sha256_of(vf.path) if with_sha256 else None, "rows": vf.rows,
            "dtype": np.dtype(vf.read_dtype).str, "first_id": 0}


def _check_same_build(m: Manifest, req: BuildRequest, vf: VectorFile) -> None:
    want = {"dim": vf.dim, "metric": req.metric, "k": req.params.k, "shard_rows": req.shard_rows,
            "params": req.params.to_dict(), "seed": req.seed}
    have = {"dim": m.dim, "metric": m.metric, "k": m.k, "shard_rows": m.shard_rows, "params": m.params,
            "seed": m.seed}
    diff = [f"{key} {have[key]} (asked {want[key]})" for key in want if have[key] != want[key]]
    src = m.inputs[0] if m.inputs else {}
    st = os.stat(vf.path)
    if src.get("path") != str(Path(vf.path).resolve()) or src.get("size") != st.st_size:
        diff.insert(0, f"input {src.get('path')}")
    elif src.get("mtime_ns") != st.st_mtime_ns and (src.get("sha256") is None or
                                                     sha256_of(vf.path) != src.get("sha256")):
        raise BadInput(vf.path, f"changed since {req.store} was built from it (sha256 differs); "
                                "build into a new store")
    if diff:
        raise BadInput(req.store, "holds another build (" + "; ".join(diff) +
                       "); use a new store path or remove this one")


# ---- steps ----------------------------------------------------------------------------------------
def _create_store(req: BuildRequest, vf: VectorFile) -> Store:
    manifest = Manifest(dim=vf.dim, dtype=stored_dtype(req.metric, vf.read_dtype).str, metric=req.metric,
                        k=req.params.k, shard_rows=req.shard_rows, params=req.params.to_dict(),
                        seed=req.seed, inputs=[fingerprint(vf, with_sha256=False)])
    return Store.create(req.store, manifest)


def summary(store: Store, acct: Accounting, wall: float, resumed: bool, backends: list[Backend]) -> dict:
    m = store.manifest
    n = len(m.shards)
    return {"store": str(store.path), "rows": m.rows, "dim": m.dim, "k": m.k, "metric": m.metric,
            "shards": n, "merges_done": len(m.merged), "merges_total": n * (n - 1) // 2,
            "backend": backends[0].name, "workers": len(backends), "resumed": resumed, "wall_s": round(wall, 3),
            "phase_s": {p: round(s, 3) for p, s in acct.seconds.items()}, "phase_wall_s": acct.spans,
            "read_gb": round(acct.bytes_read / 1e9, 3), "written_gb": round(acct.bytes_written / 1e9, 3),
            "busy_frac": {w: round(s / wall, 3) for w, s in acct.busy.items()} if wall > 0 else {}}
