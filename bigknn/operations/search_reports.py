"""Typed results of pruning and searching (the API returns them; the CLI prints ``to_dict()``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


class _Report:
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PruneReport(_Report):
    """What a prune wrote: the search graph's version, method and degree (``alpha``: TSDG's first-stage
    relaxation, None for rng), its rows, the kNN graph's k, the mean degree, the edges each pass made (forward:
    kept by the first rule; reverse: filed under their targets; symmetric links: GGNN's added links, rng only;
    edges: in the search graph), the backend and the wall time."""

    store: str
    version: int
    method: str
    degree: int
    alpha: float | None
    rows: int
    knn_k: int
    mean_degree: float
    forward_edges: int
    reverse_edges: int
    symmetric_links: int
    edges: int
    backend: str
    wall_s: float


@dataclass(frozen=True)
class SearchReport(_Report):
    """How a search ran: queries, k, procedure (small: TSDG Alg. 1, large: Alg. 2) and its budget (t0 searches
    per query, or the search list's length), the batch size, queries per second over the search calls, the
    backend, and the output file where one was written (with the whole run's wall time, a streamed file)."""

    store: str
    queries: int
    k: int
    procedure: str
    budget: float
    batch: int
    qps: float
    search_s: float
    backend: str
    out: str | None = None
    wall_s: float | None = None  # a streamed query file: the whole run, reading and writing included


@dataclass(frozen=True)
class SearchResult:
    """The k rows a search found for each query, nearest first: ``ids`` (queries, k) int32 (-1 where fewer
    were found), ``distances`` (queries, k) float32 as ``Graph.neighbors`` gives them, and the ``report``."""

    ids: np.ndarray
    distances: np.ndarray
    report: SearchReport


@dataclass(frozen=True)
class SweepPoint(_Report):
    budget: float
    recall: float
    qps: float
    search_s: float


@dataclass(frozen=True)
class SearchSweep(_Report):
    """Recall@k against ground truth (ties with the k-th true neighbour counted) and queries per second, per
    budget, for one batch size and procedure; ``plot``: the picture where one was asked for."""

    store: str
    queries: int
    k: int
    truth: str
    batch: int
    procedure: str
    backend: str
    points: list[SweepPoint]
    plot: str | None = None


@dataclass(frozen=True)
class TruthReport(_Report):
    """The exact k nearest rows of every query, written to ``out`` (.ibin: ids, then distances)."""

    store: str
    queries: int
    k: int
    out: str
    backend: str
    wall_s: float
