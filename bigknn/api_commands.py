"""The API of the commands that run on a store or size a build: ``bigknn.merge``, ``bigknn.ingest``,
``bigknn.verify`` and ``bigknn.plan``, each what its CLI command (``bigknn merge`` ...) runs, with the same
options (bigknn/api.py has ``build`` and ``open``)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from bigknn.backends import get_backends
from bigknn.engine.dask import dask_executor
from bigknn.core.params import GnndParams
from bigknn.algorithms.partition.learn import DEFAULT_METHOD
from bigknn.engine.executor import InProcess
from bigknn.operations.merge import finish
from bigknn.operations.ingest import drop_folder_files, ingest as ingest_files
from bigknn.operations.merge_stores import merge_stores
from bigknn.operations.sizing import size_build
from bigknn.operations.verify import repair as repair_store, verify as verify_store
from bigknn.core.progress import reporter
from bigknn.results import BuildReport, IngestReport, MergeReport
from bigknn.shards import read_store
from bigknn.stored_graph import Gpus, PathLike, gpu_ids

__all__ = ["ingest", "merge", "plan", "verify"]


def merge(store: PathLike, backend: str = "auto", gpus: Gpus = None, *, others: Iterable[PathLike] = (),
          threads: int | None = None, gpu_mem: int | None = None, host_mem: int | None = None, wait: float = 0.0,
          progress: bool = False, scheduler: str | None = None) -> BuildReport | MergeReport:
    """Without ``others``: finish a store's pending work: GNND of unbuilt shards and every pending shard-pair
    merge, or the rest of an interrupted ingest or merge (``bigknn merge STORE``); returns a BuildReport.

    With ``others`` (``bigknn merge STORE OTHER...``): fold those stores, built independently (same dim, dtype,
    metric, k and list width; contiguous), into ``store``, reusing their graphs: their rows get ids after
    ``store``'s, in the order given, and only pairs of shards across stores are merged. Crash-safe: a killed
    merge is finished by the same call; readers see the old graph until it ends. A store merged before is
    skipped. Returns a MergeReport. The other options are ``build``'s.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np, bigknn
    >>> where = tempfile.mkdtemp()
    >>> rng = np.random.default_rng(2)
    >>> a, b = (os.path.join(where, name) for name in ("a.knn", "b.knn"))
    >>> bigknn.build(rng.normal(size=(300, 4)).astype(np.float32), k=3, store=a, backend="cpu",
    ...              shard_rows=100).close()
    >>> report = bigknn.merge(a, backend="cpu")   # nothing was left pending: it only checks
    >>> report.resumed, report.merges_done == report.merges_total
    (True, True)
    >>> bigknn.build(rng.normal(size=(200, 4)).astype(np.float32), k=3, store=b, backend="cpu").close()
    >>> report = bigknn.merge(a, others=[b], backend="cpu")   # b's rows become rows 300..499 of a
    >>> report.rows_added, report.rows, report.merges_done == report.merges_total
    (200, 500, True)
    """
    rep = reporter(progress)
    others = [Path(p) for p in others]
    backends = get_backends(backend, gpu_ids(gpus), gpu_mem, threads)
    with dask_executor(scheduler, backend, gpu_mem, rep) as dask:
        if others:
            return MergeReport(**merge_stores(Path(store), others, backends, rep, wait, host_mem,
                                              dask or InProcess(backends)))
        summary = finish(Path(store), backends, rep, wait, host_mem, dask or InProcess(backends))
    return BuildReport.from_summary(summary)


def ingest(store: PathLike, inputs: Iterable[PathLike] = (), watch_dir: PathLike | None = None,
           backend: str = "auto", gpus: Gpus = None, *, threads: int | None = None, gpu_mem: int | None = None,
           host_mem: int | None = None, wait: float = 0.0, progress: bool = False,
           scheduler: str | None = None, column: str | None = None) -> IngestReport:
    """Fold input files into a finished store (``bigknn ingest``): ``inputs`` in the order given, or every file
    of the drop folder ``watch_dir`` not yet ingested, oldest first (files still being written are left for the
    next call). Every row, old and new, again holds its top-k over the whole set. Raises StoreBusy when another
    writer holds the store past ``wait`` seconds. ``column``: the vector column of Parquet/Arrow inputs (a store
    built with user ids takes them from the column it was built with). The other options are ``build``'s;
    ``Graph.ingest`` takes an array.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np, bigknn
    >>> where = tempfile.mkdtemp()
    >>> rng = np.random.default_rng(3)
    >>> bigknn.build(rng.normal(size=(400, 4)).astype(np.float32), k=3, store=os.path.join(where, "i.knn"),
    ...              backend="cpu").close()
    >>> np.save(os.path.join(where, "day1.npy"), rng.normal(size=(50, 4)).astype(np.float32))
    >>> report = bigknn.ingest(os.path.join(where, "i.knn"), [os.path.join(where, "day1.npy")], backend="cpu")
    >>> report.rows_added, report.rows
    (50, 450)
    """
    inputs = [Path(p) for p in inputs]
    if bool(inputs) == (watch_dir is not None):
        raise ValueError("give inputs (one or more files) or watch_dir, not both")
    listed = drop_folder_files(Path(watch_dir)) if watch_dir is not None else None
    rep = reporter(progress)
    backends = get_backends(backend, gpu_ids(gpus), gpu_mem, threads)
    with dask_executor(scheduler, backend, gpu_mem, rep) as dask:
        result = ingest_files(Path(store), inputs or list(listed), backends, rep, wait, host_mem, listed, column,
                              dask or InProcess(backends))
    return IngestReport(**result)


def verify(store: PathLike, repair: bool = False, wait: float = 0.0) -> dict:
    """Check a store (``bigknn verify``): every chunk against its checksum, the manifest against the arrays.
    Returns the report: ``ok``, what is ``damaged``, and the ``repair`` commands. ``repair``: under the writer
    lock (waiting up to ``wait`` seconds), drop what is damaged and recomputable, so that ``merge`` redoes it.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np, bigknn
    >>> path = os.path.join(tempfile.mkdtemp(), "v.knn")
    >>> bigknn.build(np.random.default_rng(4).normal(size=(200, 4)).astype(np.float32), k=3, store=path,
    ...              backend="cpu").close()
    >>> report = bigknn.verify(path)
    >>> report["ok"], report["damaged"]
    (True, [])
    """
    if repair:
        return repair_store(Path(store), wait)
    return read_store(Path(store), verify_store, suspect=lambda r: not r["ok"], check_identity=False)


def plan(input: PathLike | None = None, rows: int | None = None, dim: int | None = None, dtype: str = "float32",
         k: int = GnndParams.k, list_width: int = 0, shard_rows: int | None = None, store: PathLike | None = None,
         calibrate_rows: int | None = None, disk_gbps: float | None = None, partition: str = DEFAULT_METHOD,
         pairs_per_shard: float | None = None, backend: str = "auto", gpus: Gpus = None, *,
         gpu_mem: int | None = None, host_mem: int | None = None, progress: bool = False,
         output: PathLike | None = None, vectors: str = "copy") -> dict:
    """Size a build before starting it (``bigknn plan``): shards, merges, disk, host and GPU memory per worker,
    and the estimated time, from a store's recorded rates (``store``) or a short calibration on this machine
    (on ``input``'s rows, or synthetic ones of ``dtype`` given ``rows`` and ``dim``), with the same plan
    projected to 1, 2, 4 and 8 workers (``projections``). The options are the CLI's;
    ``gpu_mem``: the device memory to size shards for (a GPU elsewhere, when planned on a CPU); ``output``: the
    store the build will write, whose file system's rate is measured (default: the input's, else the current
    directory's); ``vectors``: the build's (``reference``: no copy of the rows is written).

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np, bigknn
    >>> path = os.path.join(tempfile.mkdtemp(), "p.knn")    # a store's timings give the rates
    >>> bigknn.build(np.random.default_rng(5).normal(size=(600, 4)).astype(np.float32), k=3, store=path,
    ...              backend="cpu", shard_rows=200).close()
    >>> p = bigknn.plan(rows=10**9, dim=4, k=3, store=path, backend="cpu", disk_gbps=1.0)
    >>> p["rows"], p["shards"] * p["shard_rows"] >= 10**9, p["estimate_s"]["total"] > 0, p["on_device"]
    (1000000000, True, True, False)
    """
    params = GnndParams(k=k, list_width=list_width)
    backends = get_backends(backend, gpu_ids(gpus), gpu_mem)
    return size_build(None if input is None else Path(input), rows, dim, dtype, params, shard_rows,
                      None if store is None else Path(store), calibrate_rows, disk_gbps, partition, pairs_per_shard,
                      backends, gpu_mem, host_mem, reporter(progress), None if output is None else Path(output),
                      vectors)
