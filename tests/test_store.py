"""The store: manifest round trip, copy-on-write graph versions with an atomic commit, garbage collection,
and the advisory writer lock across processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import bigknn.core.atomic as atomic_mod
import bigknn.shards.manifest as manifest_mod
from bigknn.core.errors import BadInput, StoreBusy
from bigknn.core.params import GnndParams
from bigknn.core.knn_graph import KnnGraph
from bigknn.shards import Manifest, ShardEntry, Store, WriterLock, leases

from conftest import CLI_TIMEOUT_S, cli_env

ROWS, DIM, K = 300, 8, 6


def make_manifest(**over) -> Manifest:
    m = Manifest(dim=DIM, dtype="<f4", metric="l2", k=K, shard_rows=200,
                 params=GnndParams(k=K, samples=0, iters=12, min_update_frac=0.05, merge_iters=8), seed=7,
                 inputs=[{"path": "/data/x.fbin", "size": 123, "sha256": "ab" * 32, "rows": ROWS, "first_id": 0}])
    for key, value in over.items():
        setattr(m, key, value)
    return m


def random_graph(rng, rows=ROWS, k=K) -> KnnGraph:
    ids = rng.integers(0, 10_000, size=(rows, k)).astype(np.int32)
    dists = np.sort(rng.random((rows, k)).astype(np.float32), axis=1)
    return KnnGraph(ids, dists)


def new_store(path, rng) -> Store:
    """A store with two shards, vectors written, graph version 1 of each committed."""
    store = Store.create(path, make_manifest())
    x = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    store.write_vectors(0, x[:200])
    store.write_vectors(1, x[200:])
    store.manifest.shards = [ShardEntry(0, 0, 200), ShardEntry(1, 200, 100)]
    store.commit()
    for sid, rows in ((0, 200), (1, 100)):
        store.write_graph(sid, 1, random_graph(rng, rows))
        store.manifest.shards[sid].graph = 1
    store.commit()
    return store


def graph_equal(a: KnnGraph, b: KnnGraph) -> bool:
    return np.array_equal(a.ids, b.ids) and np.array_equal(a.dists, b.dists)


def versions_on_disk(store: Store, sid: int) -> set[int]:
    gdir = store.path / "shards" / str(sid) / "graph"
    return {int(p.name) for p in gdir.iterdir() if p.name.isdigit()} if gdir.is_dir() else set()


# ---- manifest ---------------------------------------------------------------------------------
def test_manifest_json_round_trip():
    m = make_manifest(shards=[ShardEntry(0, 0, 200, 3), ShardEntry(1, 200, 100, None)],
                      merged=[[0, 1]], timings={"gnnd": 1.5})
    back = Manifest.from_json(m.to_json())
    assert back == m
    assert back.rows == 300
    assert back.pairs_done() == {(0, 1)}
    assert isinstance(back.shards[0], ShardEntry) and back.shards[1].graph is None
    assert json.loads(m.to_json())["format"] == manifest_mod.FORMAT_VERSION


def test_manifest_of_another_format_is_refused():
    raw = json.loads(make_manifest().to_json())
    raw["format"] = max(manifest_mod.READ_FORMATS) + 1
    with pytest.raises(ValueError, match="format"):
        Manifest.from_json(json.dumps(raw))


def test_store_create_open_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    store = new_store(tmp_path / "s", rng)
    again = Store.open(tmp_path / "s")
    assert again.manifest == store.manifest
    group = json.loads((tmp_path / "s" / "zarr.json").read_text())
    assert group["attributes"]["bigknn"]["format"] == manifest_mod.FORMAT_VERSION
    np.testing.assert_array_equal(again.read_vectors(1), store.read_vectors(1))
    assert graph_equal(again.read_graph(0), store.read_graph(0, 1))
    # vectors_of gathers arbitrary global rows across shards
    rows = np.array([299, 0, 200, 199, 5])
    full = np.concatenate([store.read_vectors(0), store.read_vectors(1)])
    np.testing.assert_array_equal(again.vectors_of(rows), full[rows])


def test_reading_rows_whose_write_is_in_flight_waits_for_it(tmp_path):
    """The sharding pass hands a shard on before its rows are on disk: a read of them from the store (a
    cache that dropped them) gets the rows once written, not a missing array."""
    from concurrent.futures import ThreadPoolExecutor

    store = Store.create(tmp_path / "s", make_manifest())
    x = np.random.default_rng(1).standard_normal((200, DIM)).astype(np.float32)

    def slow_write():
        time.sleep(0.3)
        store.write_vectors(0, x)

    with ThreadPoolExecutor(1) as pool:
        store.vectors_being_written(0, pool.submit(slow_write))
        np.testing.assert_array_equal(store.read_vectors(0), x)


def test_open_refuses_missing_and_foreign_directories(tmp_path):
    with pytest.raises(BadInput, match="no such store"):
        Store.open(tmp_path / "nothing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(BadInput, match="manifest"):
        Store.open(tmp_path / "plain")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{not json")
    with pytest.raises(BadInput) as info:
        Store.open(tmp_path / "broken")
    assert "\n" not in str(info.value) and "manifest.json" in str(info.value)


# ---- copy-on-write commits --------------------------------------------------------------------
def test_crash_before_commit_leaves_previous_state(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    store = new_store(tmp_path / "s", rng)
    before_manifest = (tmp_path / "s" / "manifest.json").read_bytes()
    g1 = store.read_graph(0, 1)

    # a step writes version 2 of shard 0, then dies in the manifest's rename
    g2 = random_graph(rng, 200)
    store.write_graph(0, 2, g2)
    store.manifest.shards[0].graph = 2
    store.manifest.merged.append([0, 1])

    def crash(*args, **kwargs):
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(atomic_mod.os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        store.commit()
    monkeypatch.undo()

    assert (tmp_path / "s" / "manifest.json").read_bytes() == before_manifest
    seen = Store.open(tmp_path / "s")
    assert seen.manifest.shards[0].graph == 1 and seen.manifest.merged == []
    assert graph_equal(seen.read_graph(0), g1)
    assert 1 in versions_on_disk(seen, 0)  # the committed version survived the failed commit

    # the rerun redoes the step: it writes version 2 again (over the unreferenced one) and commits
    g3 = random_graph(rng, 200)
    assert not graph_equal(g2, g3)
    seen.write_graph(0, 2, g3)
    seen.manifest.shards[0].graph = 2
    seen.manifest.merged.append([0, 1])
    seen.commit()
    final = Store.open(tmp_path / "s")
    assert final.manifest.shards[0].graph == 2 and final.manifest.merged == [[0, 1]]
    assert graph_equal(final.read_graph(0), g3)
    assert graph_equal(final.read_graph(0, 1), g1)  # the previous version stays readable
    assert not (tmp_path / "s" / "manifest.json.tmp").exists()
    assert not list((tmp_path / "s").glob(".manifest.json.*"))  # the failed commit's temporary file is gone


def test_unreferenced_version_with_other_shape_is_overwritten(tmp_path):
    """A crash mid-write can leave a version with stray files; the next write of that version replaces it
    completely."""
    rng = np.random.default_rng(2)
    store = new_store(tmp_path / "s", rng)
    store.write_graph(1, 2, random_graph(rng, 100, K + 4))  # a wider leftover, never committed
    stray = store.path / "shards" / "1" / "graph" / "2" / "ids" / "stray-file"
    stray.write_bytes(b"junk")
    g = random_graph(rng, 100)
    store.write_graph(1, 2, g)
    store.manifest.shards[1].graph = 2
    store.commit()
    back = Store.open(store.path).read_graph(1)
    assert back.ids.shape == (100, K)
    assert graph_equal(back, g)


def test_old_versions_are_garbage_collected_after_commit(tmp_path):
    rng = np.random.default_rng(3)
    store = new_store(tmp_path / "s", rng)
    graphs = {1: store.read_graph(0, 1)}
    for v in range(2, 7):
        graphs[v] = random_graph(rng, 200)
        store.write_graph(0, v, graphs[v])
        # before the commit, the new version and the committed ones coexist
        assert v in versions_on_disk(store, 0) and v - 1 in versions_on_disk(store, 0)
        store.manifest.shards[0].graph = v
        store.commit()
        store.close()  # the deletions run in the background; close waits for them
        # after it: the committed version alone (a reader of an older one holds a lease on it), so a store's
        # peak on disk is one graph per shard plus the versions being written
        assert versions_on_disk(store, 0) == {v}
        assert graph_equal(store.read_graph(0, v), graphs[v])
    assert versions_on_disk(store, 1) == {1}  # the other shard is untouched


def test_versions_written_between_commits_go_with_the_commit_after_them(tmp_path):
    """Two versions written between commits (checkpoints): the commit deletes the one it skipped and the one
    the previous commit pointed at, which no reader's lease names."""
    rng = np.random.default_rng(4)
    store = new_store(tmp_path / "s", rng)
    graphs = {1: store.read_graph(0, 1)}
    for v in (2, 3):
        graphs[v] = random_graph(rng, 200)
        store.write_graph(0, v, graphs[v])
    assert versions_on_disk(store, 0) == {1, 2, 3}  # before the commit every one is there
    store.manifest.shards[0].graph = 3
    store.commit()
    store.close()
    assert versions_on_disk(store, 0) == {3}
    assert graph_equal(Store.open(store.path).read_graph(0), graphs[3])


