"""``bigknn eval recall``: recall@k of the stored graph against exact neighbours of sampled rows.

Exact neighbours come from the backend's exact kNN streamed over every shard (bounded memory), or from
a ground-truth ``.ibin``. Self is excluded on both sides, and ties count: a graph neighbour whose
true key is no larger than the exact k-th key is correct, even if the exact list chose another row
at that distance (duplicates make such ties common).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from bigknn.backends import Backend
from bigknn.core.errors import BadInput
from bigknn.formats import read_truth
from bigknn.core.knn_graph import EMPTY, drop_self
from bigknn.core.metric import metric as metric_of
from bigknn.algorithms.partition.rowmap import RowMap
from bigknn.algorithms.recall_target import within_kth
from bigknn.shards import Store

SAMPLE_ROWS = 10_000  # default rows whose exact neighbours are computed
RECALL_K = 10  # default k of recall@k


def recall(store: Store, backend: Backend, sample: int = SAMPLE_ROWS, k: int = RECALL_K,
           truth: Path | None = None, seed: int = 0, rows: tuple[int, int] | None = None) -> dict:
    """Recall@k on ``sample`` rows drawn from all rows, or from global rows [lo, hi) when ``rows`` is given."""
    return recall_rows(store, backend, sample, k, truth, seed, rows)[0]


def recall_rows(store: Store, backend: Backend, sample: int = SAMPLE_ROWS, k: int = RECALL_K,
                truth: Path | None = None, seed: int = 0,
                rows: tuple[int, int] | None = None) -> tuple[dict, np.ndarray, np.ndarray]:
    """``recall``'s summary, the sampled global rows, and each one's recall@k (what ``--plot`` draws)."""
    m = store.manifest
    m.require_complete(store.path)  # the recall of an unfinished graph is no measure of anything
    if k > m.k:
        raise BadInput(store.path, f"--k {k} exceeds the graph's k = {m.k}")
    metric = metric_of(m.metric)
    t0 = time.perf_counter()
    if truth is not None:
        truth_ids, _ = read_truth(truth)
        if truth_ids.shape[0] > m.rows:
            raise BadInput(truth, f"has {truth_ids.shape[0]} rows; the store has {m.rows}")
        if truth_ids.shape[1] < k + 1:
            raise BadInput(truth, f"holds {truth_ids.shape[1]} neighbours per row; recall@{k} needs {k + 1}")
        pool = truth_ids.shape[0]
    else:
        pool = m.rows
    lo, hi = rows if rows is not None else (0, pool)
    if not 0 <= lo < hi <= pool:
        raise BadInput(store.path, f"--rows {lo}:{hi} is outside the {pool} rows")
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(np.arange(lo, hi), size=min(sample, hi - lo), replace=False))
    rowmap = RowMap.of(store)  # rows and truth are input rows; the store is read by position
    positions = rowmap.to_position(rows)
    q = store.vectors_of(positions).astype(np.float32)
    if truth is not None:
        exact_ids = without_self(np.asarray(truth_ids[rows]), rows, k)
        _check_truth_ids(truth, exact_ids, rows, m.rows)
        exact_ids = rowmap.to_position(exact_ids)
    else:
        blocks = ((s.offset, store.read_vectors(s.id)) for s in m.shards)
        exact_ids = without_self(backend.exact_knn(q, k + 1, metric, blocks).ids, positions, k)
    t_exact = time.perf_counter() - t0
    kth_key = metric.row_keys(q, store.vectors_of(exact_ids[:, -1]))
    graph_ids = graph_rows(store, positions)[:, :k]
    valid = graph_ids != EMPTY
    nb = store.vectors_of(np.where(valid, graph_ids, 0).ravel()).reshape(len(rows), k, -1)
    keys = metric.row_keys(q[:, None, :], nb)
    correct = valid & within_kth(keys, kth_key)
    per_row = correct.sum(axis=1) / k
    summary = {"store": str(store.path), "recall": round(float(per_row.mean()), 5), "k": k, "sample": len(rows),
               "rows": [lo, hi], "truth": str(truth) if truth else "exact", "backend": backend.name,
               "exact_s": round(t_exact, 3), "wall_s": round(time.perf_counter() - t0, 3)}
    return summary, rows, per_row


def _check_truth_ids(truth: Path, ids: np.ndarray, rows: np.ndarray, store_rows: int) -> None:
    """Refuse ground truth naming rows the store does not have: their vectors would be garbage."""
    bad = (ids < 0) | (ids >= store_rows)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise BadInput(truth, f"row {int(rows[r])} lists id {int(ids[r, c])}, outside the store's {store_rows} rows")


def without_self(ids: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """Top-k neighbour ids with the row itself removed."""
    ids = np.asarray(ids)
    return drop_self(ids, np.zeros(ids.shape, np.float32), rows)[0][:, :k]


def graph_rows(store: Store, rows: np.ndarray) -> np.ndarray:
    """The committed graph's neighbour ids (store positions) of the given store positions."""
    out = np.empty((len(rows), store.manifest.k), dtype=np.int64)
    for shard in store.manifest.shards:
        sel = np.nonzero((rows >= shard.offset) & (rows < shard.offset + shard.rows))[0]
        if sel.size:
            out[sel] = store.read_graph(shard.id).ids[rows[sel] - shard.offset, :store.manifest.k]
    return out
