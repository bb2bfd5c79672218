"""What a Dask worker runs: GNND of one shard, GGM of one pair, and the flush of its pending graphs. Imports
nothing of dask.

A task opens the store by path (it must be on a file system the worker sees), reads the shard graph versions
the client named, runs the backend, and keeps the new graphs in this worker's memory as pending versions
(``PartCache``, bigknn/engine/dask/part_cache.py) under version numbers it claims for itself (``claim_version``:
an exclusive mkdir, so two attempts of one task, a retry and a straggler on a worker the scheduler gave up
on, never share one). The client sends every task that reads a pending version to the worker holding it, or
has the holder hand it over (``hand_over``: Dask moves it to the task's worker), and has each worker write
its pending versions (``flush``) at checkpoints, when a shard is done, to make room, and at the end: a shard
merged many times between checkpoints is written once, not after every merge (issue 14: 42 GB written
against 7.7 GB in-process on 10M x 96). Nothing here writes the manifest: the
client, the one committer, records the versions a flush wrote. A version never committed is an
unreferenced directory that a later commit deletes (bigknn/shards/store.py).

A worker runs two tasks at once (``connect.TASK_THREADS``) but their backend calls one at a time
(``COMPUTE_LOCK``): one task's reads, upload and graph writes overlap the other's GPU (or CPU) compute, so
the device does not wait on the disk, and the two never share its memory or its cores.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bigknn.backends import Backend, get_backend
from bigknn.engine.dask.part_cache import PartCache
from bigknn.core.knn_graph import KnnGraph, ShardPart, shard_graph_to_global, widened
from bigknn.core.metric import metric as metric_of
from bigknn.shards import Manifest, Store

# held by a task's backend calls: one task computes at a time on a worker's GPU (its memory budget is planned
# for one call) or CPU (a numba kernel takes every core), while the worker's other task reads or writes
COMPUTE_LOCK = threading.Lock()


@dataclass(frozen=True)
class StoreSpec:
    """What every task needs to open the store and run the backend: its path, the manifest's header (no
    shard list: the client's in-memory manifest is ahead of the disk's during a run) and the backend."""

    path: str
    header: Manifest
    backend: str
    gpu_mem: int | None

    @classmethod
    def of(cls, store: Store, backend: str, gpu_mem: int | None) -> "StoreSpec":
        header = replace(store.manifest, inputs=[], shards=[], merged=[], timings={}, pending=None,
                         estimate=None, search=None)
        return cls(str(Path(store.path).resolve()), header, backend, gpu_mem)


@dataclass(frozen=True)
class ShardRef:
    """A shard as a task reads it: id, global offset of its first row, the graph version to read (None:
    vectors only, before GNND), and whether that version is pending (only in the memory of the worker the
    task is sent to)."""

    id: int
    offset: int
    version: int | None
    pending: bool = False


class PendingLost(Exception):
    """The pending graph versions of these shards are not in this worker's memory: the worker that held them
    died (Dask ran the task elsewhere), or restarted."""

    def __init__(self, shards: list[int]):
        super().__init__(shards)
        self.shards = shards


@dataclass
class TaskResult:
    """What the client needs to record and account a task: the pending graph versions made (shard ->
    version), how the descent ended, seconds of compute, bytes read, the worker, and for a GNND the sample's
    exact neighbours among the shard's rows."""

    versions: dict[int, int]
    report: dict | None
    seconds: float
    bytes_read: int
    worker: str
    truth: KnnGraph | None = None


@dataclass
class FlushResult:
    """What a flush did: versions now on disk (shard -> version), those this worker does not hold (lost),
    bytes written, seconds spent writing, the worker."""

    written: dict[int, int]
    missing: list[int]
    bytes_written: int
    seconds: float
    worker: str


# a test's hook (tests/test_dask.py), unset in real runs: the path of a gate file that holds merges back
# (``_wait_at_merge_gate``)
MERGE_GATE_ENV = "BIGKNN_TEST_MERGE_GATE"

_CACHE = PartCache()
_BACKENDS: dict[tuple[str, int | None], Backend] = {}
_BACKENDS_LOCK = threading.Lock()


