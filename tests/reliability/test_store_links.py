"""Issue 38, a store that cannot be turned against its user: links (symbolic or hard) planted inside a store
are never followed by a writer, which refuses the store (exit 2, one line naming the link) and leaves what
the link points to untouched; a writer deletes only names bigknn makes; verify's advice is safe to paste."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest

from bigknn.core.errors import BadInput, StoreBusy
from bigknn.formats import write_vectors
from bigknn.shards import Store, WriterLock, leases, safepaths
from bigknn.core.synth import synth
from conftest import assert_one_line_error, run_json

ROWS, DIM, K, SHARD_ROWS = 3000, 16, 5, 1000


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("links")
    write_vectors(d / "x.fbin", synth(ROWS, DIM, seed=3))
    write_vectors(d / "y.fbin", synth(300, DIM, seed=4))
    run_json("build", d / "x.fbin", "-o", d / "s.knn", "--k", K, "--shard-rows", SHARD_ROWS, "--backend", "cpu")
    return d / "s.knn"


@pytest.fixture
def store(built, tmp_path) -> Path:
    shutil.copytree(built, tmp_path / "s.knn")
    return tmp_path / "s.knn"


def tree_digest(path: Path) -> dict[str, str]:
    """Every file under ``path`` (links not followed) and its sha256: what a run must leave alone."""
    out = {}
    for root, dirs, files in os.walk(path):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            f = Path(root) / name
            out[str(f.relative_to(path))] = ("link " + os.readlink(f)) if f.is_symlink() else \
                hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def outside_dir(tmp_path: Path) -> Path:
    """A user's directory holding numbered directories and old files, the kind a writer's cleanup removes."""
    out = tmp_path / "mine"
    for name in ("1", "2", "7"):
        (out / name).mkdir(parents=True)
        (out / name / "keep.txt").write_text("user data")
    (out / "notes.txt").write_text("user data")
    old = 1_000_000_000
    for f in out.rglob("*"):
        os.utime(f, (old, old), follow_symlinks=False)
    return out


def test_lock_linked_to_a_user_file_is_refused_and_the_file_untouched(cli, store, tmp_path):
    victim = tmp_path / "v.txt"
    victim.write_text("precious")
    (store / ".lock").unlink()
    (store / ".lock").symlink_to(victim)
    code, out, err = cli("merge", store)
    assert_one_line_error(code, out, err, str(store / ".lock"), "symbolic link")
    assert victim.read_text() == "precious"


def test_lock_hard_linked_to_a_user_file_is_refused_and_the_file_untouched(cli, store, tmp_path):
    victim = tmp_path / "v.txt"
    victim.write_text("precious")
    (store / ".lock").unlink()
    os.link(victim, store / ".lock")
    code, out, err = cli("merge", store)
    assert_one_line_error(code, out, err, str(store / ".lock"))
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("command", ["ingest", "merge", "verify", "prune"])
def test_graph_dir_linked_outside_is_refused_by_every_writer(cli, store, tmp_path, built, command):
    out_dir = outside_dir(tmp_path)
    before = tree_digest(out_dir)
    graph = store / "shards" / "0" / "graph"
    shutil.rmtree(graph)
    graph.symlink_to(out_dir, target_is_directory=True)
    args = {"ingest": ("ingest", store, "--input", built.parent / "y.fbin", "--backend", "cpu"),
            "merge": ("merge", store), "verify": ("verify", store, "--repair"),
            "prune": ("prune", store, "--backend", "cpu")}[command]
    code, out, err = cli(*args)
    if command == "verify":  # verify reports the store as damaged (its graph is unreadable), then refuses
        assert code != 0 and str(graph) in err and "symbolic link" in err
    else:
        assert_one_line_error(code, out, err, str(graph), "symbolic link")
    assert tree_digest(out_dir) == before


def test_search_dir_linked_outside_is_refused_by_prune(cli, store, tmp_path):
    out_dir = outside_dir(tmp_path)
    before = tree_digest(out_dir)
    (store / "search").symlink_to(out_dir, target_is_directory=True)
    code, out, err = cli("prune", store, "--backend", "cpu")
    assert_one_line_error(code, out, err, str(store / "search"), "symbolic link")
    assert tree_digest(out_dir) == before


def test_a_stale_shard_link_is_refused_by_ingest_and_its_target_kept(cli, store, tmp_path, built):
    out_dir = outside_dir(tmp_path)
    before = tree_digest(out_dir)
    (store / "shards" / "3").symlink_to(out_dir, target_is_directory=True)  # the shard an ingest would write
    code, out, err = cli("ingest", store, "--input", built.parent / "y.fbin", "--backend", "cpu")
    assert_one_line_error(code, out, err, str(store / "shards" / "3"), "symbolic link")
    assert tree_digest(out_dir) == before


def test_readers_dir_linked_outside_is_refused_and_its_files_kept(cli, store, tmp_path):
    out_dir = outside_dir(tmp_path)
    before = tree_digest(out_dir)
    shutil.rmtree(store / ".readers", ignore_errors=True)
    (store / ".readers").symlink_to(out_dir, target_is_directory=True)
    code, out, err = cli("merge", store)
    assert_one_line_error(code, out, err, str(store / ".readers"), "symbolic link")
    run_json("info", store)  # a reader still reads (without a lease)
    assert tree_digest(out_dir) == before


def test_lease_cleanup_removes_only_dead_leases_never_other_files(store):
    folder = store / leases.LEASE_DIR
    folder.mkdir(exist_ok=True)
    stray = folder / "notes.txt"
    stray.write_text("not a lease")
    dead = folder / "999999-aaaaaaaaaaaa.json"
    dead.write_text(json.dumps({"pid": 999_999_999, "host": os.uname().nodename, "graphs": None}))
    for f in (stray, dead):
        os.utime(f, (1_000_000_000, 1_000_000_000))
    assert leases.pinned(store) == set()
    assert stray.read_text() == "not a lease" and not dead.exists()


def test_a_link_planted_after_the_check_is_not_followed_by_the_cleanup(store, tmp_path):
    """The writer's deletions open every directory on their way without following links: a link planted
    while it runs (after its check of the store) deletes nothing outside."""
    out_dir = outside_dir(tmp_path)
    before = tree_digest(out_dir)
    writer = Store.open(store, pin=False)
    graph = store / "shards" / "1" / "graph"
    shutil.rmtree(graph)
    graph.symlink_to(out_dir, target_is_directory=True)
    safepaths.remove_tree(store, "shards/1/graph/1")
    safepaths.remove_tree(store, "shards/1/graph")
    writer._stale_below = {1: 99}
    with pytest.raises(BadInput, match="symbolic link"):
        writer._reap()  # a commit now stops, naming the link
    writer._stale_below = {}
    writer.close()
    assert tree_digest(out_dir) == before and graph.is_symlink()


def test_deleting_the_lock_file_does_not_let_a_second_writer_in(store):
    with WriterLock(store):
        (store / ".lock").unlink()
        with pytest.raises(StoreBusy):
            with WriterLock(store):
                pass


def test_verify_advice_quotes_paths(cli, built, tmp_path):
    store = tmp_path / "my store $(touch pwned).knn"
    shutil.copytree(built, store)
    m = json.loads((store / "manifest.json").read_text())
    shutil.rmtree(store / "shards" / "1" / "graph" / str(m["shards"][1]["graph"]))
    code, out, _ = cli("verify", store, "--json")
    assert code == 1
    advice = json.loads(out)["repair"]
    assert f"bigknn verify {shlex.quote(str(store))} --repair" in advice
    assert f"bigknn merge {shlex.quote(str(store))}" in advice
    assert all(shlex.split(step)[2] == str(store) for step in advice)


def test_a_writers_array_write_refuses_a_link_in_its_place(store, tmp_path):
    out_dir = outside_dir(tmp_path)
    before = tree_digest(out_dir)
    writer = Store.open(store, pin=False)
    (store / "shards" / "9").mkdir()
    (store / "shards" / "9" / "vectors").symlink_to(out_dir, target_is_directory=True)
    with pytest.raises(BadInput, match="symbolic link"):
        writer.write_vectors(9, np.zeros((4, DIM), np.float32))
    assert tree_digest(out_dir) == before


@pytest.mark.parametrize("rel", ["shards/1", "shards/0/graph/1", "user_ids", ".readers", "shards/2/vectors"])
def test_the_lock_time_check_refuses_a_linked_directory_anywhere_a_writer_writes(store, tmp_path, rel):
    out_dir = outside_dir(tmp_path)
    place = store / rel
    if place.exists():
        shutil.rmtree(place)
    place.parent.mkdir(parents=True, exist_ok=True)
    place.symlink_to(out_dir, target_is_directory=True)
    with pytest.raises(BadInput, match="symbolic link") as refused:
        safepaths.check_store(store)
    assert refused.value.path == str(place)


def test_the_lock_time_check_reads_directories_but_not_chunk_trees(store, monkeypatch):
    """Its cost follows the arrays, not the chunks: every array directory is listed, no chunk tree."""
    arrays = {str(p.parent) for p in store.rglob("zarr.json")} - {str(store)}
    listed: list[str] = []
    real_scandir = os.scandir
    monkeypatch.setattr(safepaths.os, "scandir", lambda p: listed.append(str(p)) or real_scandir(p))
    safepaths.check_store(store)
    assert arrays <= set(listed)
    assert not [p for p in listed if "/c/" in p + "/"]