def test_commit_keeps_a_written_but_uncommitted_newer_version(tmp_path):
    """GC runs on every commit; it must not delete a version newer than the committed one (another
    shard's step may commit in between)."""
    rng = np.random.default_rng(4)
    store = new_store(tmp_path / "s", rng)
    g = random_graph(rng, 200)
    store.write_graph(0, 2, g)
    store.commit()  # a commit about something else
    assert 2 in versions_on_disk(store, 0)
    assert graph_equal(store.read_graph(0, 2), g)


# ---- writer lock ------------------------------------------------------------------------------
HOLDER = """
import sys, time
from bigknn.shards import WriterLock
with WriterLock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(600)
"""

CONTENDER = """
import sys, time
from bigknn.core.errors import StoreBusy
from bigknn.shards import WriterLock
t0 = time.monotonic()
try:
    with WriterLock(sys.argv[1], wait_s=float(sys.argv[2])):
        print("acquired")
except StoreBusy as e:
    print(f"busy {time.monotonic() - t0:.3f} {e}")
"""


def start_holder(path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True,
                            env=cli_env())
    line = proc.stdout.readline()
    assert line.strip() == "locked", line
    return proc


def test_second_writer_in_another_process_times_out_naming_the_holder(tmp_path):
    path = tmp_path / "s"
    with WriterLock(path):
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-c", CONTENDER, str(path), "0.6"], capture_output=True,
                             text=True, env=cli_env(), timeout=CLI_TIMEOUT_S).stdout.strip()
        assert out.startswith("busy "), out
        waited = float(out.split()[1])
        assert 0.55 <= waited <= time.monotonic() - t0
        assert f"pid {os.getpid()}" in out and socket.gethostname() in out
        assert "\n" not in out
        # readers never block
        assert not Store.exists(path)
    # released: the next writer gets it at once
    out = subprocess.run([sys.executable, "-c", CONTENDER, str(path), "0"], capture_output=True, text=True,
                         env=cli_env(), timeout=CLI_TIMEOUT_S).stdout.strip()
    assert out == "acquired"