def worker_backend(spec: StoreSpec) -> Backend:
    """This worker process's backend, made once (a CUDA backend compiles its kernels): a dask-cuda worker
    sees its own GPU as device 0."""
    key = (spec.backend, spec.gpu_mem)
    with _BACKENDS_LOCK:
        if key not in _BACKENDS:
            _BACKENDS[key] = get_backend(spec.backend, spec.gpu_mem)
        return _BACKENDS[key]


def sees_store(path: str) -> bool:
    """Whether this worker sees the store at ``path`` (its zarr group marker), before any task runs."""
    return (Path(path) / "zarr.json").is_file()


def drop_pending(path: str) -> int:
    """Run on every worker as a run starts: forget the pending graphs an earlier client of the store left."""
    return _CACHE.drop_pending(str(Path(path)))


def worker_name() -> str:
    """The Dask address of the worker running this task (host:pid outside a worker, in tests)."""
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return f"{socket.gethostname()}:{os.getpid()}"


def claim_version(store: Store, shard_id: int, current: int | None) -> int:
    """A graph version number of ``shard_id`` that no other writer uses: the next free one, claimed by
    creating its directory (mkdir fails if another attempt took it first; then the next is tried)."""
    gdir = store.path / "shards" / str(shard_id) / "graph"
    gdir.mkdir(parents=True, exist_ok=True)
    while True:
        version = store.next_version(shard_id, current)
        try:
            (gdir / str(version)).mkdir()
            return version
        except FileExistsError:
            current = version


def _part(store: Store, ref: ShardRef) -> tuple[ShardPart, int]:
    """The shard part ``ref`` names (from this worker's cache if it is there) and the bytes read for it;
    ``PendingLost`` if it is a pending version this worker does not hold (one it wrote meanwhile is read)."""
    key = (str(store.path), ref.id, ref.version)
    part = _CACHE.get(key)
    if part is not None:
        return part, 0
    if ref.pending and _CACHE.state(key)[0] != "written":
        raise PendingLost([ref.id])
    vectors, nread = _vectors(store, ref.id)
    graph = None
    if ref.version is not None:  # counted as read (k wide as stored), then padded for the merge
        stored = store.read_graph(ref.id, ref.version)
        nread += stored.ids.nbytes + stored.dists.nbytes
        graph = widened(stored, store.manifest.params.width())
    part = ShardPart(ref.offset, vectors, graph)
    _CACHE.put(key, part)
    return part, nread


def _vectors(store: Store, shard_id: int) -> tuple[np.ndarray, int]:
    """A shard's vectors and the bytes read from the store for them: from any cached part of the shard
    (vectors never change; 0 read), else from the store. Every path that needs a shard's vectors counts
    its reads here, so a shard another version of which is cached is not counted as read (issue 14: the
    workers' reads summed to 3.5 times the store)."""
    cached = _CACHE.vectors(str(store.path), shard_id)
    if cached is not None:
        return cached, 0
    vectors = store.read_vectors(shard_id)
    return vectors, vectors.nbytes


def _take(store: Store, ref: ShardRef, graph: KnnGraph) -> int:
    """Hold a graph another worker handed over as the pending version ``ref`` names; the bytes read for
    its vectors."""
    vectors, nread = _vectors(store, ref.id)
    _CACHE.put_pending((str(store.path), ref.id, ref.version), ShardPart(ref.offset, vectors, graph), None)
    return nread


def _keep(store: Store, ref: ShardRef, graph: KnnGraph, vectors: np.ndarray) -> int:
    """Keep ``graph``, made from the version ``ref`` names, as a new pending version of the shard."""
    version = claim_version(store, ref.id, ref.version)
    _CACHE.put_pending((str(store.path), ref.id, version), ShardPart(ref.offset, vectors, graph), ref.version)
    return version


def gnnd(spec: StoreSpec, shard: ShardRef, seed: int, sample: np.ndarray | None, sample_k: int) -> TaskResult:
    """GNND of one shard from its stored vectors; with ``sample`` (the build's recall sample), also the
    sample's exact top-``sample_k`` among the shard's rows, while they are in memory."""
    store = Store(Path(spec.path), spec.header)
    backend, metric = worker_backend(spec), metric_of(spec.header.metric)
    part, nread = _part(store, shard)
    with COMPUTE_LOCK:
        t = time.perf_counter()
        g = backend.gnnd(part.vectors, metric, spec.header.params, seed=seed)
        truth = (None if sample is None
                 else backend.exact_knn(sample, sample_k, metric, [(shard.offset, part.vectors)]))
        seconds = time.perf_counter() - t
    version = _keep(store, shard, shard_graph_to_global(g, shard.offset), part.vectors)
    return TaskResult({shard.id: version}, g.report, seconds, nread, worker_name(), truth)


