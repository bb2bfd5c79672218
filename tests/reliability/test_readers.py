"""Issue 11, reader isolation: readers (the store API, ``eval recall``, ``export``, ``info``) never fail because a
writer committed, whether or not they can write their lease (a read-only STORE/.readers falls back to rereading
on the new state)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from bigknn.formats import write_vectors
from bigknn.core.params import GnndParams
from bigknn.core.knn_graph import KnnGraph
from bigknn import shards
from bigknn.core.errors import BigknnError
from bigknn.shards import Manifest, ShardEntry, Store
from bigknn.core.synth import synth

from conftest import CLI_TIMEOUT_S

SHARDS, ROWS, K = 3, 400, 6
WRITER_COMMITS = 40


def env() -> dict:
    e = dict(os.environ, PYTHONUNBUFFERED="1", BIGKNN_CHECKPOINT_S="0")  # a commit after every merge
    e.pop("BIGKNN_DEBUG", None)
    return e


def graph_of(version: int, rng) -> KnnGraph:
    """A graph whose every id says which version it belongs to (readers check they got one version whole)."""
    ids = np.full((ROWS, K), version, dtype=np.int32)
    dists = np.sort(rng.random((ROWS, K)).astype(np.float32), axis=1)
    return KnnGraph(ids, dists)


def new_store(path: Path, rng) -> Store:
    """A writer's store: three shards with graph version 1 committed."""
    store = Store.create(path, Manifest(dim=4, dtype="<f4", metric="l2", k=K, shard_rows=ROWS, params=GnndParams(), seed=0))
    for sid in range(SHARDS):
        store.write_vectors(sid, rng.standard_normal((ROWS, 4)).astype(np.float32))
        store.manifest.shards.append(ShardEntry(sid, sid * ROWS, ROWS))
        store.write_graph(sid, 1, graph_of(1, rng))
        store.manifest.shards[sid].graph = 1
    store.commit()
    return store


def slow_read(store: Store) -> int:
    """Every shard's graph, read slowly (several commits land meanwhile), each checked to be one version whole."""
    for shard in store.manifest.shards:
        time.sleep(0.05)
        g = store.read_graph(shard.id)
        assert (g.ids == shard.graph).all(), f"shard {shard.id}: ids of another version"
    return len(store.manifest.shards)


def run_with_writer(path: Path, writer: Store, rng, read, pause_s: float) -> tuple[int, list[str]]:
    """``read()`` in a loop on three threads while the writer commits a new version of every shard
    WRITER_COMMITS times, ``pause_s`` apart (each commit deletes the versions older than its own that no lease names);
    (reads, failures)."""
    done = threading.Event()
    failures: list[str] = []
    reads = [0]

    def reader() -> None:
        while not done.is_set():
            try:
                read()
                reads[0] += 1
            except Exception as e:  # noqa: BLE001 - every failure counts
                failures.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(WRITER_COMMITS):
            for shard in writer.manifest.shards:
                version = shard.graph + 1
                writer.write_graph(shard.id, version, graph_of(version, rng))
                shard.graph = version
            writer.commit()
            time.sleep(pause_s)
    finally:
        done.set()
        for t in threads:
            t.join()
    writer.close()
    return reads[0], failures


def test_store_readers_in_threads_never_fail_while_a_writer_commits(tmp_path):
    """Readers open the store (taking their lease), read every graph slowly, close. Before: the writer deleted
    versions under them (ArrayNotFoundError / missing files)."""
    rng = np.random.default_rng(0)
    path = tmp_path / "s.knn"
    writer = new_store(path, rng)

    def read() -> None:
        store = Store.open(path)
        try:
            slow_read(store)
        finally:
            store.close()

    reads, failures = run_with_writer(path, writer, rng, read, pause_s=0.01)
    assert not failures, f"{len(failures)} of {len(failures) + reads} reads failed, e.g. {failures[:3]}"
    assert reads >= 10
    # what the readers kept is gone once they are: the last commit's version alone remains
    for sid in range(SHARDS):
        versions = {int(p.name) for p in (path / "shards" / str(sid) / "graph").iterdir() if p.name.isdigit()}
        assert versions == {WRITER_COMMITS + 1}
    assert list((path / ".readers").iterdir()) == []


def commit_new_versions(writer: Store, rng, times: int) -> None:
    """``times`` commits of a new version of every shard, the deletions they start done."""
    for _ in range(times):
        for shard in writer.manifest.shards:
            version = shard.graph + 1
            writer.write_graph(shard.id, version, graph_of(version, rng))
            shard.graph = version
        writer.commit()
    writer.close()