def test_lock_of_a_killed_holder_is_free_again(tmp_path):
    path = tmp_path / "s"
    proc = start_holder(path)
    try:
        with pytest.raises(StoreBusy) as info:
            with WriterLock(path, wait_s=0.3):
                pass
        msg = str(info.value)
        assert f"pid {proc.pid}" in msg and socket.gethostname() in msg and str(path) in msg
        assert "\n" not in msg
        # a waiting writer gets the lock as soon as the holder dies, SIGKILL included
        t0 = time.monotonic()
        killer = subprocess.Popen([sys.executable, "-c",
                                   f"import os, signal, time; time.sleep(0.5); os.kill({proc.pid}, signal.SIGKILL)"])
        with WriterLock(path, wait_s=20):
            waited = time.monotonic() - t0
            assert proc.wait(timeout=10) == -signal.SIGKILL
            assert 0.4 <= waited < 10
            info = json.loads((path / ".lock").read_text())
            assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
        killer.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with WriterLock(path, wait_s=0):
        pass


def test_lock_is_exclusive_within_one_process_too(tmp_path):
    with WriterLock(tmp_path / "s"):
        with pytest.raises(StoreBusy):
            with WriterLock(tmp_path / "s", wait_s=0):
                pass
    with WriterLock(tmp_path / "s", wait_s=0):
        pass


