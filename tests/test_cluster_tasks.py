"""A Dask worker's two task threads (bigknn/engine/dask/): the backend calls of two tasks on one worker take turns
(``tasks.COMPUTE_LOCK``) while a flush's graph writes overlap a task's compute; tasks keep their graphs
pending until a flush writes them; ``local:N`` starts its workers with ``TASK_THREADS`` threads; the client
places tasks on the workers. No cluster is started: the tasks run on threads of this process, as on a
worker, against a fake backend that records how its calls meet (events and barriers, not timings)."""

from __future__ import annotations

import sys
import threading
import types
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import bigknn
from bigknn.backends.base import Backend
from bigknn.engine.dask import connect
from bigknn.engine.dask import worker_tasks as tasks
from bigknn.engine.dask.holdings import Holding, Holdings, place
from bigknn.engine.dask.part_cache import PartCache
from bigknn.engine.dask.worker_tasks import PendingLost, ShardRef, StoreSpec
from bigknn.core.knn_graph import KnnGraph
from bigknn.shards import Store
from conftest import write_synth

MEET_S = 0.5  # how long a compute waits for the other task's compute to join it (it must not)
OVERLAP_S = 10.0  # how long a write waits for the other task's compute to start (it must)


class MeetingBackend(Backend):
    """GNND and GGM that return their input graphs, after waiting (``MEET_S``) at a barrier for the other
    task's call: ``peak`` is the most calls seen at once. ``on_compute`` runs first in each call."""

    name = "meeting"

    def __init__(self):
        self.barrier = threading.Barrier(2, timeout=MEET_S)
        self.active = self.peak = 0
        self.lock = threading.Lock()
        self.on_compute = lambda shard_ids: None

    def _compute(self, shard_ids: tuple[int, ...]) -> None:
        self.on_compute(shard_ids)
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            pass
        finally:
            with self.lock:
                self.active -= 1

    def gnnd(self, x, metric, params, seed, on_iter=None) -> KnnGraph:
        self._compute(())
        return KnnGraph(np.zeros((len(x), 2), np.int32), np.zeros((len(x), 2), np.float32))

    def ggm(self, a, b, metric, params, seed, on_iter=None, vias=None):
        self._compute((a.offset, b.offset))
        return a.graph, b.graph


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A finished store of 4 shards (only read: the tasks write uncommitted versions beside its own)."""
    d = tmp_path_factory.mktemp("tasks")
    write_synth(d / "x.fbin", 200, 8, seed=3)
    bigknn.build(d / "x.fbin", store=d / "s.knn", k=4, backend="cpu", shard_rows=50, seed=1).close()
    return d / "s.knn"


@pytest.fixture
def backend(built, monkeypatch) -> MeetingBackend:
    fake = MeetingBackend()
    monkeypatch.setitem(tasks._BACKENDS, ("meeting", None), fake)
    monkeypatch.setattr(tasks, "_CACHE", PartCache())
    return fake


def _spec(store: Store) -> StoreSpec:
    return StoreSpec.of(store, "meeting", None)


def _ref(store: Store, sid: int, graph: bool = True) -> ShardRef:
    shard = store.manifest.shards[sid]
    return ShardRef(sid, shard.offset, shard.graph if graph else None)


def _merge(store: Store, i: int, j: int) -> dict[int, int]:
    return tasks.merge(_spec(store), _ref(store, i), _ref(store, j), [], seed=0).versions


def _both(*calls) -> None:
    threads = [threading.Thread(target=c) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_two_merges_on_one_worker_never_compute_at_once(built, backend):
    store = Store.open(built, pin=False)
    _both(lambda: _merge(store, 0, 1), lambda: _merge(store, 2, 3))
    assert backend.peak == 1, "two tasks of one worker ran their backend calls at once"


def test_two_gnnds_on_one_worker_never_compute_at_once(built, backend):
    store = Store.open(built, pin=False)
    gnnd = lambda sid: tasks.gnnd(_spec(store), _ref(store, sid, graph=False), 0, None, 0)  # noqa: E731
    _both(lambda: gnnd(0), lambda: gnnd(1))
    assert backend.peak == 1


def test_a_flushs_writes_overlap_the_next_merges_compute(built, backend, monkeypatch):
    """The flush of merge (0, 1)'s graphs holds its writes until merge (2, 3) computes: that happens only if
    the writes are outside the lock."""
    store = Store.open(built, pin=False)
    offsets = {store.manifest.shards[s].offset for s in (2, 3)}
    first_writing, second_computing = threading.Event(), threading.Event()
    backend.barrier = threading.Barrier(1)  # each call passes at once
    backend.on_compute = lambda at: second_computing.set() if set(at) == offsets else None
    write_graph, waited = Store.write_graph, []

    def held_write(self, shard_id, version, graph):
        if shard_id in (0, 1):
            first_writing.set()
            waited.append(second_computing.wait(OVERLAP_S))
        write_graph(self, shard_id, version, graph)

    monkeypatch.setattr(Store, "write_graph", held_write)
    made = _merge(store, 0, 1)
    first = threading.Thread(target=tasks.flush, args=(_spec(store), made))
    first.start()
    assert first_writing.wait(OVERLAP_S)
    _merge(store, 2, 3)
    first.join()
    assert waited == [True, True], "the second task's compute waited for the first task's writes"


def test_merges_keep_their_graphs_pending_until_a_flush(built, backend, monkeypatch):
    """Merges write nothing; a shard merged twice is written once, at its newest version; a flush that asks
    for a version superseded on the worker skips it, and one the worker never had reports it missing."""
    store = Store.open(built, pin=False)
    writes: list = []
    write_graph = Store.write_graph
    monkeypatch.setattr(Store, "write_graph", lambda self, sid, v, g: (writes.append((sid, v)),
                                                                        write_graph(self, sid, v, g)))
    first = _merge(store, 0, 1)
    offset = store.manifest.shards
    second = tasks.merge(_spec(store), ShardRef(0, offset[0].offset, first[0], pending=True), _ref(store, 2), [],
                         seed=0).versions
    assert writes == [] and second[0] > first[0]
    res = tasks.flush(_spec(store), {0: first[0], 1: first[1], 3: 99})
    assert res.written == {1: first[1]} and res.missing == [3], "0 superseded here, 3 never here"
    res = tasks.flush(_spec(store), {0: second[0], 2: second[2]})
    assert res.written == second and sorted(writes) == sorted([(1, first[1]), (0, second[0]), (2, second[2])])
    assert store.read_graph(0, second[0]).ids.shape[0] == offset[0].rows
    assert tasks.flush(_spec(store), {0: second[0]}).written == {0: second[0]}, "a late ask: on disk already"
    assert len(writes) == 3


def test_a_pending_graph_written_and_evicted_is_read_back_not_lost(built, backend, monkeypatch):
    """A task may still name a version pending (the client has not yet heard of its flush) after the worker
    wrote it and evicted it: it is read from the store, not reported lost."""
    monkeypatch.setattr(tasks, "_CACHE", PartCache(capacity=1))
    store = Store.open(built, pin=False)
    made = _merge(store, 0, 1)
    assert tasks.flush(_spec(store), made).written == made
    assert tasks._CACHE.get((str(store.path.resolve()), 0, made[0])) is None, "evicted once written"
    ref = ShardRef(0, store.manifest.shards[0].offset, made[0], pending=True)
    assert tasks.merge(_spec(store), ref, _ref(store, 2), [], seed=0).bytes_read > 0


def test_a_shard_in_the_workers_cache_is_not_counted_as_read(built, backend):
    """Bytes read are the bytes read from the store: a shard whose vectors this worker holds (another
    version's part) counts nothing for them, whichever path the task takes (GNND, a merge, a hand-over)."""
    store = Store.open(built, pin=False)
    made = _merge(store, 0, 1)  # shards 0 and 1 pending here, their vectors with them
    assert tasks.gnnd(_spec(store), _ref(store, 0, graph=False), 0, None, 0).bytes_read == 0
    durable = store.read_graph(0, store.manifest.shards[0].graph)
    graph_bytes = durable.ids.nbytes + durable.dists.nbytes
    two = store.read_graph(2, store.manifest.shards[2].graph)
    two_bytes = store.read_vectors(2).nbytes + two.ids.nbytes + two.dists.nbytes
    assert tasks.merge(_spec(store), _ref(store, 0), _ref(store, 2), [], seed=0).bytes_read == graph_bytes + two_bytes
    ref = ShardRef(1, store.manifest.shards[1].offset, made[1] + 10, pending=True)
    assert tasks._take(store, ref, durable) == 0


def test_a_task_on_a_worker_without_the_pending_graph_says_so(built, backend):
    store = Store.open(built, pin=False)
    shard = store.manifest.shards[1]
    with pytest.raises(PendingLost) as lost:
        tasks.merge(_spec(store), _ref(store, 0), ShardRef(1, shard.offset, 99, pending=True), [], seed=0)
    assert lost.value.shards == [1]


def test_a_pending_graph_is_handed_over_without_a_write(built, backend, monkeypatch):
    """A graph pending on one worker goes to a task on another (Dask moves it): nothing is written, the first
    worker gives it up (a flush there skips it, a second hand-over finds it lost), the second holds it."""
    store = Store.open(built, pin=False)
    writes: list = []
    monkeypatch.setattr(Store, "write_graph", lambda self, sid, v, g: writes.append(sid))
    made = _merge(store, 0, 1)
    graph = tasks.hand_over(_spec(store), 0, made[0])
    with pytest.raises(PendingLost):
        tasks.hand_over(_spec(store), 0, made[0])
    flushed = tasks.flush(_spec(store), {0: made[0]})
    assert flushed.written == {} and flushed.missing == []
    monkeypatch.setattr(tasks, "_CACHE", PartCache())  # the other worker
    ref = ShardRef(0, store.manifest.shards[0].offset, made[0], pending=True)
    again = tasks.merge(_spec(store), ref, _ref(store, 2), [], seed=0, handed={0: graph}).versions
    assert again[0] > made[0] and writes == []


def test_a_worker_that_hands_a_graph_over_keeps_the_shards_vectors(built, backend):
    """The shards of an all-pairs build come back to a worker: one that handed a shard's graph over reads
    only a graph when a later task brings the shard back, not its vectors again."""
    store = Store.open(built, pin=False)
    made = _merge(store, 0, 1)
    tasks.hand_over(_spec(store), 0, made[0])
    assert tasks._CACHE.state((str(store.path.resolve()), 0, made[0]))[0] == "handed"
    assert tasks.gnnd(_spec(store), _ref(store, 0, graph=False), 0, None, 0).bytes_read == 0


def _recording(calls: list) -> type:
    class Recorder:
        def __init__(self, **kwargs):
            calls.append(kwargs)

    return Recorder


def test_local_cpu_workers_run_two_task_threads(monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "distributed", types.SimpleNamespace(LocalCluster=_recording(calls)))
    connect._local_cluster("local:3", "cpu")
    assert calls[0]["n_workers"] == 3 and calls[0]["threads_per_worker"] == connect.TASK_THREADS == 2


def test_local_gpu_workers_run_two_task_threads(monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "dask_cuda", types.SimpleNamespace(LocalCUDACluster=_recording(calls)))
    monkeypatch.setattr(connect, "takes_device", lambda backend: True)
    connect._local_cluster("local:2", "cuda")
    assert calls[0]["CUDA_VISIBLE_DEVICES"] == [0, 1] and calls[0]["threads_per_worker"] == 2


def test_a_lost_versions_late_write_does_not_count():
    """A shard reverts to its written version when its worker is lost; a write of a lost version that
    reports afterwards (a flush that finished as the worker died) is not taken: the shard's line goes on
    from the version it reverted to, and the pairs of the lost line are merged again."""
    held = Holdings({0: 3})
    held.made(0, 5, "a")
    held.made(0, 6, "a")
    assert held.lost(0, "b") == (False, 3), "b never held it"
    assert held.lost(0, "a") == (True, 3)
    assert not held.written(0, 5) and held.get(0).durable == 3
    held.made(0, 8, "b")
    assert held.written(0, 8) and (held.get(0).durable, held.get(0).owner) == (8, None)


class _Waiting:
    """A Dask future of a task that never ends: pinned to a worker that left, it waits for it for ever."""

    def result(self, timeout: float):
        raise TimeoutError


def test_a_pinned_task_whose_worker_left_ends_the_wait(monkeypatch):
    """Tasks are pinned to their worker (Dask stole hinted hand-overs and flushes for idle workers that lacked
    the graphs); one whose worker (or a graph's holder) leaves ends the client's wait instead of hanging."""
    monkeypatch.setattr(connect, "WATCH_S", 0.01)
    client = types.SimpleNamespace(nthreads=lambda: {"b": 2})
    with pytest.raises(connect.WorkerGone) as gone:
        connect.pinned_result(client, _Waiting(), {"a", "b"})
    assert gone.value.workers == {"a"}


def test_place_keeps_pending_graphs_where_they_are_while_a_thread_is_free():
    threads = {"a": 2, "b": 2}
    on_disk, seen_b, pending_b, pending_a = Holding(1), Holding(1, seen="b"), Holding(2, "b", 1, "b"), Holding(2, "a")
    assert place([seen_b, on_disk], threads, Counter()) == ("b", [])  # holds the shard in memory, all idle
    assert place([seen_b, on_disk], threads, Counter({"b": 1})) == ("a", [])  # nothing to write: the least busy
    assert place([pending_b, on_disk], threads, Counter({"b": 1, "a": 1})) == ("b", [])  # as busy: no write
    assert place([pending_b, on_disk], threads, Counter({"b": 1})) == ("b", [])  # b has a thread free
    assert place([pending_b, on_disk], threads, Counter({"b": 2})) == ("a", [0])  # b full: write it, a runs
    # one write either way: to the worker that has more of the pair in memory
    assert place([pending_b, pending_a], threads, Counter({"a": 1, "b": 1})) == ("b", [1])
    assert place([Holding(2, "gone")], threads, Counter({"a": 1})) == ("b", [0])  # a holder that left: its graph
    assert place([], threads, Counter())[0] in threads
    assert place([], {}, Counter()) == (None, [])
