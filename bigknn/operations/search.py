"""``bigknn search``, ``bigknn truth`` and ``bigknn eval search``: batch graph search of a query set, its exact
ground truth (the streamed exact k-NN of ``eval recall``), and recall@k against queries per second over a
sweep of search budgets."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bigknn.core.atomic import check_target
from bigknn.backends import Backend
from bigknn.core.errors import BadInput
from bigknn.formats import TRUTH_EXTENSION, read_truth, write_truth
from bigknn.core.knn_graph import EMPTY
from bigknn.core.metric import metric as metric_of, user_distance
from bigknn.algorithms.partition.rowmap import RowMap
from bigknn.algorithms.recall_target import within_kth
from bigknn.algorithms.search_index import SearchIndex
from bigknn.algorithms.search_params import BUDGETS, PROCEDURES, SearchPlan
from bigknn.operations.search_queries import ARRAY_NAME
from bigknn.operations.search_reports import SearchSweep, SweepPoint, TruthReport
from bigknn.shards import Store

if TYPE_CHECKING:
    from bigknn.operations.loaded_index import LoadedIndex

DEFAULT_BUDGET = {"small": 16, "large": 64}
SEARCH_OUTPUTS = (TRUTH_EXTENSION, ".parquet")  # a search's results: .ibin, or a Parquet table (needs pyarrow)
WARMUP_QUERIES = 64  # searched once before timing: kernels compiled, the index on the device


def check_output(out: Path, formats: tuple[str, ...] = (TRUTH_EXTENSION,)) -> None:
    """Refuse (exit 2, before any work) an output not of ``formats`` or that cannot be written."""
    if Path(out).suffix.lower() not in formats:
        raise BadInput(out, f"results are written as {' or '.join(formats)}")
    check_target(Path(out))


def procedure_for(procedure: str) -> str:
    """``auto`` is the large-batch procedure at every batch size: TSDG's small-batch procedure's greedy searches
    stop short of recall 0.97 on text however many (32 seeds), and at batch 1 the large procedure (a block of
    warps a query) is as fast below that (docs/perf-notes.md, session 28)."""
    if procedure not in PROCEDURES:
        raise BadInput(f"--procedure {procedure}", f"choose one of {', '.join(PROCEDURES)}")
    return "large" if procedure == "auto" else procedure


def make_plan(procedure: str, budget: float | None, k: int, seed: int) -> SearchPlan:
    plan = SearchPlan(procedure, DEFAULT_BUDGET[procedure] if budget is None else float(budget), k, seed)
    try:
        plan.check()
    except ValueError as e:
        option, problem = str(e).split(": ", 1)
        raise BadInput(option, problem) from None
    return plan


def truth(store: Store, queries: np.ndarray, backend: Backend, k: int, out: Path) -> TruthReport:
    """The exact k nearest rows of every query over the whole store, written to ``out``."""
    m = store.manifest
    m.require_complete(store.path)
    check_output(out)
    if not 1 <= k <= m.rows:
        raise BadInput(f"--k {k}", f"is outside 1..{m.rows} (the store's rows)")
    t0 = time.perf_counter()
    blocks = ((s.offset, store.read_vectors(s.id)) for s in m.shards)
    g = backend.exact_knn(queries, k, metric_of(m.metric), blocks)
    write_truth(out, RowMap.of(store).to_input(g.ids), user_distance(g.dists, m.metric))
    return TruthReport(store=str(store.path), queries=len(queries), k=k, out=str(out), backend=backend.name,
                       wall_s=round(time.perf_counter() - t0, 3))


def recall_against(index: SearchIndex, queries: np.ndarray, found: np.ndarray, truth_ids: np.ndarray,
                   k: int) -> float:
    """Mean recall@k: a found row counts when its key is within the k-th true neighbour's (ties count)."""
    kth = index.metric.row_keys(queries, index.vectors[truth_ids[:, k - 1]])
    got = found[:, :k].astype(np.int64)
    valid = got != EMPTY
    keys = index.metric.row_keys(queries[:, None, :], index.vectors[np.where(valid, got, 0)])
    correct = valid & within_kth(keys, kth)
    return float(correct.sum(axis=1).mean() / k)


def load_truth(path: Path, queries: int, k: int, rows: int) -> np.ndarray:
    """Ground-truth ids (queries, >= k), checked against the query set and the store."""
    ids, _ = read_truth(path)
    if ids.shape[0] != queries:
        raise BadInput(path, f"has {ids.shape[0]} rows; the query set has {queries}")
    if ids.shape[1] < k:
        raise BadInput(path, f"holds {ids.shape[1]} neighbours per query; recall@{k} needs {k}")
    ids = np.asarray(ids[:, :k], np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= rows):
        raise BadInput(path, f"lists ids outside the store's {rows} rows (ground truth of another base set?)")
    return ids


def sweep(loaded: LoadedIndex, queries: np.ndarray, truth_path: Path, k: int, budgets: list[float] | None,
          batch: int | None, procedure: str = "auto", seed: int = 0) -> SearchSweep:
    """Recall@k and queries per second of the search at each budget, timed through the loaded index as a
    user's searches are (one warm-up search first)."""
    index = loaded.arrays
    truth_ids = loaded.rowmap.to_position(load_truth(truth_path, len(queries), k, index.rows))
    batch = len(queries) if batch is None else batch
    if batch < 1:
        raise BadInput(f"--batch {batch}", "must be at least 1")
    proc = procedure_for(procedure)
    budgets = list(BUDGETS[proc]) if not budgets else budgets
    for b in budgets:
        loaded.plan(k, b, proc, seed)  # every budget checked before the first search
    loaded.search_rows(queries[:WARMUP_QUERIES], ARRAY_NAME, 0, k, budgets[0], batch, proc, seed)  # its kernels
    points = []
    for b in budgets:
        found = loaded.search_rows(queries, ARRAY_NAME, 0, k, b, batch, proc, seed)
        recall = recall_against(index, queries, loaded.rowmap.to_position(found.ids), truth_ids, k)
        points.append(SweepPoint(budget=found.report.budget, recall=round(recall, 5), qps=found.report.qps,
                                 search_s=round(found.report.search_s, 4)))
    return SearchSweep(store=loaded.store_path, queries=len(queries), k=k, truth=str(truth_path), batch=batch,
                       procedure=proc, backend=loaded.backend, points=points)