# ---- reader leases ----------------------------------------------------------------------------
def commit_versions(store: Store, rng, versions) -> None:
    for v in versions:
        store.write_graph(0, v, random_graph(rng, 200))
        store.manifest.shards[0].graph = v
        store.commit()


def write_lease(store: Store, name: str, pid: int, graphs: dict | None, age_s: float = 0.0) -> Path:
    folder = store.path / leases.LEASE_DIR
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "graphs": graphs}))
    if age_s:
        t = time.time() - age_s
        os.utime(path, (t, t))
    return path


def test_a_readers_versions_outlive_commits_until_it_closes(tmp_path):
    rng = np.random.default_rng(5)
    writer = new_store(tmp_path / "s", rng)
    reader = Store.open(writer.path)  # pins version 1 of both shards
    g1 = reader.read_graph(0)
    commit_versions(writer, rng, (2, 3, 4))
    writer.close()
    assert versions_on_disk(writer, 0) == {1, 4}  # 2 and 3 went; 1 stays for the reader
    assert graph_equal(reader.read_graph(0), g1)
    reader.close()
    assert list((writer.path / leases.LEASE_DIR).iterdir()) == []
    writer.close()  # a writer's close deletes what the reader kept
    assert versions_on_disk(writer, 0) == {4}


def test_leases_of_dead_or_silent_readers_are_ignored_and_removed(tmp_path):
    rng = np.random.default_rng(6)
    writer = new_store(tmp_path / "s", rng)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    gone = write_lease(writer, "123-aaaaaaaaaaaa.json", int(dead), {"0": 1})
    silent = write_lease(writer, "124-aaaaaaaaaaaa.json", os.getpid(), {"0": 1}, age_s=leases.EXPIRE_S + 5)
    commit_versions(writer, rng, (2, 3))
    writer.close()
    assert versions_on_disk(writer, 0) == {3}
    assert not gone.exists() and not silent.exists()


def test_a_reader_still_opening_holds_back_every_deletion(tmp_path):
    """A lease without versions yet (its reader is reading the manifest) may need any version."""
    rng = np.random.default_rng(7)
    writer = new_store(tmp_path / "s", rng)
    opening = write_lease(writer, "125-aaaaaaaaaaaa.json", os.getpid(), None)
    commit_versions(writer, rng, (2, 3))
    writer.close()
    assert versions_on_disk(writer, 0) == {1, 2, 3}
    opening.unlink()
    writer.close()
    assert versions_on_disk(writer, 0) == {3}


def test_pin_false_writes_nothing_and_new_versions_skip_existing_directories(tmp_path):
    rng = np.random.default_rng(8)
    store = new_store(tmp_path / "s", rng)
    opened = Store.open(store.path, pin=False)
    assert not (store.path / leases.LEASE_DIR).exists()
    store.write_graph(0, 5, random_graph(rng, 200))  # e.g. a damaged version left on disk
    assert opened.next_version(0, 1) == 6 and opened.next_version(1, 1) == 2 and opened.next_version(1, None) == 2
