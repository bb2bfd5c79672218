"""A search graph loaded once and searched many times (``Graph.search_index``): what a server holds.

Loading reads the whole search graph and every row's vector, works out what each search starts from (the
roots every row is reachable from, the entry rows of the default seed) and searches a batch of one and a big
batch (one query, or where the backend ``search_warms_by_shape`` a whole batch of the index's own rows), so
that the backend has its copy (the CUDA backend: on the device) and the kernels of both ready (on a device
also the big batch's GEMM and memory blocks: a streamed search's first batch runs as fast as its others). After
that a call does only the search: the queries checked and prepared, the backend's batch search, the ids
mapped to input rows.

``IndexSlot`` is the one loaded index ``Graph.search`` keeps between calls, replaced when the backend or the
search graph changes and freed by ``Graph.close()``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bigknn.backends import Backend, get_backend
from bigknn.core.errors import BadInput
from bigknn.core.knn_graph import KnnGraph
from bigknn.core.metric import metric as metric_of, user_distance
from bigknn.algorithms.partition.rowmap import RowMap
from bigknn.algorithms.search_index import SearchIndex, entry_rows
from bigknn.algorithms.search_params import SearchPlan
from bigknn.operations.search_queries import read_queries
from bigknn.operations.search_reports import SearchReport, SearchResult
from bigknn.operations.search import make_plan, procedure_for
from bigknn.operations.search_arrays import load_index
from bigknn.operations.search_stream import search_file
from bigknn.shards import Store

WARM_BATCHES = (1, 10_000)  # searched once at load: the kernels of one query a call and of big batches ready


class LoadedIndex:
    """A store's search graph held in memory (and on the backend's device) until ``close()``.

    ``search(queries, k, budget)`` returns a ``SearchResult`` as ``Graph.search`` does. Thread-safe: a lock
    serialises the searches of one index (a GPU runs one batch at a time anyway), so a web server's threads
    may share it; to search in parallel on the CPU, give each thread a batch of queries instead. A ``with``
    block closes it at its end.

    Examples
    --------
    >>> import numpy as np, bigknn
    >>> x = np.random.default_rng(0).normal(size=(2000, 8)).astype(np.float32)
    >>> with bigknn.build(x, k=16, backend="cpu") as g:
    ...     _ = g.prune(degree=16, backend="cpu")
    ...     with g.search_index(backend="cpu") as index:
    ...         first = index.search(x[:3], k=2).ids[:, 0].tolist()
    ...         one = index.search(x[7], k=2).ids[0, 0]
    >>> first, int(one)
    ([0, 1, 2], 7)
    """

    def __init__(self, store: Store, backend: Backend):
        m = store.manifest
        self.manifest = m
        self.store_path = str(store.path)
        self._index: SearchIndex | None
        self._index, self.entry = load_index(store, metric_of(m.metric))
        self.rowmap = RowMap.of(store)  # the index searches store positions; users see input rows
        self._backend = backend
        self._lock = threading.Lock()
        self._plans: dict[tuple, SearchPlan] = {}
        self._prepare()

    @property
    def backend(self) -> str:
        return self._backend.name

    @property
    def rows(self) -> int:
        return self._live().rows

    @property
    def arrays(self) -> SearchIndex:
        """The graph and rows a search reads (store positions, kernel metric keys)."""
        return self._live()

    def _prepare(self) -> None:
        """Everything a search computes once per index, done now rather than in the first call."""
        index = self._live()
        entry_rows(index, 0)  # the roots too
        if index.rows:
            plan = self.plan(min(10, index.rows), None, "auto", 0)
            for batch in WARM_BATCHES:
                rows = min(batch if self._backend.search_warms_by_shape else 1, index.rows)
                self._search_batches(index, np.ascontiguousarray(index.vectors[:rows]), "warm-up", 0, plan, batch)

    def plan(self, k: int, budget: float | None, procedure: str, seed: int) -> SearchPlan:
        """The checked plan of a search (BadInput on a knob that cannot work), made once per set of knobs."""
        key = (k, budget, procedure, seed)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = make_plan(procedure_for(procedure), budget, k, seed)
        return plan

    def search(self, queries: Any, k: int = 10, budget: float | None = None, batch: int | None = None,
               procedure: str = "auto", seed: int = 0) -> SearchResult:
        """The k nearest rows of each query (an array, or one vector) that the search finds, nearest first.
        ``batch``: queries searched together (default all); the other knobs are ``Graph.search``'s."""
        q, name = read_queries(queries, self.manifest)
        return self.search_rows(q, name, 0, k, budget, batch, procedure, seed)

    def search_rows(self, q: np.ndarray, name: str, first_row: int, k: int, budget: float | None, batch: int | None,
                    procedure: str, seed: int) -> SearchResult:
        """``search`` of query rows as read (bigknn/operations/search_queries.py read_queries): each batch is
        checked and prepared by the backend where it searches it (an error names ``name`` and row
        ``first_row + i``): a streamed query file's blocks, ``Graph.search``'s queries."""
        batch = len(q) if batch is None else batch
        if batch < 1:
            raise BadInput(f"--batch {batch}", "must be at least 1")
        plan = self.plan(k, budget, procedure, seed)
        with self._lock:
            index = self._live()
            t0 = time.perf_counter()
            found = self._search_batches(index, q, name, first_row, plan, batch)
            dt = time.perf_counter() - t0
        report = SearchReport(store=self.store_path, queries=len(q), k=k, procedure=plan.procedure,
                              budget=plan.budget, batch=batch, qps=round(len(q) / max(dt, 1e-9), 1),
                              search_s=round(dt, 6), backend=self._backend.name)
        return SearchResult(self.rowmap.to_input(found.ids), user_distance(found.dists, self.manifest.metric),
                            report)

    def _search_batches(self, index: SearchIndex, q: np.ndarray, name: str, first_row: int, plan: SearchPlan,
                        batch: int) -> KnnGraph:
        """Each batch checked and prepared by the backend, then searched, one after the other."""
        parts = [self._backend.graph_search(
                     index, self._backend.searched_queries(q[b0:b0 + batch], index.metric, name, first_row + b0),
                     plan, batch)
                 for b0 in range(0, len(q), batch)]
        if len(parts) == 1:
            return parts[0]
        return KnnGraph(np.concatenate([p.ids for p in parts]), np.concatenate([p.dists for p in parts]))

    def search_file(self, queries: str | Path, out: str | Path, k: int = 10, budget: float | None = None,
                    batch: int | None = None, procedure: str = "auto", seed: int = 0,
                    progress: bool = False) -> SearchReport:
        """Search a query file of any size batch by batch and write the results to ``out`` (.ibin) as they
        come (the file appears whole at the end); ``bigknn search``. Returns the report of the whole run."""
        return search_file(self, Path(queries), Path(out), k, budget, batch, procedure, seed, progress)

    def close(self) -> None:
        """Free the index: the backend forgets its copy (device memory too), the host arrays go."""
        with self._lock:
            if self._index is not None:
                self._backend.forget_index(self._index)
                self._index = None

    @property
    def closed(self) -> bool:
        return self._index is None

    def _live(self) -> SearchIndex:
        if self._index is None:
            raise ValueError("the search index is closed")
        return self._index

    def __enter__(self) -> LoadedIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._index is None:
            return "<bigknn LoadedIndex (closed)>"
        return (f"<bigknn LoadedIndex {self._index.rows} rows, degree {self.entry.degree}, {self.manifest.metric}, "
                f"backend {self._backend.name}, store {self.store_path}>")