def hand_over(spec: StoreSpec, shard_id: int, version: int) -> KnnGraph:
    """The pending ``version`` of a shard, for a task on another worker (Dask moves it there); it is that
    worker's from now on. ``PendingLost`` if this worker does not hold it."""
    part = _CACHE.hand_over((str(Path(spec.path)), shard_id, version))
    if part is None:
        raise PendingLost([shard_id])
    return part.graph


def merge(spec: StoreSpec, a: ShardRef, b: ShardRef, vias: list[ShardRef], seed: int,
          handed: dict[int, KnnGraph] | None = None) -> TaskResult:
    """GGM of the pair (a, b), seeded through ``vias`` (an ingest's small batches, bigknn/algorithms/merge_setup.py);
    ``handed``: the pending graphs of a or b that another worker handed over (``hand_over``)."""
    _wait_at_merge_gate(a.id, b.id)
    store = Store(Path(spec.path), spec.header)
    backend = worker_backend(spec)
    nhanded = sum(_take(store, ref, handed[ref.id]) for ref in (a, b) if ref.id in (handed or {}))
    (pa, ra), (pb, rb) = _part(store, a), _part(store, b)
    via_parts = [_part(store, v) for v in vias]
    # a GPU uploads the pair while the worker's other task computes
    backend.stage([arr for p in (pa, pb) for arr in (p.vectors, p.graph.ids, p.graph.dists)])
    with COMPUTE_LOCK:
        t = time.perf_counter()
        ga, gb = backend.ggm(pa, pb, metric_of(spec.header.metric), spec.header.params,
                             seed=seed, vias=[p for p, _ in via_parts])
        seconds = time.perf_counter() - t
    versions = {a.id: _keep(store, a, ga, pa.vectors), b.id: _keep(store, b, gb, pb.vectors)}
    nread = nhanded + ra + rb + sum(r for _, r in via_parts)
    return TaskResult(versions, ga.report, seconds, nread, worker_name())


def _wait_at_merge_gate(a: int, b: int) -> None:
    """A test hook: while the file ``MERGE_GATE_ENV`` names exists and lists shard ``a`` or ``b`` (ids, blank
    separated), this merge waits before it starts, having created ``<gate>.reached``. A test that kills the
    client mid-build so holds some merges back on the workers while the others commit, whatever the machine's
    speed (a fast build ended before the kill). Unset, as in every real run, it reads nothing."""
    gate = os.environ.get(MERGE_GATE_ENV)
    if not gate:
        return
    try:
        held = {int(sid) for sid in Path(gate).read_text().split()}
    except FileNotFoundError:
        return
    if not held & {a, b}:
        return
    Path(gate + ".reached").touch()
    while Path(gate).exists():
        time.sleep(0.01)


def flush(spec: StoreSpec, versions: dict[int, int]) -> FlushResult:
    """Write the pending ``versions`` (shard -> version) this worker holds; a version superseded here by a
    newer one is skipped (the client writes that one later), one this worker does not hold is missing."""
    store = Store(Path(spec.path), spec.header)
    t = time.perf_counter()
    path = str(store.path)
    with _CACHE.flushing:
        states = {sid: _CACHE.state((path, sid, v)) for sid, v in versions.items()}
        todo = {sid: part for sid, (state, part) in states.items() if state == "pending"}
        with ThreadPoolExecutor(2) as pool:  # two graphs go to disk side by side
            list(pool.map(lambda sid: store.write_graph(sid, versions[sid], todo[sid].graph), todo))
        for sid in todo:
            _CACHE.written((path, sid, versions[sid]))
    nbytes = sum(p.graph.ids.nbytes + p.graph.dists.nbytes for p in todo.values())
    return FlushResult({sid: versions[sid] for sid, (state, _) in states.items() if state in ("pending", "written")},
                       [sid for sid, (state, _) in states.items() if state == "missing"], nbytes,
                       time.perf_counter() - t, worker_name())
