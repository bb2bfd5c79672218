"""Typed results of the Python API (``bigknn.api``).

Each report carries the fields of the JSON object the matching CLI command prints, in the same order, so
``to_dict()`` is that object: the CLI prints what the API returns.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import numpy as np

from bigknn.shards import Manifest, Store, user_ids


class Neighbors(NamedTuple):
    """Each row's neighbours, nearest first: ``ids`` (rows, k) row numbers (int32; int64 in a store past 2^31
    rows) and ``distances`` (rows, k) float32, ascending per row (``bigknn.core.metric.user_distance``). A tuple, so
    ``ids, distances = graph.neighbors()`` works."""

    ids: np.ndarray
    distances: np.ndarray


class _Report:
    def to_dict(self) -> dict[str, Any]:
        """The fields as the JSON object the CLI prints."""
        return asdict(self)


@dataclass(frozen=True)
class RecallEstimate(_Report):
    """The recall@``at`` a build measured on a fixed sample of ``rows`` rows against their exact
    neighbours over the whole input: mean ``recall`` with its 99 % interval [``low``, ``high``], for the
    ``target`` the build aimed at (0: none). ``graph_rows``: rows in the graph when it was measured (rows
    ingested since are not covered)."""

    recall: float
    low: float
    high: float
    rows: int
    at: int
    target: float
    graph_rows: int

    @classmethod
    def from_manifest(cls, estimate: dict | None) -> RecallEstimate | None:
        return None if estimate is None else cls(**estimate)


@dataclass(frozen=True)
class Info(_Report):
    """What a store holds: shape, metric and k of its graph, build progress (``complete`` once every shard
    has its graph and every pair is merged), the input files, disk use, seconds per phase summed over runs,
    the build's recall estimate (None for builds without a recall target), and the search graph's record
    (the manifest's ``search`` entry: version, method, degree, mean degree; None before ``bigknn prune``)."""

    store: str
    format: int
    rows: int
    dim: int
    dtype: str
    metric: str
    k: int
    shards: int
    shards_built: int
    merges_done: int
    merges_pending: int
    complete: bool
    partition: str  # kmeans, rptree or contiguous (bigknn/algorithms/partition/)
    inputs: list[str]
    disk_bytes: int
    timings_s: dict[str, float]
    recall_estimate: RecallEstimate | None
    search: dict | None = None
    user_ids: str | None = None  # "column (int64|string)": the --id-column the store keeps, None without

    @classmethod
    def of(cls, store: Store) -> Info:
        m = store.manifest
        return cls.of_manifest(m, store=str(store.path), shards=len(m.shards), shards_built=m.shards_built,
                               merges_done=len(m.merged), merges_pending=m.merges_pending,
                               inputs=[i["path"] for i in m.inputs], disk_bytes=store.disk_bytes(),
                               search=m.search.to_dict() if m.search is not None else None, user_ids=_user_ids(store))

    @classmethod
    def of_manifest(cls, m: Manifest, **where: Any) -> Info:
        """The fields a manifest gives alike for a store and a graph held in arrays; ``where``: the rest (the
        store's path, shards, merges, inputs, disk use, search graph and user ids, as the caller knows them)."""
        return cls(format=m.format, rows=m.rows, dim=m.dim, dtype=m.dtype, metric=m.metric, k=m.k,
                   complete=m.complete, partition=m.partition_method, timings_s=m.timings,
                   recall_estimate=RecallEstimate.from_manifest(m.estimate), **where)


def _user_ids(store: Store) -> str | None:
    kind = user_ids.stored_kind(store.path, store.manifest.rows)
    return None if kind is None else f"{store.manifest.inputs[0].get('id_column')} ({kind})"


@dataclass(frozen=True)
class BuildReport(_Report):
    """What a build (or the resumed rest of one) did: the graph's shape, shards and merges, the backend
    and its worker count, wall time and seconds per phase (summed over workers) with each phase's wall-clock
    span, gigabytes read and written, each worker's busy fraction, how its recall-targeted descents ended
    (per phase: count, iterations, widenings, stop reasons), and the recall estimate it recorded."""

    store: str
    rows: int
    dim: int
    k: int
    metric: str
    shards: int
    merges_done: int
    merges_total: int  # the pairs the plan merges (a partitioned store's near pairs; else all_pairs)
    all_pairs: int
    partition: str
    backend: str
    workers: int
    resumed: bool
    wall_s: float
    phase_s: dict[str, float]
    phase_wall_s: dict[str, list[float]]
    read_gb: float
    written_gb: float
    busy_frac: dict[str, float]
    # each GNND and merge: worker, phase, start, end (s); where it had a recall target, its iterations, why it
    # stopped and its last estimate (recall and interval on its probe's rows)
    timeline: list[dict]
    descents: dict[str, dict]
    recall_estimate: RecallEstimate | None
    search: dict | None = None
    written_bytes: int = 0  # what written_gb rounds: every byte the run put on disk, the manifest's included
    read_bytes: int = 0  # what read_gb rounds (bigknn plan's read_bytes models it)

    @classmethod
    def from_summary(cls, summary: dict) -> BuildReport:
        return cls(**{**summary, "recall_estimate": RecallEstimate.from_manifest(summary["recall_estimate"])})


@dataclass(frozen=True)
class RecallReport(_Report):
    """Recall@``k`` measured on ``sample`` rows drawn from global rows [``rows[0]``, ``rows[1]``): self
    excluded, ties with the exact k-th neighbour counted; ``truth`` is "exact" or the ground-truth file;
    ``exact_s`` of the ``wall_s`` went to finding the exact neighbours."""

    store: str
    recall: float
    k: int
    sample: int
    rows: list[int]
    truth: str
    backend: str
    exact_s: float
    wall_s: float
    plot: str | None = None  # the picture of per-row and per-shard recall, where one was asked for


@dataclass(frozen=True)
class InDegrees(_Report):
    """How many neighbour lists (their first ``k`` entries) the graph's rows appear in: the mean is k; ``max``
    and ``p99`` show hubs, ``zero`` counts rows in no list (never anyone's neighbour); ``plot``: the picture."""

    k: int
    mean: float
    p99: float
    max: int
    zero: int
    plot: str | None = None

    @classmethod
    def of(cls, degrees: np.ndarray, k: int, plot: str | None = None) -> InDegrees:
        return cls(k=k, mean=round(float(degrees.mean()), 3), p99=float(np.percentile(degrees, 99)),
                   max=int(degrees.max()), zero=int((degrees == 0).sum()), plot=plot)


@dataclass(frozen=True)
class IngestReport(_Report):
    """What an ingest did: inputs ingested and skipped (already in the store, by size and sha256), drop-folder
    files left for the next run because they were still growing, rows added, the store's rows and shards
    after it, and times (``resumed``: an interrupted ingest it finished first, or None)."""

    store: str
    ingested: list[str]
    skipped: list[str]
    still_being_written: list[str]
    rows_added: int
    rows: int
    shards: int
    wall_s: float
    phase_s: dict[str, float]
    phase_wall_s: dict[str, list[float]]
    timeline: list[dict] = field(default_factory=list)  # each GNND and merge it ran, as BuildReport.timeline
    descents: dict[str, dict] = field(default_factory=dict)  # how they ended, as BuildReport.descents
    resumed: str | None = None
    # per input small enough to join the graph (bigknn/operations/ingest_join.py): its path and rows, the
    # distances evaluated, the old lists and rows gathered, the bytes read and written, the recall checks
    # (``checks``: per effort, the recall on new rows and on the old rows near them; ``check_distances``), and
    # ``declined``: true where no effort reached the target and the batch became a shard instead
    joined: list[dict] = field(default_factory=list)
    # the small shards an older bigknn left, regrouped before the first batch (bigknn/operations/compact.py): shards
    # before and after and the rows moved; None where there were none
    regrouped: dict | None = None


@dataclass(frozen=True)
class MergeReport(_Report):
    """What a merge of stores did (``bigknn merge STORE OTHER...``): the other stores merged and those skipped
    (merged before), rows added, pairs merged by this run, the store's rows, shards and merges after it, times,
    and the recall estimate in the manifest (``graph_rows``: the rows it was measured on, before the merge;
    ``resumed``: an interrupted merge it finished first, or None)."""

    store: str
    merged: list[str]
    skipped: list[str]
    rows_added: int
    merges_run: int
    resumed: str | None
    rows: int
    shards: int
    merges_done: int
    merges_total: int
    wall_s: float
    phase_s: dict[str, float]
    phase_wall_s: dict[str, list[float]]
    recall_estimate: dict | None
    timeline: list[dict] = field(default_factory=list)  # each merge it ran, as BuildReport.timeline
    descents: dict[str, dict] = field(default_factory=dict)  # how they ended, as BuildReport.descents
    shards_linked: int = 0  # the other stores' shards whose rows are hard links to their files, not copies


@dataclass(frozen=True)
class ExportReport(_Report):
    """The files an export wrote (``.npy``: ids, then ``<name>.dists.npy``), their format, and the rows
    and neighbours per row (one more column where ``include_self``)."""

    store: str
    rows: int
    k: int
    format: str
    include_self: bool
    files: list[str]
    ids: str = "row"  # "user": the user's ids the store keeps (``--id-column``)
    edges: int | None = None  # rows of a .parquet edge list
