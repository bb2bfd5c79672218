"""``Graph``'s search-graph methods (prune, search, truth, search_sweep): the Python side of ``bigknn prune``,
``bigknn search``, ``bigknn truth`` and ``bigknn eval search``, kept apart from bigknn/stored_graph.py, which
mixes them in."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from bigknn import plot as draw
from bigknn.backends import get_backend
from bigknn.core.errors import BadInput
from bigknn.formats import write_truth
from bigknn.operations.export_parquet import write_found_parquet
from bigknn.engine.pending import HOST_MEM_FRACTION, physical_memory
from bigknn.core.progress import reporter
from bigknn.operations import search as run
from bigknn.operations.loaded_index import IndexSlot, LoadedIndex
from bigknn.algorithms.search_params import ALPHA, PruneParams
from bigknn.operations.prune import prune as run_prune
from bigknn.operations.search_queries import load_queries, read_queries
from bigknn.operations.search_reports import PruneReport, SearchReport, SearchResult, SearchSweep, TruthReport
from bigknn.operations.search_stream import open_request
from bigknn.shards import Store

PathLike = str | os.PathLike


class SearchMethods:
    """Mixed into ``bigknn.Graph``; ``_live()`` gives the open store, ``_search_slot`` the loaded index that
    ``search`` keeps between calls (Graph's ``close()`` frees it)."""

    _search_slot: IndexSlot

    def _live(self) -> Store:  # pragma: no cover - Graph's
        raise NotImplementedError

    def prune(self, method: str = "tsdg", degree: int = 32, alpha: float = ALPHA, backend: str = "auto",
              gpu_mem: int | None = None, host_mem: int | None = None, wait: float = 0.0,
              progress: bool = False) -> PruneReport:
        """Turn the kNN graph into a search graph of at most ``degree`` edges a row and commit it to the store
        (the kNN graph stays as it is). ``method``: "tsdg" (two-stage diversification, ``alpha`` its first
        stage's relaxation) or "rng" (relative-neighbourhood rule plus GGNN's symmetric links). ``host_mem``:
        bytes of host RAM the prune may hold all vectors in (default: half the machine's); beyond, the
        neighbours' vectors are read from the store batched, shard by shard.

        Examples
        --------
        >>> import numpy as np, bigknn
        >>> x = np.random.default_rng(0).normal(size=(2000, 8)).astype(np.float32)
        >>> with bigknn.build(x, k=16, backend="cpu") as g:
        ...     r = g.prune("rng", degree=16, backend="cpu")
        >>> r.method, r.degree, 0 < r.mean_degree <= 16
        ('rng', 16, True)
        """
        store = self._live()
        host = int(physical_memory() * HOST_MEM_FRACTION) if host_mem is None else host_mem
        summary = run_prune(store.path, PruneParams(method, degree, alpha), get_backend(backend, gpu_mem),
                            reporter(progress), host, wait)
        self._search_slot.close()  # the index search kept is the old graph's
        self._store = Store.open(store.path)
        return PruneReport(**summary)

    def search(self, queries: Any, k: int = 10, budget: float | None = None, batch: int | None = None,
               procedure: str = "auto", seed: int = 0, out: PathLike | None = None, backend: str = "auto",
               gpu_mem: int | None = None, ids: str = "row") -> SearchResult:
        """The k nearest rows of each query (an array or a vector file) found by searching the pruned graph.
        ``batch``: queries searched together (default all); ``procedure``: "small" (independent greedy
        searches, ``budget`` of them per query), "large" (best-first, ``budget`` the search list's length) or
        "auto" (large, at every batch size). ``out``: also write
        the ids and distances to this ``.ibin``, or ``.parquet`` (query, rank, id, distance). ``ids="user"``: the
        ids are the user's the store keeps (built with ``id_column``; -1, or None among strings, where fewer
        were found), and ``out`` must be a ``.parquet``.

        The first call loads the search graph (``search_index``) and the graph keeps it for the next calls
        with the same ``backend`` and ``gpu_mem`` until ``close()``; a call may come from any thread.

        Examples
        --------
        >>> import numpy as np, bigknn
        >>> x = np.random.default_rng(0).normal(size=(2000, 8)).astype(np.float32)
        >>> with bigknn.build(x, k=16, backend="cpu") as g:
        ...     _ = g.prune(degree=16, backend="cpu")
        ...     found = g.search(x[:5], k=3, backend="cpu")
        >>> found.ids[:, 0].tolist()
        [0, 1, 2, 3, 4]
        """
        store = self._live()
        if out is not None:
            run.check_output(Path(out), run.SEARCH_OUTPUTS)
            if ids == "user" and Path(out).suffix.lower() != ".parquet":
                raise BadInput(out, "results in user ids are written as .parquet")
        q, name = read_queries(queries, store.manifest)
        users = self._user_ids(ids)
        found = self._search_slot.search(store, backend, gpu_mem, q, name, k, budget, batch, procedure, seed)
        if out is not None:
            if Path(out).suffix.lower() == ".parquet":
                write_found_parquet(out, found.ids, found.distances, users)
            else:
                write_truth(out, found.ids, found.distances)
            found = replace(found, report=replace(found.report, out=str(out)))
        return found if users is None else replace(found, ids=users.take(found.ids))

    def search_file(self, queries: PathLike, out: PathLike, k: int = 10, budget: float | None = None,
                    batch: int | None = None, procedure: str = "auto", seed: int = 0, backend: str = "auto",
                    gpu_mem: int | None = None, progress: bool = False) -> SearchReport:
        """``bigknn search``: a query file of any size streamed in batches of ``batch`` (default 10,000) through
        one loaded index, the results written to ``out`` (.ibin) as they come; the input is checked before
        the index loads. Returns the report (QPS of the searches; ``wall_s`` of the whole run).

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np, bigknn
        >>> from bigknn.formats import read_truth, write_vectors
        >>> x = np.random.default_rng(0).normal(size=(2000, 8)).astype(np.float32)
        >>> d = tempfile.mkdtemp()
        >>> write_vectors(os.path.join(d, "q.fbin"), x[:30])
        >>> with bigknn.build(x, k=16, backend="cpu") as g:
        ...     _ = g.prune(degree=16, backend="cpu")
        ...     r = g.search_file(os.path.join(d, "q.fbin"), os.path.join(d, "o.ibin"), k=3, batch=7, backend="cpu")
        >>> r.queries, read_truth(os.path.join(d, "o.ibin"))[0][:3, 0].tolist()
        (30, [0, 1, 2])
        """
        store = self._live()
        open_request(Path(queries), Path(out), store.manifest, k, budget, batch, procedure, seed)
        with self.search_index(backend, gpu_mem) as index:
            return index.search_file(queries, out, k, budget, batch, procedure, seed, progress)

    def search_index(self, backend: str = "auto", gpu_mem: int | None = None) -> LoadedIndex:
        """The search graph loaded for serving: ``index.search(queries, k, budget)`` does only the search
        (graph, rows, entry points and device copy made here, once). Thread-safe; free it with ``close()``
        or a ``with`` block (it stays usable after the graph is closed).

        Examples
        --------
        >>> import numpy as np, bigknn
        >>> x = np.random.default_rng(0).normal(size=(2000, 8)).astype(np.float32)
        >>> with bigknn.build(x, k=16, backend="cpu") as g:
        ...     _ = g.prune(degree=16, backend="cpu")
        ...     with g.search_index(backend="cpu") as index:
        ...         found = index.search(x[:4], k=3, budget=32)
        >>> found.ids[:, 0].tolist(), found.report.procedure
        ([0, 1, 2, 3], 'large')
        """
        return LoadedIndex(self._live(), get_backend(backend, gpu_mem))

    def truth(self, queries: Any, out: PathLike, k: int = 10, backend: str = "auto",
              gpu_mem: int | None = None) -> TruthReport:
        """Write the exact k nearest rows of each query (a brute-force scan of the store) to ``out`` (.ibin),
        the ground truth ``search_sweep`` measures recall against.

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np, bigknn
        >>> from bigknn.formats import read_truth
        >>> x = np.random.default_rng(0).normal(size=(500, 4)).astype(np.float32)
        >>> gt = os.path.join(tempfile.mkdtemp(), "gt.ibin")
        >>> with bigknn.build(x, k=8, backend="cpu") as g:
        ...     r = g.truth(x[:3] + 0.001, gt, k=2, backend="cpu")
        >>> read_truth(gt)[0][:, 0].tolist()
        [0, 1, 2]
        """
        store = self._live()
        return run.truth(store, load_queries(queries, store.manifest), get_backend(backend, gpu_mem), k, Path(out))

    def search_sweep(self, queries: Any, truth: PathLike, k: int = 10, budgets: list[float] | None = None,
                     batch: int | None = None, procedure: str = "auto", seed: int = 0, backend: str = "auto",
                     gpu_mem: int | None = None, plot: PathLike | None = None) -> SearchSweep:
        """Recall@k against ``truth`` (an .ibin of ``truth``) and queries per second at each search budget
        (default: the procedure's sweep); ``plot``: also draw recall against QPS into this image file
        (matplotlib: ``bigknn[plot]``). The other parameters are ``search``'s.

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np, bigknn
        >>> rng = np.random.default_rng(0)
        >>> x, q = rng.normal(size=(2000, 8)).astype(np.float32), rng.normal(size=(50, 8)).astype(np.float32)
        >>> gt = os.path.join(tempfile.mkdtemp(), "gt.ibin")
        >>> with bigknn.build(x, k=16, backend="cpu") as g:
        ...     _ = g.prune(degree=16, backend="cpu")
        ...     _ = g.truth(q, gt, backend="cpu")
        ...     sweep = g.search_sweep(q, gt, budgets=[10, 64], procedure="large", backend="cpu")
        >>> [p.budget for p in sweep.points], sweep.points[-1].recall >= 0.9
        ([10.0, 64.0], True)
        """
        store = self._live()
        if plot is not None:
            draw.pyplot(Path(plot))  # refuse before the work
        q = load_queries(queries, store.manifest)
        with self.search_index(backend, gpu_mem) as loaded:
            result = run.sweep(loaded, q, Path(truth), k, budgets, batch, procedure, seed)
        if plot is not None:
            draw.search_curve(Path(plot), result)
            result = SearchSweep(**{**result.__dict__, "plot": str(plot)})
        return result
