"""The Python API: ``bigknn.build`` and ``bigknn.open`` give a ``Graph``. The CLI's build, info, export
and eval commands call these same functions.

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

import importlib
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from bigknn.arrays import ARRAY, host_array, spill
from bigknn.backends import get_backend, get_backends
from bigknn.errors import BadInput
from bigknn.metrics import METRICS, kernel_metric, prepare_rows, user_distance
from bigknn.params import GnndParams
from bigknn.pipeline.build import BuildRequest, build as run_build
from bigknn import plot as draw
from bigknn.pipeline.evaluate import RECALL_K, SAMPLE_ROWS, recall_rows
from bigknn.pipeline.export import export as run_export
from bigknn.pipeline.ingest import ingest as run_ingest
from bigknn.pipeline.readout import csr_parts, in_degrees, neighbours_per_row, shard_of, whole_graph
from bigknn.progress import Reporter, RichReporter
from bigknn.results import BuildReport, ExportReport, InDegrees, Info, IngestReport, Neighbors, RecallReport
from bigknn.shards import Store

DEFAULTS = GnndParams()
TEMP_STORE = "graph.knn"  # the store's name inside the temporary directory of a build without ``store``

PathLike = str | os.PathLike
Gpus = str | Sequence[int] | None


def build(data: Any, k: int = DEFAULTS.k, metric: str = "l2", store: PathLike | None = None,
          recall: float = DEFAULTS.recall, backend: str = "auto", gpus: Gpus = None, *, shard_rows: int = 0,
          list_width: int = 0, samples: int = 0, iters: int = DEFAULTS.iters,
          merge_iters: int = DEFAULTS.merge_iters, seed: int = 0, gpu_mem: int | None = None,
          host_mem: int | None = None, wait: float = 0.0, progress: bool = False) -> Graph:
    """Build the approximate k-NN graph of ``data``: every row gets its top-k over all rows.

    Parameters
    ----------
    data : array_like or path
        Rows to index: a NumPy or CuPy array, anything ``np.asarray`` takes, or an input file (``.fbin``
        ``.u8bin`` ``.i8bin`` ``.f16bin`` ``.fvecs`` ``.bvecs`` ``.ivecs`` ``.npy``), which is streamed,
        never loaded whole. An array is written once to a ``.npy`` beside the store (the pipeline streams
        files, so that it can resume), and that file is deleted after the build.
    k : int
        Neighbours per row, self excluded.
    metric : {"l2", "ip", "cosine"}
        See ``Graph.neighbors`` for the distances each gives.
    store : path, optional
        Store directory to build into, kept after the run: an interrupted build of the same file resumes
        there, a finished one is just opened. Without it the graph is built in a temporary directory
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
    shard_rows, list_width, samples, iters, merge_iters, seed
        Experts' overrides, as the CLI's ``bigknn build`` options (0: automatic).
    gpu_mem, host_mem : int, optional
        Bytes of GPU memory per GPU and of host RAM for cached shards (default: what is free; half the RAM).
    wait : float
        Seconds to wait for another writer of ``store``.
    progress : bool
        Show progress bars on stderr.

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
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if not 0.0 <= recall < 1.0:
        raise ValueError(f"recall must be in [0, 1), got {recall}")
    params = GnndParams(k=k, recall=recall, samples=samples, iters=iters, merge_iters=merge_iters,
                        list_width=list_width)
    backends = get_backends(backend, _gpu_ids(gpus), gpu_mem)
    temporary = None if store is not None else Path(tempfile.mkdtemp(prefix="bigknn-"))
    path = Path(store) if store is not None else temporary / TEMP_STORE
    try:
        with _input_file(data, path, new_store=True) as input_path:
            req = BuildRequest(input=input_path, store=path, metric=metric, shard_rows=shard_rows, params=params,
                               seed=seed, wait_s=wait, host_mem=host_mem)
            summary = run_build(req, backends, _reporter(progress))
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


