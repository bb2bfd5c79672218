"""A build of an array that fits one shard, in memory: the same GNND call and recall sample a one-shard store
build runs (bigknn/engine/workers.py ``gnnd``, bigknn/engine/recall_sample.py), without the array's spill to
a ``.npy``, the sharding pass into a store and the graph's write. The sharding pass and the write are most of
what ``bigknn.build(array)`` spent beyond the kernel; the store is made only when asked for
(``InMemoryGraph.save``, or a method that needs one).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from bigknn.operations.input_arrays import ARRAY, kept_dtype
from bigknn.backends import Backend
from bigknn.core.errors import BadInput
from bigknn.formats.read import check_rows
from bigknn.formats.source import open_source, read_rows
from bigknn.core.knn_graph import id_dtype
from bigknn.core.metric import metric as metric_of
from bigknn.core.params import GnndParams
from bigknn.algorithms.partition.learn import DEFAULT_METHOD
from bigknn.engine.accounting import Accounting
from bigknn.engine.recall_sample import SampleTruth, sample_rows
from bigknn.engine.limits import k_refusal
from bigknn.operations.build import fingerprint
from bigknn.operations.plan_model import auto_shard_rows, automatic_shards
from bigknn.engine.sharding_pass import shard_sizes
from bigknn.engine.workers import seed_for
from bigknn.algorithms.recall_target import RECALL_AT


PREPARE_BLOCK_BYTES = 8 << 20  # stored bytes a thread prepares at a time: in its cache between the passes
PREPARE_THREADS = min(16, os.cpu_count() or 1)  # as many as were measured (docs/perf-notes.md, session 47)


@dataclass
class MemoryBuild:
    """What an in-memory build made: the rows as a store would hold them (cosine rows normalised), each row's
    list (``width`` entries, ids = input rows, kernel keys, nearest first), and the manifest's other facts."""

    vectors: np.ndarray  # (rows, dim) in the stored dtype
    ids: np.ndarray  # (rows, width) int32 (int64 past 2^31 rows)
    keys: np.ndarray  # (rows, width) float32 ordering keys (bigknn.core.metric.user_distance gives distances)
    metric: str
    params: GnndParams
    seed: int
    shard_rows: int  # what a store of this build records (the automatic size it fitted)
    estimate: dict | None  # the manifest's recall estimate (None: no target)
    summary: dict  # BuildReport's fields
    inputs: list[dict] = field(default_factory=list)  # the file read, as a store's manifest records it (sha256 None)

    @property
    def rows(self) -> int:
        return len(self.vectors)


def one_shard_rows(rows: int, dim: int, itemsize: int, params: GnndParams, backends: list[Backend],
                   shard_rows: int, partition: str = DEFAULT_METHOD) -> int | None:
    """The shard size a store build of ``rows`` x ``dim`` rows of ``itemsize`` bytes would use (the same sizing
    as operations/build.py), where the rows make one shard of it; None where they make several (the store path
    then runs, out of core)."""
    fits = auto_shard_rows(backends, dim, itemsize, params, rows=rows)
    size = shard_rows or automatic_shards(rows, fits, len(backends), params.width(), partition)[0]
    return size if len(shard_sizes(rows, size, params.width())) == 1 else None


