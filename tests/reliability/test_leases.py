"""Issue 38, leases that do not trust clocks: a live reader on the writer's host keeps its versions however
old its lease's mtime (its pid and start time decide), a reader elsewhere is judged on the file system's
clock (a writer whose clock runs ahead does not expire it), and a lease dated in the future is reported and
cannot hold back every deletion for ever."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

import numpy as np

from bigknn.core.knn_graph import KnnGraph
from bigknn.shards import Manifest, ShardEntry, Store, leases

ROWS, K = 50, 4


def graph(rng) -> KnnGraph:
    return KnnGraph(rng.integers(0, ROWS, (ROWS, K)).astype(np.int32),
                    np.sort(rng.random((ROWS, K)).astype(np.float32), axis=1))


def new_store(path: Path, rng) -> Store:
    store = Store.create(path, Manifest(dim=4, dtype="<f4", metric="l2", k=K, shard_rows=ROWS, params={}, seed=0))
    store.write_vectors(0, rng.standard_normal((ROWS, 4)).astype(np.float32))
    store.manifest.shards.append(ShardEntry(0, 0, ROWS))
    store.write_graph(0, 1, graph(rng))
    store.manifest.shards[0].graph = 1
    store.commit()
    return store


def commit_versions(store: Store, rng, versions) -> None:
    for v in versions:
        store.write_graph(0, v, graph(rng))
        store.manifest.shards[0].graph = v
        store.commit()
    store.close()


def on_disk(store: Store) -> set[int]:
    return {int(p.name) for p in (store.path / "shards/0/graph").iterdir() if p.name.isdigit()}


def age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def lease_file(store: Store, info: dict, age_s: float = 0.0) -> Path:
    folder = store.path / leases.LEASE_DIR
    folder.mkdir(exist_ok=True)
    path = folder / f"{info.get('pid', 1)}-{os.urandom(6).hex()}.json"
    path.write_text(json.dumps(info))
    age(path, age_s)
    return path


def test_a_live_readers_lease_on_this_host_holds_however_old_its_mtime(tmp_path):
    rng = np.random.default_rng(1)
    writer = new_store(tmp_path / "s", rng)
    reader = Store.open(writer.path)  # a live reader whose refresher has not run (stopped, or a slow clock)
    age(reader._lease.path, 3600)
    commit_versions(writer, rng, (2, 3))
    assert 1 in on_disk(writer) and reader.pinned
    assert reader.read_graph(0).ids.shape == (ROWS, K)
    reader.close()


def test_a_writer_whose_clock_runs_ahead_keeps_a_fresh_lease_from_another_host(tmp_path, monkeypatch):
    rng = np.random.default_rng(2)
    writer = new_store(tmp_path / "s", rng)
    other = lease_file(writer, {"pid": 4242, "host": "reader-host.example", "graphs": {"0": 1}})
    real_time = time.time
    monkeypatch.setattr(leases.time, "time", lambda: real_time() + 20 * 60)  # the writer's clock: 20 min ahead
    commit_versions(writer, rng, (2, 3))
    assert other.exists() and 1 in on_disk(writer)


def test_a_reused_pid_does_not_keep_a_dead_readers_lease(tmp_path):
    rng = np.random.default_rng(3)
    writer = new_store(tmp_path / "s", rng)
    stale = lease_file(writer, {"pid": os.getpid(), "host": socket.gethostname(), "boot": leases.boot_id(),
                                "start": (leases.start_time(os.getpid()) or 0) + 1, "graphs": {"0": 1}})
    commit_versions(writer, rng, (2, 3))
    assert not stale.exists() and 1 not in on_disk(writer)


def test_a_lease_from_the_future_is_reported_and_does_not_stop_cleanup(tmp_path, caplog):
    rng = np.random.default_rng(4)
    writer = new_store(tmp_path / "s", rng)
    future = lease_file(writer, {"pid": 4242, "host": "reader-host.example", "graphs": None}, age_s=-86400)
    with caplog.at_level(logging.WARNING, logger="bigknn"):
        commit_versions(writer, rng, (2, 3))
    assert not future.exists() and on_disk(writer) == {3}
    assert any(str(future) in r.getMessage() and "ahead" in r.getMessage() for r in caplog.records)



def test_a_commit_that_makes_nothing_stale_still_removes_dead_leases(tmp_path):
    """A dead reader's lease goes at the next commit whatever it changed: an ingest joined into a new tail shard
    replaces no graph version, and the lease used to outlive its reader until some later commit did."""
    rng = np.random.default_rng(3)
    store = new_store(tmp_path / "s.knn", rng)
    dead = lease_file(store, {"pid": 1 << 40, "host": socket.gethostname(), "graphs": {"0": 1}})
    elsewhere = lease_file(store, {"pid": 7, "host": "elsewhere.example", "graphs": {"0": 1}})
    store.manifest.seed = 1  # a commit that leaves every graph version in use
    store.commit()
    store.close()
    assert not dead.exists() and elsewhere.exists() and on_disk(store) == {1}
