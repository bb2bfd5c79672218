"""The Python API: ``bigknn.build`` and ``bigknn.open`` give a ``Graph``; ``merge``, ``ingest``, ``verify`` and
``plan`` (bigknn/api_commands.py) run on a store or size a build. Every CLI command calls these same functions.

Examples
--------
>>> import numpy as np, bigknn
>>> x = np.random.default_rng(0).normal(size=(1000, 8)).astype(np.float32)
>>> with bigknn.build(x, k=5, backend="cpu") as g:
...     ids, distances = g.neighbors()
>>> ids.shape
(1000, 5)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bigknn.api_commands import ingest, merge, plan, verify
from bigknn.operations.input_arrays import host_array, input_file
from bigknn.backends import get_backends
from bigknn.engine.dask import dask_executor
from bigknn.memory_graph import InMemoryGraph
from bigknn.core.metric import canonical_metric
from bigknn.core.params import GnndParams
from bigknn.algorithms.partition import METHODS as PARTITIONS
from bigknn.algorithms.partition.learn import DEFAULT_METHOD
from bigknn.operations.build import BuildRequest, build as run_build
from bigknn.engine.executor import InProcess, across
from bigknn.operations.build_in_memory import build_in_memory, one_shard_array, one_shard_file
from bigknn.core.progress import reporter
from bigknn.results import BuildReport
from bigknn.shards import Store
from bigknn.shards.referenced import MODES as VECTOR_MODES
from bigknn.stored_graph import Gpus, Graph, PathLike, gpu_ids

__all__ = ["DEFAULTS", "Graph", "build", "ingest", "merge", "open", "plan", "verify"]

DEFAULTS = GnndParams()
TEMP_STORE = "graph.knn"  # the store's name inside the temporary directory of a build without ``store``


def build(data: Any, k: int = DEFAULTS.k, metric: str = "l2", store: PathLike | None = None,
          recall: float = DEFAULTS.recall, backend: str = "auto", gpus: Gpus = None, *, threads: int | None = None,
          shard_rows: int = 0,
          list_width: int = 0, samples: int = 0, iters: int = DEFAULTS.iters,
          merge_iters: int = DEFAULTS.merge_iters, seed: int = 0, gpu_mem: int | None = None,
          host_mem: int | None = None, wait: float = 0.0, progress: bool = False,
          partition: str = DEFAULT_METHOD, scheduler: str | None = None, column: str | None = None,
          id_column: str | None = None, vectors: str = "copy") -> Graph:
    """Build the approximate k-NN graph of ``data``: every row gets its top-k over all rows.

    Parameters
    ----------
    data : array_like or path
        Rows to index: a NumPy or CuPy array, anything ``np.asarray`` takes, or an input file (``.fbin``
        ``.u8bin`` ``.i8bin`` ``.f16bin`` ``.fvecs`` ``.bvecs`` ``.ivecs`` ``.npy``, Parquet ``.parquet``, Arrow
        IPC ``.arrow`` / ``.feather``), or a directory or glob of such files (one dataset, sorted paths), which
        is streamed, never loaded whole. Rows that fit one shard (the GPU's memory budget; the CPU's shard
        size), built without ``store``, are built in memory and write nothing: an array as it is, a file read
        once (not with ``id_column`` or ``vectors="reference"``, which need a store). The graph is then an
        ``InMemoryGraph`` (bigknn/memory_graph.py), whose ``save(path)`` makes the store later. Any other array is
        written once to a ``.npy`` beside the store (the pipeline streams files, so that it can resume), and that
        file is deleted after the build.
    k : int
        Neighbours per row, self excluded.
    metric : {"l2", "ip", "cosine"} or an alias: "euclidean", "sqeuclidean" (l2), "inner_product", "dot" (ip)
        See ``Graph.neighbors`` for the distances each gives (l2: Euclidean, not squared, whatever the name).
    store : path, optional
        Store directory to build into, kept after the run: an interrupted build of the same file resumes
        there, a finished one is just opened. Without it (and rows beyond one shard) the graph is built in a
        temporary directory
        (``tempfile``, so ``TMPDIR`` decides where) that is deleted when the graph is closed or garbage
        collected. It is a store on disk rather than memory because builds, ingests and recall checks all
        run on the one store-based pipeline, which also takes data beyond RAM; data that fits in memory
        stays in the page cache (or point ``TMPDIR`` at a RAM disk).
    recall : float
        Target recall@10 in [0, 1): descents iterate until an estimate on a sample of their rows reaches
        it. 0: no target, ``iters`` and the update rule decide.
    backend : {"auto", "cpu", "cuda"}
        "auto" uses the GPU when CuPy and a CUDA device are present.
    gpus : "all", list of int or "0,1", optional
        GPUs to use, one worker each (default: GPU 0).
    threads : int, optional
        CPU threads the CPU backend's compiled loops use (default: all cores).
    shard_rows, list_width, samples, iters, merge_iters, seed
        Experts' overrides, as the CLI's ``bigknn build`` options (0: automatic).
    partition : {"auto", "kmeans", "rptree", "contiguous"}
        How rows are split into shards (bigknn/algorithms/partition/): balanced k-means or an RP-tree learnt on a sample
        put near rows together, so only near shard pairs are merged; contiguous ranges merge every pair;
        "auto" (default) k-means from 12 contiguous shards on, else contiguous.
        Ids are the input's row numbers whatever the partition.
    gpu_mem, host_mem : int, optional
        Bytes of GPU memory per GPU and of host RAM for cached shards (default: what is free; half the RAM).
    wait : float
        Seconds to wait for another writer of ``store``.
    progress : bool
        Show progress bars on stderr.
    scheduler : str, optional
        Run the shards' GNND and the merges as tasks on a Dask cluster: its scheduler's address
        ("tcp://host:8786"), or "local:N" for N local worker processes (needs ``bigknn[dask]``). The store
        must be on a path every worker sees. Default: in this process.
    column : str, optional
        The vector column of Parquet/Arrow inputs (default: the only fixed-size list column).
    id_column : str, optional
        A column of the user's ids (int64 or string) of Parquet/Arrow inputs, kept in the store: then
        ``neighbors(ids="user")``, ``export(..., ids="user")`` and searches speak in those ids.
    vectors : {"copy", "reference"}
        "copy" (default): the store holds a checksummed copy of the rows. "reference": the store reads them
        from ``data``, a flat file (``.fbin`` ``.u8bin`` ``.i8bin`` ``.f16bin`` ``.npy``), which must then stay
        where and as it is (a changed or moved file is refused); no disk for a second copy. Not with metric
        cosine or a partitioned build (bigknn/shards/referenced.py).

    Returns
    -------
    Graph
        The finished graph; ``Graph.report`` tells what the build did.

    Raises
    ------
    BadInput
        Bad data or usage (the message names the file, or "array", and the problem).

    Examples
    --------
    >>> import numpy as np, bigknn
    >>> x = np.random.default_rng(0).normal(size=(1000, 8)).astype(np.float32)
    >>> g = bigknn.build(x, k=5, backend="cpu")
    >>> g.info.rows, g.info.k, g.info.complete
    (1000, 5, True)
    >>> g.report.recall_estimate.recall >= 0.99
    True
    >>> g.close()
    """
    metric = canonical_metric(metric)
    if not 0.0 <= recall < 1.0:
        raise ValueError(f"recall must be in [0, 1), got {recall}")
    if partition not in PARTITIONS:
        raise ValueError(f"unknown partition {partition!r}; choose one of {', '.join(PARTITIONS)}")
    if vectors not in VECTOR_MODES:
        raise ValueError(f"unknown vectors {vectors!r}; choose one of {', '.join(VECTOR_MODES)}")
    if vectors == "reference" and not isinstance(data, (str, os.PathLike)):
        raise ValueError("vectors='reference' needs data as a file path (an array has no file to reference)")
    params = GnndParams(k=k, recall=recall, samples=samples, iters=iters, merge_iters=merge_iters,
                        list_width=list_width)
    backends = get_backends(backend, gpu_ids(gpus), gpu_mem, threads)
    if store is None and scheduler is None:
        one = None
        if not isinstance(data, (str, os.PathLike)):
            data = host_array(data)
            one = one_shard_array(data, params, backends, shard_rows, partition)
        elif id_column is None and vectors == "copy":  # a user's ids or a referenced file need a store
            one = one_shard_file(data, column, params, backends, shard_rows, partition)
        if one is not None:
            built = build_in_memory(one, metric, params, seed, across(backends)[0])
            return InMemoryGraph(built, BuildReport.from_summary(built.summary))
    temporary = None if store is not None else Path(tempfile.mkdtemp(prefix="bigknn-"))
    path = Path(store) if store is not None else temporary / TEMP_STORE
    try:
        with input_file(data, path, new_store=True) as input_path:
            req = BuildRequest(input=input_path, store=path, metric=metric, shard_rows=shard_rows, params=params,
                               seed=seed, wait_s=wait, host_mem=host_mem, partition=partition, column=column,
                               id_column=id_column, vectors=vectors)
            rep = reporter(progress)
            with dask_executor(scheduler, backend, gpu_mem, rep) as dask:
                summary = run_build(req, backends, rep, dask or InProcess(backends))
    except BaseException:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
        raise
    return Graph(Store.open(path), BuildReport.from_summary(summary), temporary)


def open(store: PathLike) -> Graph:  # noqa: A001 - bigknn.open, as the issue and zarr.open name it
    """Open a store built before (by ``build`` or ``bigknn build``) for reading, recall checks and ingests.

    Parameters
    ----------
    store : path
        The store directory.

    Returns
    -------
    Graph
        The graph as the store's last commit holds it (``Graph.report`` is None).

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np, bigknn
    >>> path = os.path.join(tempfile.mkdtemp(), "demo.knn")
    >>> x = np.random.default_rng(1).normal(size=(500, 4)).astype(np.float32)
    >>> bigknn.build(x, k=3, store=path, backend="cpu").close()   # the store stays
    >>> g = bigknn.open(path)
    >>> g.info.rows, g.info.metric
    (500, 'l2')
    """
    return Graph(Store.open(Path(store)))
