"""Issue 11, checksummed chunks: a missing, damaged or truncated chunk file is an error naming the shard and the
file (exit 1) in every command that reads it (``export``, ``eval recall``, ``ingest``), never zeros. Before,
a deleted ``ids`` chunk exported every neighbour as id 0 with exit 0, and a deleted vectors chunk gave a low
recall with exit 0 and an ingest built on top of it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bigknn.formats import write_vectors
from bigknn.core.synth import synth

from conftest import CLI_TIMEOUT_S, error_lines

ROWS, NEW_ROWS, DIM, K, SHARD_ROWS = 3000, 300, 16, 5, 1000


def bigknn_json(*args: object) -> dict:
    proc = subprocess.run([sys.executable, "-m", "bigknn", *map(str, args), "--json"], capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A finished store of 3 shards and a further file to ingest into it."""
    d = tmp_path_factory.mktemp("checksums")
    x = synth(ROWS + NEW_ROWS, DIM, seed=9)
    write_vectors(d / "data.fbin", x[:ROWS])
    write_vectors(d / "new.fbin", x[ROWS:])
    bigknn_json("build", d / "data.fbin", "-o", d / "s.knn", "--k", K, "--shard-rows", SHARD_ROWS, "--backend", "cpu")
    return d


@pytest.fixture
def store(built, tmp_path) -> Path:
    shutil.copytree(built / "s.knn", tmp_path / "s.knn")
    return tmp_path / "s.knn"


def array_dir(store: Path, shard: int, array: str) -> Path:
    """``vectors``, or ``ids``/``dists`` of the shard's committed graph version."""
    if array == "vectors":
        return store / "shards" / str(shard) / "vectors"
    version = json.loads((store / "manifest.json").read_text())["shards"][shard]["graph"]
    return store / "shards" / str(shard) / "graph" / str(version) / array


def first_chunk(store: Path, shard: int, array: str) -> Path:
    return array_dir(store, shard, array) / "c" / "0" / "0"


def reader_command(kind: str, store: Path, built: Path, tmp_path: Path) -> list:
    return {"export": ["export", store, "-o", tmp_path / "g.ibin"],
            "eval": ["eval", "recall", store, "--backend", "cpu", "--sample", 300, "--k", K],
            "ingest": ["ingest", store, "--input", built / "new.fbin", "--backend", "cpu"]}[kind]


def assert_damage_error(code: int, err: str, *names: object) -> str:
    """Exit 1 and one line on stderr naming each of ``names`` (shard, array, file)."""
    lines = error_lines(err)
    assert code == 1, f"exit {code}: {err}"
    assert len(lines) == 1 and "Traceback" not in err, err
    for name in names:
        assert str(name) in lines[0], f"{name} not named in {lines[0]!r}"
    return lines[0]


@pytest.mark.parametrize("kind", ["export", "eval", "ingest"])
def test_a_missing_ids_chunk_is_an_error_not_zeros(cli, built, store, tmp_path, kind):
    chunk = first_chunk(store, 1, "ids")
    chunk.unlink()
    code, _, err = cli(*reader_command(kind, store, built, tmp_path))
    version = chunk.parts[-5]
    assert_damage_error(code, err, f"shard 1 graph version {version} ids", chunk, "missing")


@pytest.mark.parametrize("kind", ["eval", "ingest"])
def test_a_missing_vectors_chunk_is_an_error(cli, built, store, tmp_path, kind):
    chunk = first_chunk(store, 2, "vectors")
    chunk.unlink()
    code, _, err = cli(*reader_command(kind, store, built, tmp_path))
    assert_damage_error(code, err, "shard 2 vectors", chunk, "missing")


@pytest.mark.parametrize("array,kind", [("ids", "export"), ("dists", "export"), ("vectors", "eval")])
def test_a_damaged_byte_is_an_error(cli, built, store, tmp_path, array, kind):
    chunk = first_chunk(store, 0, array)
    data = bytearray(chunk.read_bytes())
    data[len(data) // 3] ^= 0x10
    chunk.write_bytes(bytes(data))
    code, _, err = cli(*reader_command(kind, store, built, tmp_path))
    assert_damage_error(code, err, "shard 0", array, chunk, "checksum")


def test_a_truncated_chunk_is_an_error(cli, built, store, tmp_path):
    chunk = first_chunk(store, 2, "dists")
    chunk.write_bytes(chunk.read_bytes()[:-100])
    code, _, err = cli(*reader_command("export", store, built, tmp_path))
    assert_damage_error(code, err, "shard 2 graph version", chunk, "bytes")