class IndexSlot:
    """The loaded index ``Graph.search`` reuses: the same (backend, gpu_mem) on the same search graph gets
    the index loaded before; anything else closes it and loads anew. Searches hold the slot's lock, so a
    thread that asks for other options never closes an index under another thread's search."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: tuple | None = None
        self._loaded: LoadedIndex | None = None

    def search(self, store: Store, backend: str, gpu_mem: int | None, q: np.ndarray, name: str, k: int,
               budget: float | None, batch: int | None, procedure: str, seed: int) -> SearchResult:
        """``LoadedIndex.search_rows`` on the index of these options, loaded first where it is not."""
        key = (backend, gpu_mem, str(store.path), _search_key(store))
        with self._lock:
            if self._loaded is None or self._key != key:
                self._close_held()
                self._loaded = LoadedIndex(store, get_backend(backend, gpu_mem))
                self._key = key
            return self._loaded.search_rows(q, name, 0, k, budget, batch, procedure, seed)

    def close(self) -> None:
        with self._lock:
            self._close_held()

    def _close_held(self) -> None:
        """Close the held index (the caller holds the lock)."""
        if self._loaded is not None:
            self._loaded.close()
        self._loaded, self._key = None, None


def _search_key(store: Store) -> tuple:
    """What names the committed search graph and the rows it indexes: a prune or an ingest changes it."""
    m = store.manifest
    if m.search is None:
        return (m.rows, None)
    return (m.rows, m.search.version, tuple(m.search.graphs))