class Graph:
    """A k-NN graph in a store: its neighbour lists, as arrays, scipy, UMAP or files, and its upkeep.

    Made by ``bigknn.build`` or ``bigknn.open``. A graph built without a store lives in a temporary
    directory until ``close()`` (or the end of a ``with`` block, or garbage collection).
    """

    def __init__(self, store: Store, report: BuildReport | None = None, temporary: Path | None = None):
        self._store = store
        self.report = report  #: what the build that made this object did (None after ``bigknn.open``)
        self._cleanup = weakref.finalize(self, shutil.rmtree, temporary, True) if temporary is not None else None
        self._closed = False

    # ---- reading ----------------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The store directory (a temporary one for a build without ``store``).

        Examples
        --------
        >>> import numpy as np, bigknn
        >>> with bigknn.build(np.eye(20, dtype=np.float32), k=3, backend="cpu") as g:
        ...     print(g.path.name, (g.path / "manifest.json").is_file())
        graph.knn True
        """
        return self._live().path

    @property
    def info(self) -> Info:
        """Rows, dim, metric, k, build progress, inputs, disk use, timings and the build's recall estimate.

        Examples
        --------
        >>> import numpy as np, bigknn
        >>> x = np.random.default_rng(0).normal(size=(1000, 8)).astype(np.float32)
        >>> with bigknn.build(x, k=5, backend="cpu", recall=0.95) as g:
        ...     info = g.info
        >>> info.rows, info.dim, info.recall_estimate.target
        (1000, 8, 0.95)
        """
        return Info.of(self._live())

    def neighbors(self, k: int | None = None, include_self: bool = False) -> Neighbors:
        """Every row's k nearest rows with their distances, nearest first.

        Distances are true distances, ascending per row: Euclidean for ``l2``; 1 - cos for ``cosine``;
        for ``ip``, 1 - x.y (hnswlib's inner-product distance: it ascends as the inner product descends,
        equals the cosine distance on unit-length rows and is negative where x.y > 1).

        Parameters
        ----------
        k : int, optional
            Neighbours per row, 1 to the graph's k (default: all it holds).
        include_self : bool
            Put each row itself first, at distance 0, before its k neighbours (k + 1 columns), as
            scikit-learn's ``KNeighborsTransformer`` and UMAP's ``precomputed_knn`` do.

        Returns
        -------
        Neighbors
            ``(ids, distances)``: (rows, k) int32 row numbers and float32 distances.

        Examples
        --------
        >>> import numpy as np, bigknn
        >>> x = np.array([[0.0, 0], [1, 0], [3, 0], [7, 0]], dtype=np.float32)
        >>> with bigknn.build(x, k=2, backend="cpu") as g:
        ...     ids, dist = g.neighbors()
        ...     ids_self, dist_self = g.neighbors(k=1, include_self=True)
        >>> ids.tolist(), dist.tolist()
        ([[1, 2], [0, 2], [1, 0], [2, 1]], [[1.0, 3.0], [1.0, 2.0], [2.0, 3.0], [4.0, 6.0]])
        >>> ids_self.tolist(), dist_self.tolist()
        ([[0, 1], [1, 0], [2, 1], [3, 2]], [[0.0, 1.0], [0.0, 1.0], [0.0, 2.0], [0.0, 4.0]])
        """
        return Neighbors(*whole_graph(self._live(), k, include_self))

    def to_scipy(self, k: int | None = None, include_self: bool = False) -> Any:
        """The graph as a ``scipy.sparse.csr_matrix`` of shape (rows, rows): row i holds the distances to
        its neighbours, nearest first, as scikit-learn's k-neighbours graphs do. A zero distance (a
        duplicate row, or self with ``include_self``) is an explicit entry, not a missing edge.

        Parameters
        ----------
        k, include_self
            As for ``neighbors``.

        Examples
        --------
        >>> import numpy as np, bigknn
        >>> x = np.array([[0.0, 0], [0, 0], [1, 0], [5, 0]], dtype=np.float32)
        >>> with bigknn.build(x, k=1, backend="cpu") as g:
        ...     m = g.to_scipy()
        >>> m.shape, m.nnz, float(m[0, 1]), float(m[3, 2])
        ((4, 4), 4, 0.0, 4.0)
        """
        sparse = _optional("scipy.sparse", "scipy")
        data, indices, indptr = csr_parts(*whole_graph(self._live(), k, include_self))
        n = self._store.manifest.rows
        return sparse.csr_matrix((data, indices, indptr), shape=(n, n))

    def umap_knn(self, n_neighbors: int | None = None) -> Neighbors:
        """UMAP's ``precomputed_knn``: each row itself first at distance 0, then its nearest neighbours.

        Parameters
        ----------
        n_neighbors : int, optional
            UMAP's ``n_neighbors`` (self counted, as UMAP counts it): 2 to the graph's k + 1 (default).
            Pass the same value to ``umap.UMAP``: below 4096 rows UMAP uses the lists as given.

        Returns
        -------
        Neighbors
            ``(knn_indices, knn_dists)``, both (rows, n_neighbors).

        Examples
        --------
        >>> import numpy as np, bigknn
        >>> x = np.random.default_rng(0).normal(size=(300, 4)).astype(np.float32)
        >>> with bigknn.build(x, k=15, backend="cpu") as g:
        ...     knn = g.umap_knn(n_neighbors=15)
        >>> knn.ids.shape, bool((knn.ids[:, 0] == np.arange(300)).all()), float(knn.distances[:, 0].max())
        ((300, 15), True, 0.0)

        With umap-learn installed: ``umap.UMAP(n_neighbors=15, precomputed_knn=knn).fit_transform(x)``.
        """
        most = neighbours_per_row(self._live(), None) + 1
        n_neighbors = most if n_neighbors is None else n_neighbors
        if not 2 <= n_neighbors <= most:
            raise ValueError(f"n_neighbors must be 2..{most} (self and the graph's k = {most - 1}), got {n_neighbors}")
        return self.neighbors(n_neighbors - 1, include_self=True)

    def exact_neighbors(self, x: Any, k: int | None = None, backend: str = "auto",
                        gpu_mem: int | None = None) -> Neighbors:
        """The exact k nearest rows of the graph to each row of ``x``, new vectors the graph does not hold
        (a brute-force scan of the store, shard by shard: it costs len(x) x rows distances). ``k``: 1 to
        the graph's rows (default: the graph's k); ``backend``, ``gpu_mem``: as for ``build``.

        Examples
        --------
        >>> import numpy as np, bigknn
        >>> x = np.array([[0.0, 0], [1, 0], [3, 0], [7, 0]], dtype=np.float32)
        >>> with bigknn.build(x, k=2, backend="cpu") as g:
        ...     ids, dist = g.exact_neighbors([[2.9, 0.0]], k=2, backend="cpu")
        >>> ids.tolist(), [round(float(d), 3) for d in dist[0]]
        ([[2, 1]], [0.1, 1.9])
        """
        store = self._live()
        m = store.manifest
        k = m.k if k is None else k
        if not 1 <= k <= m.rows:
            raise ValueError(f"k must be 1..{m.rows} (the graph's rows), got {k}")
        q = prepare_rows(host_array(x).astype(np.float32, copy=False), m.metric)
        blocks = ((s.offset, store.read_vectors(s.id)) for s in m.shards)
        found = get_backend(backend, gpu_mem).exact_knn(q, k, kernel_metric(m.metric), blocks)
        return Neighbors(found.ids, user_distance(found.dists, m.metric))

    def recall(self, sample: int = SAMPLE_ROWS, k: int = RECALL_K, truth: PathLike | None = None, seed: int = 0,
               rows: tuple[int, int] | None = None, backend: str = "auto", gpu_mem: int | None = None,
               plot: PathLike | None = None) -> RecallReport:
        """Measure recall@k on sampled rows against their exact neighbours (self excluded, ties counted).

        Parameters
        ----------
        sample : int
            Rows whose exact neighbours are computed (a scan of the store each).
        k : int
            Recall@k, at most the graph's k.
        truth : path, optional
            Ground truth ``.ibin`` (row i: exact neighbours of row i) instead of the exact scan.
        seed : int
            Seed of the row sample.
        rows : (int, int), optional
            Sample only global rows [lo, hi), e.g. the rows an ingest added.
        backend, gpu_mem
            As for ``build``.
        plot : path, optional
            Also draw the recall of each sampled row (a histogram) and each shard's mean into this image
            file (.png, .svg, .pdf; needs matplotlib: ``bigknn[plot]``).

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np, bigknn
        >>> x = np.random.default_rng(0).normal(size=(1000, 8)).astype(np.float32)
        >>> picture = os.path.join(tempfile.mkdtemp(), "recall.png")
        >>> with bigknn.build(x, k=10, backend="cpu") as g:
        ...     r = g.recall(sample=200, backend="cpu", plot=picture)
        >>> r.sample, r.k, r.recall >= 0.99, os.path.getsize(r.plot) > 0
        (200, 10, True, True)
        """
        store = self._live()
        if plot is not None:
            draw.pyplot(Path(plot))  # refuse a missing matplotlib or an unknown extension before the work
        result, sampled, per_row = recall_rows(store, get_backend(backend, gpu_mem), sample, k,
                                               None if truth is None else Path(truth), seed, rows)
        if plot is not None:
            draw.recall_histogram(Path(plot), per_row, shard_of(store, sampled), len(store.manifest.shards),
                                  result["k"], f"{store.path.name}: recall@{result['k']} of {len(sampled):,} rows")
            result["plot"] = str(plot)
        return RecallReport(**result)

    def in_degrees(self, k: int | None = None) -> np.ndarray:
        """How many neighbour lists (their first ``k`` entries; default all) each row appears in: (rows,)
        int64, mean k. Rows in many lists are hubs, rows in none are never found as anyone's neighbour.

        Examples
        --------
        >>> import numpy as np, bigknn
        >>> x = np.array([[0.0], [1], [3], [7]], dtype=np.float32)
        >>> with bigknn.build(x, k=1, backend="cpu") as g:
        ...     g.in_degrees().tolist()        # 0->1, 1->0, 2->1, 3->2
        [1, 2, 1, 0]
        """
        return in_degrees(self._live(), k)

    def plot_in_degrees(self, path: PathLike, k: int | None = None) -> InDegrees:
        """Draw the in-degree distribution (``in_degrees``) into an image file (.png, .svg, .pdf; needs
        matplotlib: ``bigknn[plot]``) and return its summary; ``bigknn info --plot`` calls this.

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np, bigknn
        >>> x = np.random.default_rng(0).normal(size=(1000, 8)).astype(np.float32)
        >>> picture = os.path.join(tempfile.mkdtemp(), "degrees.png")
        >>> with bigknn.build(x, k=10, backend="cpu") as g:
        ...     d = g.plot_in_degrees(picture)
        >>> d.mean, d.max > 10, os.path.getsize(d.plot) > 0
        (10.0, True, True)
        """
        store = self._live()
        draw.pyplot(Path(path))
        k = neighbours_per_row(store, k)
        degrees = in_degrees(store, k)
        draw.in_degree_histogram(Path(path), degrees, k, f"{store.path.name}: in-degrees of {len(degrees):,} rows")
        return InDegrees.of(degrees, k, str(path))

    # ---- writing ----------------------------------------------------------------------------------
    def export(self, path: PathLike, include_self: bool = False) -> ExportReport:
        """Write the graph to a file whose extension names the format: ``.ibin`` (big-ann-benchmarks ground
        truth layout), ``.npy`` (ids; distances beside it in ``<name>.dists.npy``) or ``.npz`` (the CSR
        matrix of ``to_scipy``; ``scipy.sparse.load_npz`` reads it).

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np, bigknn, scipy.sparse
        >>> x = np.random.default_rng(0).normal(size=(100, 4)).astype(np.float32)
        >>> out = os.path.join(tempfile.mkdtemp(), "g.npz")
        >>> with bigknn.build(x, k=5, backend="cpu") as g:
        ...     report = g.export(out, include_self=True)
        >>> report.format, scipy.sparse.load_npz(out).nnz
        ('npz', 600)
        """
        return ExportReport(**run_export(self._live(), Path(path), include_self))

    def ingest(self, data: Any, backend: str = "auto", gpus: Gpus = None, gpu_mem: int | None = None,
               host_mem: int | None = None, wait: float = 0.0, progress: bool = False) -> IngestReport:
        """Add rows to the graph: every row, old and new, again holds its top-k over the whole set.

        New rows get the ids after the last existing one, in order. ``data`` is an array or an input file
        (as for ``build``; the same dimension and dtype as the store's input). Ingesting a file (or an
        array) the store already holds does nothing. The other parameters are those of ``build``.

        Examples
        --------
        >>> import numpy as np, bigknn
        >>> rng = np.random.default_rng(0)
        >>> with bigknn.build(rng.normal(size=(1000, 8)).astype(np.float32), k=5, backend="cpu") as g:
        ...     report = g.ingest(rng.normal(size=(200, 8)).astype(np.float32), backend="cpu")
        ...     ids, _ = g.neighbors()
        >>> report.rows_added, report.rows, ids.shape
        (200, 1200, (1200, 5))
        """
        path = self._live().path
        with _input_file(data, path, new_store=False) as input_path:
            result = run_ingest(path, [input_path], get_backends(backend, _gpu_ids(gpus), gpu_mem),
                                _reporter(progress), wait, host_mem)
        self._store = Store.open(path)
        return IngestReport(**result)

    # ---- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop using the graph; a temporary store (a build without ``store``) is deleted. A ``with`` block
        closes it at its end.

        Examples
        --------
        >>> import numpy as np, bigknn
        >>> g = bigknn.build(np.eye(20, dtype=np.float32), k=3, backend="cpu")
        >>> where = g.path
        >>> g.close()
        >>> where.exists(), g
        (False, <bigknn.Graph (closed)>)
        """
        self._closed = True
        if self._cleanup is not None:
            self._cleanup()

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            return "<bigknn.Graph (closed)>"
        m = self._store.manifest
        return f"<bigknn.Graph {m.rows} rows, k={m.k}, {m.metric}, store {self._store.path}>"

    def _live(self) -> Store:
        if self._closed:
            raise ValueError("the graph is closed")
        return self._store


