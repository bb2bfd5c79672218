"""What a Dask worker runs: GNND of one shard, GGM of one pair. Imports nothing of dask.

A task opens the store by path (it must be on a file system the worker sees), reads the shard graph versions
the client named, runs the backend, and writes the new graphs copy-on-write under version numbers it claims
for itself (``claim_version``: an exclusive mkdir, so two attempts of one task, a retry and a straggler on
a worker the scheduler gave up on, never write into the same directory). It never writes the manifest: it
returns the versions it wrote and the client, the one committer, records them. A result that is never
committed leaves an unreferenced version that a later commit deletes (bigknn/shards/store.py).

Each worker process keeps the parts it read or wrote last (``PartCache``): the client sends a pair to the
worker that last held one of its shards, so consecutive merges of a shard read it from memory, not disk.

A worker runs two tasks at once (``connect.TASK_THREADS``) but their backend calls one at a time
(``COMPUTE_LOCK``): one task's reads, upload and graph writes overlap the other's GPU (or CPU) compute, so
the device does not wait on the disk, and the two never share its memory or its cores.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bigknn.backends import Backend, get_backend
from bigknn.graph import KnnGraph, ShardPart, shard_graph_to_global
from bigknn.metrics import kernel_metric
from bigknn.params import GnndParams
from bigknn.shards import Manifest, Store

# shard parts a worker keeps: its two running tasks' four shards and the pairs before (a 1M x 96 shard with
# lists of 48: 0.8 GB, so 6.4 GB, plus the two tasks' new graphs while they are written)
CACHE_PARTS = 8
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
    vectors only, before GNND)."""

    id: int
    offset: int
    version: int | None


@dataclass
class TaskResult:
    """What the client needs to commit and account a task: the graph versions written (shard -> version),
    how the descent ended, seconds of compute, bytes moved, the worker, and for a GNND the sample's exact
    neighbours among the shard's rows."""

    versions: dict[int, int]
    report: dict | None
    seconds: float
    bytes_read: int
    bytes_written: int
    worker: str
    truth: KnnGraph | None = None


class PartCache:
    """The last few shards this worker process read or wrote, one part each, keyed by (store, shard, graph
    version): a version never changes once written, so a hit is always current."""

    def __init__(self, capacity: int = CACHE_PARTS):
        self.capacity = capacity
        self._parts: OrderedDict[tuple[str, int, int | None], ShardPart] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int, int | None]) -> ShardPart | None:
        with self._lock:
            part = self._parts.get(key)
            if part is not None:
                self._parts.move_to_end(key)
            return part

    def put(self, key: tuple[str, int, int | None], part: ShardPart) -> None:
        """Keep ``part``; other versions of the shard go (a task reads the version the client names, and the
        client names a shard's newest)."""
        with self._lock:
            for old in [k for k in self._parts if k[:2] == key[:2]]:
                del self._parts[old]
            self._parts[key] = part
            self._parts.move_to_end(key)
            while len(self._parts) > self.capacity:
                self._parts.popitem(last=False)

    def vectors(self, path: str, shard_id: int) -> np.ndarray | None:
        """The vectors of any cached part of the shard (every version of a shard has the same vectors)."""
        with self._lock:
            return next((p.vectors for (where, sid, _), p in self._parts.items()
                         if where == path and sid == shard_id), None)


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
    """The shard part ``ref`` names (from this worker's cache if it is there) and the bytes read for it."""
    key = (str(store.path), ref.id, ref.version)
    part = _CACHE.get(key)
    if part is not None:
        return part, 0
    vectors = _vectors(store, ref.id)
    graph = store.read_graph(ref.id, ref.version) if ref.version is not None else None
    part = ShardPart(ref.offset, vectors, graph)
    _CACHE.put(key, part)
    return part, vectors.nbytes + (graph.ids.nbytes + graph.dists.nbytes if graph is not None else 0)


def _vectors(store: Store, shard_id: int) -> np.ndarray:
    """A shard's vectors: from any cached part of it (vectors never change), else from the store."""
    cached = _CACHE.vectors(str(store.path), shard_id)
    return cached if cached is not None else store.read_vectors(shard_id)


def _write(store: Store, ref: ShardRef, graph: KnnGraph, vectors: np.ndarray) -> tuple[int, int]:
    """Write ``graph`` as a new version of the shard, keep it in the cache; (version, bytes written)."""
    version = claim_version(store, ref.id, ref.version)
    store.write_graph(ref.id, version, graph)
    _CACHE.put((str(store.path), ref.id, version), ShardPart(ref.offset, vectors, graph))
    return version, graph.ids.nbytes + graph.dists.nbytes


def gnnd(spec: StoreSpec, shard: ShardRef, seed: int, sample: np.ndarray | None, sample_k: int) -> TaskResult:
    """GNND of one shard from its stored vectors; with ``sample`` (the build's recall sample), also the
    sample's exact top-``sample_k`` among the shard's rows, while they are in memory."""
    store = Store(Path(spec.path), spec.header)
    backend, metric = worker_backend(spec), kernel_metric(spec.header.metric)
    part, nread = _part(store, shard)
    with COMPUTE_LOCK:
        t = time.perf_counter()
        g = backend.gnnd(part.vectors, metric, GnndParams(**spec.header.params), seed=seed)
        truth = (None if sample is None
                 else backend.exact_knn(sample, sample_k, metric, [(shard.offset, part.vectors)]))
        seconds = time.perf_counter() - t
    version, nwritten = _write(store, shard, shard_graph_to_global(g, shard.offset), part.vectors)
    return TaskResult({shard.id: version}, g.report, seconds, nread, nwritten, worker_name(), truth)


def merge(spec: StoreSpec, a: ShardRef, b: ShardRef, vias: list[ShardRef], seed: int) -> TaskResult:
    """GGM of the pair (a, b), seeded through ``vias`` (an ingest's small batches, bigknn/ggm.py)."""
    store = Store(Path(spec.path), spec.header)
    backend = worker_backend(spec)
    (pa, ra), (pb, rb) = _part(store, a), _part(store, b)
    via_parts = [_part(store, v) for v in vias]
    # a GPU uploads the pair while the worker's other task computes
    backend.stage([arr for p in (pa, pb) for arr in (p.vectors, p.graph.ids, p.graph.dists)])
    with COMPUTE_LOCK:
        t = time.perf_counter()
        ga, gb = backend.ggm(pa, pb, kernel_metric(spec.header.metric), GnndParams(**spec.header.params),
                             seed=seed, vias=[p for p, _ in via_parts])
        seconds = time.perf_counter() - t
    with ThreadPoolExecutor(2) as pool:  # the two shards' graphs go to disk side by side
        (va, wa), (vb, wb) = pool.map(lambda job: _write(store, *job), [(a, ga, pa.vectors), (b, gb, pb.vectors)])
    nread = ra + rb + sum(r for _, r in via_parts)
    return TaskResult({a.id: va, b.id: vb}, ga.report, seconds, nread, wa + wb, worker_name())