def test_a_reader_without_a_lease_reads_again_on_the_new_state(tmp_path):
    """A reader that cannot write STORE/.readers (a file is in its way) reads through ``read_store``: when two
    commits delete the versions it opened under it, the read starts again on the new state; a writer that
    never lets a read finish makes it give up with a message that says why. Before: no such API."""
    rng = np.random.default_rng(1)
    path = tmp_path / "s.knn"
    writer = new_store(path, rng)
    (path / ".readers").write_text("not a directory: no reader can write a lease here")
    opened: list[int] = []

    def read(store: Store) -> int:
        opened.append(store.manifest.shards[0].graph)
        if len(opened) == 1:
            commit_new_versions(writer, rng, 2)  # deletes the version this read opened
        for shard in store.manifest.shards:
            g = store.read_graph(shard.id)
            assert (g.ids == shard.graph).all()
        return store.manifest.shards[0].graph

    assert shards.read_store(path, read) == 3 and opened == [1, 3]

    def never_done(store: Store) -> None:
        commit_new_versions(writer, rng, 2)
        read(store)

    with pytest.raises(BigknnError, match="write access"):
        shards.read_store(path, never_done)


READER = """
import json, subprocess, sys, time
from pathlib import Path
from bigknn.shards import Store
store, stop_file, log = sys.argv[1], sys.argv[2], sys.argv[3]

def graphs_done():
    try:
        m = json.loads(Path(store, "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(m["shards"]) and all(s["graph"] is not None for s in m["shards"])

def api():  # open, wait for two commits (the second deletes what the first superseded), read every graph
    s = Store.open(store)
    seen, last = 0, Path(store, "manifest.json").read_text()
    while seen < 2 and not Path(stop_file).exists():
        time.sleep(0.02)
        now = Path(store, "manifest.json").read_text()
        seen, last = seen + (now != last), now
    time.sleep(0.2)  # the writer deletes in the background
    for shard in s.manifest.shards:
        s.read_graph(shard.id)
    s.close()
    return seen

turn = 0
with open(log, "w") as out:
    while not Path(stop_file).exists():
        if not graphs_done():
            time.sleep(0.05)
            continue
        kind = ("api", "eval", "export", "info")[turn % 4]
        turn += 1
        seen = None
        if kind == "api":
            try:
                seen = api()
                code, err = 0, ""
            except Exception as e:
                code, err = 1, f"{type(e).__name__}: {e}"
        else:
            args = {"eval": ["eval", "recall", store, "--backend", "cpu", "--sample", "100"],
                    "export": ["export", store, "-o", f"{stop_file}.{turn}.npy", "--format", "npy"],
                    "info": ["info", store]}[kind]
            p = subprocess.run([sys.executable, "-m", "bigknn", *args, "--json"], capture_output=True, text=True)
            code, err = p.returncode, p.stderr.strip()[-400:]
        out.write(json.dumps({"kind": kind, "exit": code, "stderr": err, "commits_seen": seen}) + "\\n")
        out.flush()
"""


def test_reader_processes_never_fail_during_a_build_and_an_ingest(tmp_path):
    """The issue's reproduction, across processes: while ``build`` and then ``ingest`` commit after every merge,
    a reader process loops over ``eval recall``, ``export``, ``info`` and a read through the store API that
    opens, waits for two commits, then reads every graph. Before: readers failed with ArrayNotFoundError."""
    data = tmp_path / "data.fbin"
    x = synth(4400, 16, seed=4)
    write_vectors(data, x[:4000])
    write_vectors(tmp_path / "new.fbin", x[4000:])
    store = tmp_path / "s.knn"
    stop, log = tmp_path / "stop", tmp_path / "readers.log"
    readers = subprocess.Popen([sys.executable, "-c", READER, str(store), str(stop), str(log)], env=env())
    try:
        for args in (["build", data, "-o", store, "--k", 10, "--shard-rows", 1000],
                     ["ingest", store, "--input", tmp_path / "new.fbin"]):
            writer = subprocess.run([sys.executable, "-m", "bigknn", *map(str, args), "--backend", "cpu", "--json"],
                                    capture_output=True, text=True, env=env(), timeout=CLI_TIMEOUT_S)
            assert writer.returncode == 0, writer.stderr
    finally:
        stop.touch()
        readers.wait(timeout=CLI_TIMEOUT_S)
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    refused = [r for r in runs if r["exit"] == 2 and "not finished" in r["stderr"]]  # export while merging
    failed = [r for r in runs if r["exit"] != 0 and r not in refused]
    assert any(r["kind"] == "api" and r["commits_seen"] == 2 for r in runs), runs
    assert not failed, f"{len(failed)} of {len(runs)} readers failed, e.g. {failed[:2]}"
    assert list((store / ".readers").iterdir()) == []  # every reader released its lease
