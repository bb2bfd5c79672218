"""Issue 11, ``bigknn verify STORE`` (fsck): exit 0 on a sound store; on damage exit 1, every damaged file named,
and the commands that repair it (``--repair`` then ``bigknn merge`` for a lost graph version, a rebuild for lost
vectors); ``bigknn info`` no longer calls a store with a missing chunk complete."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bigknn.formats import write_vectors
from bigknn.core.synth import synth

from conftest import CLI_TIMEOUT_S, error_lines

ROWS, DIM, K, SHARD_ROWS = 3000, 16, 5, 1000
SHARDS = 3


def bigknn_json(*args: object) -> dict:
    proc = subprocess.run([sys.executable, "-m", "bigknn", *map(str, args), "--json"], capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("verify")
    write_vectors(d / "data.fbin", synth(ROWS, DIM, seed=11))
    bigknn_json("build", d / "data.fbin", "-o", d / "s.knn", "--k", K, "--shard-rows", SHARD_ROWS, "--backend", "cpu")
    return d / "s.knn"


@pytest.fixture
def store(built, tmp_path) -> Path:
    shutil.copytree(built, tmp_path / "s.knn")
    return tmp_path / "s.knn"


def manifest(store: Path) -> dict:
    return json.loads((store / "manifest.json").read_text())


def graph_dir(store: Path, shard: int) -> Path:
    return store / "shards" / str(shard) / "graph" / str(manifest(store)["shards"][shard]["graph"])


def verify_json(cli, store: Path, *more) -> tuple[int, dict]:
    code, out, err = cli("verify", store, *more, "--json")
    assert out.count("\n") == 1, (out, err)
    return code, json.loads(out)


def test_verify_passes_a_sound_store(cli, built):
    code, report = verify_json(cli, built)
    assert code == 0
    assert report["ok"] is True and report["damaged"] == [] and report["repair"] == []
    assert report["arrays"] == 3 * SHARDS and report["contents_checked"] is True
    assert report["bytes"] >= ROWS * DIM * 4 + 2 * ROWS * K * 4  # vectors, ids and dists: every chunk read
    code, out, _ = cli("verify", built)
    assert code == 0 and "ok" in out.splitlines()[0]


def damage(store: Path, case: str) -> str:
    """Damage the store; returns the file verify must name."""
    if case == "ids chunk deleted":
        target = graph_dir(store, 1) / "ids" / "c" / "0" / "0"
        target.unlink()
    elif case == "dists byte flipped":
        target = graph_dir(store, 0) / "dists" / "c" / "0" / "0"
        data = bytearray(target.read_bytes())
        data[17] ^= 0x01
        target.write_bytes(bytes(data))
    elif case == "graph version deleted":
        target = graph_dir(store, 2)
        shutil.rmtree(target)
        target = target / "ids" / "zarr.json"
    elif case == "vectors chunk deleted":
        target = store / "shards" / "1" / "vectors" / "c" / "0" / "0"
        target.unlink()
    else:  # a merged pair that names no shard
        m = manifest(store)
        m["merged"].append([1, 7])
        (store / "manifest.json").write_text(json.dumps(m))
        target = store / "manifest.json"
    return str(target)


def test_verify_names_every_damage_of_the_graphs_and_its_repair(cli, store):
    cases = ["ids chunk deleted", "dists byte flipped", "graph version deleted", "bad merged pair"]
    targets = [damage(store, case) for case in cases]
    code, report = verify_json(cli, store)
    assert code == 1 and report["ok"] is False
    assert sorted(d["file"] for d in report["damaged"]) == sorted(targets), report["damaged"]
    assert report["repair"] == [f"bigknn verify {store} --repair", f"bigknn merge {store}"]
    code, out, _ = cli("verify", store)
    assert code == 1 and "DAMAGED" in out and all(t in out for t in targets)


def test_verify_says_lost_vectors_need_a_rebuild(cli, store):
    target = damage(store, "vectors chunk deleted")
    code, report = verify_json(cli, store)
    assert code == 1 and [d["file"] for d in report["damaged"]] == [target]
    assert len(report["repair"]) == 1 and "rebuild" in report["repair"][0]
    assert manifest(store)["inputs"][0]["path"] in report["repair"][0]


def test_info_is_not_complete_with_a_missing_chunk(cli, store):
    target = damage(store, "ids chunk deleted")
    code, out, err = cli("info", store, "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["complete"] is False
    assert len(info["damaged"]) == 1 and target in info["damaged"][0] and "shard 1" in info["damaged"][0]


def test_repair_then_merge_restores_a_lost_graph_version(cli, store):
    target = damage(store, "ids chunk deleted")
    code, out, err = cli("verify", store, "--repair", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert [d["file"] for d in report["damaged"]] == [target]
    assert report["repaired"] == ["dropped shard 1's graph and its merged pairs"]
    assert report["repair"] == [f"bigknn merge {store}"]
    m = manifest(store)
    assert m["shards"][1]["graph"] is None and all(1 not in p for p in m["merged"])
    bigknn_json("merge", store, "--backend", "cpu")
    code, report = verify_json(cli, store)
    assert code == 0 and report["ok"] is True
    assert bigknn_json("eval", "recall", store, "--backend", "cpu", "--sample", 500, "--k", K)["recall"] >= 0.95


def tree(store: Path) -> dict[str, str]:
    return {str(p.relative_to(store)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(store.rglob("*")) if p.is_file() and p.name != ".lock"}


def test_repair_refuses_damaged_vectors_and_changes_nothing(cli, store):
    damage(store, "vectors chunk deleted")
    before = tree(store)
    code, _, err = cli("verify", store, "--repair")
    assert code == 1 and "rebuild" in err and len(error_lines(err)) == 1
    assert tree(store) == before
