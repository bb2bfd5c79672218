"""``Graph``: a k-NN graph in a store, as ``bigknn.build`` and ``bigknn.open`` give it: its neighbour lists
as arrays, scipy, UMAP or files, its quality (recall, in-degrees, pictures: bigknn/graph_quality.py) and its
upkeep (ingest)."""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from bigknn.operations.input_arrays import host_array, input_file
from bigknn.backends import get_backend, get_backends
from bigknn.core.extras import install_hint
from bigknn.graph_quality import QualityMethods
from bigknn.core.metric import metric as metric_of, prepare_rows, user_distance
from bigknn.operations.export import ID_KINDS, export as run_export
from bigknn.operations.ingest import ingest as run_ingest
from bigknn.algorithms.partition.rowmap import RowMap
from bigknn.operations.readout import csr_parts, neighbours_per_row, whole_graph
from bigknn.stored_graph_products import ProductMethods
from bigknn.core.progress import reporter
from bigknn.results import BuildReport, ExportReport, Info, IngestReport, Neighbors
from bigknn.operations.loaded_index import IndexSlot
from bigknn.stored_graph_search import SearchMethods
from bigknn.shards import Store, user_ids

PathLike = str | os.PathLike
Gpus = str | Sequence[int] | None


class Graph(SearchMethods, ProductMethods, QualityMethods):
    """A k-NN graph in a store: its neighbour lists, as arrays, scipy, UMAP or files, and its upkeep.

    Made by ``bigknn.build`` or ``bigknn.open``. A graph built without a store lives in a temporary
    directory until ``close()`` (or the end of a ``with`` block, or garbage collection).
    """

    def __init__(self, store: Store, report: BuildReport | None = None, temporary: Path | None = None):
        self._store = store
        self.report = report  #: what the build that made this object did (None after ``bigknn.open``)
        self._cleanup = weakref.finalize(self, shutil.rmtree, temporary, True) if temporary is not None else None
        self._closed = False
        self._search_slot = IndexSlot()  # the search index ``search`` loaded, kept between its calls

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

    def neighbors(self, k: int | None = None, include_self: bool = False, ids: str = "row") -> Neighbors:
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
        ids : {"row", "user"}
            Input row numbers, or the user's ids the store keeps (built with ``id_column``): int64, or an
            object array of str.

        Returns
        -------
        Neighbors
            ``(ids, distances)``: (rows, k) row numbers (int32; int64 in a store past 2^31 rows) and
            float32 distances.

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
        users = self._user_ids(ids)
        found, distances = whole_graph(self._live(), k, include_self)
        return Neighbors(found if users is None else users.take(found), distances)

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
        found = get_backend(backend, gpu_mem).exact_knn(q, k, metric_of(m.metric), blocks)
        return Neighbors(RowMap.of(store).to_input(found.ids), user_distance(found.dists, m.metric))

    # ---- writing ----------------------------------------------------------------------------------
    def export(self, path: PathLike, include_self: bool = False, ids: str = "row") -> ExportReport:
        """Write the graph to a file whose extension names the format: ``.ibin`` (big-ann-benchmarks ground
        truth layout), ``.npy`` (ids; distances beside it in ``<name>.dists.npy``), ``.npz`` (the CSR
        matrix of ``to_scipy``; ``scipy.sparse.load_npz`` reads it) or ``.parquet`` (an edge list: ``src``,
        ``dst``, ``distance``, ``rank``). ``ids="user"``: the user's ids the store keeps (``id_column``).

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
        return ExportReport(**run_export(self._live(), Path(path), include_self, ids))

    def ingest(self, data: Any, backend: str = "auto", gpus: Gpus = None, gpu_mem: int | None = None,
               host_mem: int | None = None, wait: float = 0.0, progress: bool = False,
               threads: int | None = None, column: str | None = None) -> IngestReport:
        """Add rows to the graph: every row, old and new, again holds its top-k over the whole set.

        New rows get the ids after the last existing one, in order. ``data`` is an array or an input file
        (as for ``build``; the same dimension and dtype as the store's input). Ingesting a file (or an
        array) the store already holds does nothing. A store built with ``id_column`` takes the new rows' ids
        from the column of that name. The other parameters are those of ``build``.

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
        with input_file(data, path, new_store=False) as input_path:
            result = run_ingest(path, [input_path], get_backends(backend, gpu_ids(gpus), gpu_mem, threads),
                                reporter(progress), wait, host_mem, column=column)
        self._search_slot.close()  # the search graph is stale now (search refuses it until the next prune)
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
        self._search_slot.close()
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

    def _user_ids(self, ids: str) -> user_ids.UserIds | None:
        """The user's ids the store keeps when ``ids`` is "user" (refusing a store without), None for "row"."""
        if ids not in ID_KINDS:
            raise ValueError(f"ids must be one of {', '.join(ID_KINDS)}, got {ids!r}")
        store = self._live()
        return user_ids.require(store.path, store.manifest.rows) if ids == "user" else None

    def __reduce__(self) -> tuple:
        """Pickled by its store's path; a graph in a temporary directory (built without ``store``), which
        the original deletes, with its store's files, as pynndescent pickles its index whole (joblib and
        scikit-learn's model persistence pickle a fitted ``KNNGraphTransformer``).

        Examples
        --------
        >>> import pickle
        >>> import numpy as np, bigknn
        >>> with bigknn.build(np.eye(20, dtype=np.float32), k=3, backend="cpu") as g:
        ...     copy = pickle.loads(pickle.dumps(g))
        ...     elsewhere = copy.path != g.path
        >>> copy.neighbors().ids.shape, elsewhere
        ((20, 3), True)
        >>> copy.close()
        """
        path = self._live().path
        if self._cleanup is None:
            return _reopen, (str(path),)
        files = {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*"))
                 if f.is_file() and not f.is_symlink() and f.relative_to(path).parts[0] not in UNPICKLED}
        return _unpickle_temporary, (path.name, files)

    def _live(self) -> Store:
        if self._closed:
            raise ValueError("the graph is closed")
        return self._store


UNPICKLED = (".lock", ".readers")  # a store's files that belong to the processes using it, not to the graph


def _reopen(path: str) -> Graph:
    return Graph(Store.open(Path(path)))


def _unpickle_temporary(name: str, files: dict[str, bytes]) -> Graph:
    """A pickled temporary graph, in a temporary directory of its own (deleted as the original's is)."""
    temporary = Path(tempfile.mkdtemp(prefix="bigknn-"))
    for rel, data in files.items():
        target = temporary / name / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return Graph(Store.open(temporary / name), temporary=temporary)


def gpu_ids(gpus: Gpus) -> str | None:
    """The API's ``gpus`` (a list of ids too) as the CLI's ``--gpus`` text."""
    return gpus if gpus is None or isinstance(gpus, str) else ",".join(str(int(g)) for g in gpus)


def _optional(module: str, extra: str) -> ModuleType:
    """Import an optional dependency, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{module} is needed for this: {install_hint(extra)}") from e