def stored_rows(x: np.ndarray, metric: str, name: str = ARRAY) -> np.ndarray:
    """``x`` as a store holds it (kept dtype, checked, cosine rows normalised, as sharding.shard_vectors prepares
    a shard), in PREPARE_BLOCK_BYTES blocks on PREPARE_THREADS threads (NumPy's loops release the GIL); ``x``
    itself where it is already that (C-ordered, its dtype kept and stored as is, rows the metric does not
    normalise). ``name``: what a refusal names (the array, or the file it was read from)."""
    kept, rule = kept_dtype(x.dtype), metric_of(metric)
    dtype = rule.stored_dtype(kept)
    same = not rule.normalised and x.dtype == dtype and x.flags.c_contiguous
    out = x if same else np.empty(x.shape, dtype)
    step = max(1, PREPARE_BLOCK_BYTES // (x.shape[1] * dtype.itemsize))

    def block(a: int) -> None:
        part = np.asarray(x[a:a + step], dtype=kept)
        check_rows(name, a, part)
        if not same:
            rule.prepare(part, out=out[a:a + step])

    with ThreadPoolExecutor(PREPARE_THREADS) as pool:
        for done in [pool.submit(block, a) for a in range(0, len(x), step)]:
            done.result()  # in row order, so that an error names the first bad row
    return out


@dataclass
class OneShard:
    """Rows that make one shard of a store build, for an in-memory build: the rows, the shard size they fit, what
    a refusal names, and the inputs a store's manifest would record (a file's fingerprint, bigknn/operations/build.py
    ``fingerprint``, its sha256 left for ``hashed``; none for an array)."""

    rows: np.ndarray
    shard_rows: int
    name: str = ARRAY
    inputs: list[dict] = field(default_factory=list)


def one_shard_array(x: np.ndarray, params: GnndParams, backends: list[Backend], shard_rows: int,
                    partition: str) -> OneShard | None:
    """The host array ``x`` where its rows make one shard of a store build; None where they make several."""
    size = one_shard_rows(len(x), x.shape[1], kept_dtype(x.dtype).itemsize, params, backends, shard_rows, partition)
    return None if size is None else OneShard(x, size)


def one_shard_file(path: str | os.PathLike, column: str | None, params: GnndParams, backends: list[Backend],
                   shard_rows: int, partition: str) -> OneShard | None:
    """The input ``path`` (a file, a directory or a glob of them) read whole, where its rows make one shard of a
    store build; None where they make several (nothing read then). One read of the file, where a build without
    a store wrote a temporary store from it and read that back."""
    source = open_source(path, column)
    size = one_shard_rows(source.rows, source.dim, kept_dtype(source.read_dtype).itemsize, params, backends,
                          shard_rows, partition)
    if size is None:
        return None
    return OneShard(read_rows(source, 0, source.rows), size, str(path), [fingerprint(source, sha256=None)])


def hashed(inputs: list[dict]) -> list[dict]:
    """The fingerprints of the files an in-memory build read, with their sha256 (what an ingest compares to
    skip a file the store holds), as a store is made from the arrays; a file changed since it was read keeps
    none (its bytes are no longer those built)."""
    out = []
    for fp in inputs:
        source = open_source(fp["path"], fp.get("column"))
        same = (source.state.size, source.state.mtime_ns) == (fp["size"], fp["mtime_ns"])
        out.append(dict(fp, sha256=source.sha256() if same else None))
    return out


def build_in_memory(one: OneShard, metric: str, params: GnndParams, seed: int, backend: Backend) -> MemoryBuild:
    """The graph of ``one``'s host rows as one shard: kept, checked and prepared as the sharding pass does, the
    recall sample's truth and the descent's probe from it, GNND, and the estimate on the held-out rows.

    It runs on a worker thread, as a store build's calls do (bigknn/engine/workers.py): the CPU's exact search
    of the sample, the same call on the same rows, was measured slower on the caller's main thread than on a
    worker (docs/perf-notes.md, session 52)."""
    with ThreadPoolExecutor(1, thread_name_prefix="build") as worker:
        return worker.submit(_build, one, metric, params, seed, backend).result()


def _build(one: OneShard, metric: str, params: GnndParams, seed: int, backend: Backend) -> MemoryBuild:
    x, name = one.rows, one.name
    acct = Accounting()
    n, k = len(x), params.k
    if (why := k_refusal(k, n)) is not None:
        raise BadInput(name, why)
    vectors = stored_rows(x, metric, name)
    acct.add("prepare", time.perf_counter() - acct.t0)
    sample, probe = None, None
    t = time.perf_counter()  # the sample's exact search is booked with GNND, as a store build's worker books it
    if params.recall > 0:
        rows = sample_rows(n, seed)
        sample = SampleTruth(rows, vectors[rows], metric, k, seed, positional=True)
        truth = sample.add(backend, 0, 0, vectors)
        probe = sample.probe(0, n, truth, params.width(), time.perf_counter() - t)
    g = backend.gnnd(vectors, metric_of(metric), params, seed=seed_for(seed, 0, 0), probe=probe)
    acct.add_task(backend.name, "gnnd", t, time.perf_counter(), g.report)
    ids = np.asarray(g.ids, dtype=id_dtype(n))
    keys = np.asarray(g.dists, dtype=np.float32)
    estimate = None
    if sample is not None:
        est = sample.measure_lists(sample.rows, ids[sample.rows], keys[sample.rows], n)
        estimate = dict(est.to_dict(), at=RECALL_AT, target=params.recall, graph_rows=n)
    wall = time.perf_counter() - acct.t0
    summary = {"store": None, "rows": n, "dim": x.shape[1], "k": k, "metric": metric, "shards": 1,
               "merges_done": 0, "merges_total": 0, "all_pairs": 0, "partition": "contiguous",
               "backend": backend.name, "workers": 1, "resumed": False, "wall_s": round(wall, 3),
               **acct.summary(), "read_gb": 0.0, "written_gb": 0.0,
               "busy_frac": {w: round(s / wall, 3) for w, s in acct.busy.items()} if wall > 0 else {},
               "recall_estimate": estimate}
    return MemoryBuild(vectors, ids, keys, metric, params, seed, one.shard_rows, estimate, summary, one.inputs)