# ---- helpers ------------------------------------------------------------------------------------------
@contextmanager
def _input_file(data: Any, store: Path, new_store: bool) -> Iterator[Path]:
    """A file the pipeline can stream: ``data`` itself when it is a path, else ``data`` written to a
    temporary ``.npy`` beside ``store`` (on its file system, which has room for the vectors anyway)."""
    if isinstance(data, (str, os.PathLike)):
        yield Path(data)
        return
    if new_store and Store.exists(store):
        raise BadInput(store, "exists; an array is built into a new store (bigknn.open reads this one)")
    store.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".bigknn-input-", dir=store.parent) as tmp:
        path = spill(data, Path(tmp) / "array.npy")
        try:
            yield path
        except BadInput as e:  # name the caller's array, not the temporary file
            if e.path != str(path):
                raise
            raise BadInput(ARRAY, e.problem) from None


def _gpu_ids(gpus: Gpus) -> str | None:
    return gpus if gpus is None or isinstance(gpus, str) else ",".join(str(int(g)) for g in gpus)


def _reporter(progress: bool) -> Reporter:
    return RichReporter() if progress else Reporter()


def _optional(module: str, extra: str) -> ModuleType:
    """Import an optional dependency, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{module} is needed for this; pip install 'bigknn[{extra}]'") from e
