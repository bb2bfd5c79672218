"""``InMemoryGraph``: the ``Graph`` that ``bigknn.build(array)`` (or of a file) gives when the rows fit one shard
and no ``store`` was asked for. Its lists live in arrays (bigknn/operations/build_in_memory.py), so reading them costs no disk:
``neighbors``, ``to_scipy``, ``umap_knn``, ``in_degrees``, ``export`` and ``info`` answer from the arrays, and
``save(path)`` writes the store a stored build would have made (``bigknn.open(path)`` reads the same graph).

Every other ``Graph`` method and property (``path``, ``recall``, ``exact_neighbors``, ``prune``, ``search``,
``ingest``, the plots) runs on a private temporary store that the first such call writes from the arrays
(``_live``), deleted at ``close()`` as a stored build's temporary store is. After an ``ingest`` the store holds
more rows than the arrays, so from then on every method reads the store.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from bigknn.operations.input_arrays import ARRAY
from bigknn.core.errors import BadInput
from bigknn.core.knn_graph import KnnGraph
from bigknn.core.metric import user_distance
from bigknn.operations.build_in_memory import MemoryBuild, hashed
from bigknn.operations.export import format_of, write_graph_file
from bigknn.operations.readout import csr_parts
from bigknn.results import BuildReport, ExportReport, Info, IngestReport, Neighbors
from bigknn.shards import Manifest, ShardEntry, Store, WriterLock
from bigknn.shards.creation import NewStore
from bigknn.operations.loaded_index import IndexSlot
from bigknn.stored_graph import Gpus, Graph, PathLike, _optional

PRIVATE_STORE = "graph.knn"  # the private store's name inside its temporary directory
GRAPH_VERSION = 1  # the one graph version a saved store's only shard holds


class InMemoryGraph(Graph):
    """A k-NN graph held in arrays, with the ``Graph`` API (see the module's docstring for which methods
    write a private temporary store first).

    The graph keeps the array it was built from where no copy was needed (float32, float16, uint8 or int8,
    C-ordered, metric other than cosine): change that array afterwards and ``save`` or ``search`` see the
    changed rows, as scikit-learn's estimators see a fitted array."""

    def __init__(self, built: MemoryBuild, report: BuildReport):
        self._mem: MemoryBuild | None = built
        self.report = report
        self._store: Store | None = None
        self._cleanup: weakref.finalize | None = None
        self._closed = False
        self._search_slot = IndexSlot()  # as Graph's: the index ``search`` keeps, over the private store

    # ---- answered from the arrays --------------------------------------------------------------------
    @property
    def info(self) -> Info:
        """As ``Graph.info``; ``store`` is None and ``disk_bytes`` 0 until a store is written."""
        mem = self._arrays()
        if mem is None:
            return super().info
        m = self._manifest(mem)
        return Info.of_manifest(m, store=None, shards=1, shards_built=1, merges_done=0, merges_pending=0,
                                inputs=[i["path"] for i in mem.inputs], disk_bytes=0, search=None)

    def neighbors(self, k: int | None = None, include_self: bool = False, ids: str = "row") -> Neighbors:
        """As ``Graph.neighbors`` (copies: changing them leaves the graph as it is). An array has no user ids:
        ``ids="user"`` is the store's answer (a refusal naming it)."""
        mem = self._arrays()
        if mem is None or ids != "row":
            return super().neighbors(k, include_self, ids)
        k = self._k(mem, k)
        ids, dists = mem.ids[:, :k].copy(), user_distance(mem.keys[:, :k], mem.metric)
        if include_self:
            ids = np.concatenate([np.arange(mem.rows, dtype=ids.dtype)[:, None], ids], axis=1)
            dists = np.concatenate([np.zeros((mem.rows, 1), np.float32), dists], axis=1)
        return Neighbors(ids, np.ascontiguousarray(dists, dtype=np.float32))

    def to_scipy(self, k: int | None = None, include_self: bool = False):
        """As ``Graph.to_scipy``."""
        mem = self._arrays()
        if mem is None:
            return super().to_scipy(k, include_self)
        sparse = _optional("scipy.sparse", "scipy")
        data, indices, indptr = csr_parts(*self.neighbors(k, include_self))
        return sparse.csr_matrix((data, indices, indptr), shape=(mem.rows, mem.rows))

    def umap_knn(self, n_neighbors: int | None = None) -> Neighbors:
        """As ``Graph.umap_knn``."""
        mem = self._arrays()
        if mem is None:
            return super().umap_knn(n_neighbors)
        most = mem.params.k + 1
        n_neighbors = most if n_neighbors is None else n_neighbors
        if not 2 <= n_neighbors <= most:
            raise ValueError(f"n_neighbors must be 2..{most} (self and the graph's k = {most - 1}), got {n_neighbors}")
        return self.neighbors(n_neighbors - 1, include_self=True)

    def in_degrees(self, k: int | None = None) -> np.ndarray:
        """As ``Graph.in_degrees``."""
        mem = self._arrays()
        if mem is None:
            return super().in_degrees(k)
        ids = mem.ids[:, :self._k(mem, k)]
        return np.bincount(ids[ids >= 0], minlength=mem.rows).astype(np.int64)

    def export(self, path: PathLike, include_self: bool = False, ids: str = "row") -> ExportReport:
        """As ``Graph.export`` (``store`` is None in the report); a Parquet edge list, or ``ids="user"``, is
        written from the private store."""
        mem = self._arrays()
        if mem is None or ids != "row" or format_of(Path(path)) == "parquet":
            return super().export(path, include_self, ids)
        ids, dists = self.neighbors(include_self=include_self)
        files = write_graph_file(Path(path), mem.rows, ids.shape[1], ids.dtype,
                                 lambda: [(slice(0, mem.rows), ids, dists)])
        return ExportReport(store=None, rows=mem.rows, k=mem.params.k, format=format_of(path),
                            include_self=include_self, files=files)

    def save(self, path: PathLike) -> Path:
        """Write the graph as a new store at ``path`` (a missing path or an empty directory), the store a build
        with ``store=path`` would have made: ``bigknn.open(path)`` reads the same lists, vectors and recall
        estimate. Returns the path.

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np, bigknn
        >>> x = np.random.default_rng(0).normal(size=(500, 4)).astype(np.float32)
        >>> path = os.path.join(tempfile.mkdtemp(), "kept.knn")
        >>> with bigknn.build(x, k=5, backend="cpu") as g:
        ...     ids = g.neighbors().ids
        ...     _ = g.save(path)
        >>> bool((bigknn.open(path).neighbors().ids == ids).all())
        True
        """
        mem = self._arrays()
        if mem is None:
            raise ValueError(f"the graph has grown past its arrays (an ingest); its store is {self._live().path}")
        path = Path(path)
        new = NewStore(path)  # refuses a path that is not new or empty, before anything is written
        with WriterLock(path):
            store = Store.create(path, self._manifest(mem, finished=False))
            try:
                store.write_vectors(0, mem.vectors)
                store.write_graph(0, GRAPH_VERSION, KnnGraph(mem.ids, mem.keys))
                finished = self._manifest(mem)
                store.manifest.shards, store.manifest.estimate = finished.shards, finished.estimate
                store.manifest.timings = finished.timings
                store.manifest.inputs = hashed(mem.inputs)
                store.commit()
            except BaseException:
                store.close()
                new.undo()
                raise
            store.close()
        return path

    # ---- answered from a store -----------------------------------------------------------------------
    def ingest(self, data: Any, backend: str = "auto", gpus: Gpus = None, gpu_mem: int | None = None,
               host_mem: int | None = None, wait: float = 0.0, progress: bool = False,
               threads: int | None = None) -> IngestReport:
        """As ``Graph.ingest``, into the private store; the arrays are dropped (they no longer hold every row)."""
        report = super().ingest(data, backend, gpus, gpu_mem, host_mem, wait, progress, threads)
        self._mem = None
        return report

    def close(self) -> None:
        """As ``Graph.close``: the arrays are let go and a private store, if one was written, is deleted."""
        self._mem = None
        super().close()

    def __repr__(self) -> str:
        mem = self._arrays() if not self._closed else None
        if mem is None:
            return super().__repr__()
        return f"<bigknn.Graph {mem.rows} rows, k={mem.params.k}, {mem.metric}, in memory>"

    def _live(self) -> Store:
        """The private store, written from the arrays on first use."""
        if self._closed:
            raise ValueError("the graph is closed")
        if self._store is None:
            where = Path(tempfile.mkdtemp(prefix="bigknn-"))
            self._cleanup = weakref.finalize(self, shutil.rmtree, where, True)
            self._store = Store.open(self.save(where / PRIVATE_STORE))
        return self._store

    def _arrays(self) -> MemoryBuild | None:
        """The arrays, while they are the whole graph (None after an ingest); refuses a closed graph."""
        if self._closed:
            raise ValueError("the graph is closed")
        return self._mem

    @staticmethod
    def _k(mem: MemoryBuild, k: int | None) -> int:
        """``k`` checked against the graph's k (None: the graph's k), as the store's readout checks it."""
        have = mem.params.k
        if k is None:
            return have
        if not 1 <= k <= have:
            raise BadInput(ARRAY, f"k = {k} is outside 1..{have}, the neighbours the graph holds per row")
        return k

    @staticmethod
    def _manifest(mem: MemoryBuild, finished: bool = True) -> Manifest:
        """The manifest of the finished one-shard store these arrays make; ``finished=False``: as it is
        created, before the shard's vectors and graph are written."""
        m = Manifest(dim=mem.vectors.shape[1], dtype=mem.vectors.dtype.str, metric=mem.metric, k=mem.params.k,
                     shard_rows=mem.shard_rows, params=mem.params, seed=mem.seed)
        m.hold_ids_of(mem.rows)
        if finished:
            m.shards = [ShardEntry(id=0, offset=0, rows=mem.rows, graph=GRAPH_VERSION)]
            m.timings, m.estimate = dict(mem.summary["phase_s"]), mem.estimate
        return m
