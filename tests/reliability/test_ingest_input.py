"""Issue 11, Deliver 5: ingest opens each input once and ingests exactly the bytes it hashed; a file that
changes during the run is refused (``--input``) or skipped as still being written (``--watch-dir``), and
hidden or temporary names in the drop folder are ignored.

"During the run" is made deterministic: the test holds the store's writer lock, so the ingest does its
checks and hashing, then waits for the lock (``--wait``); the file is changed while it waits."""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from bigknn.backends.cpu import CpuBackend
from bigknn.formats import write_vectors
from bigknn.operations.ingest import ingest
from bigknn.core.progress import Reporter
from bigknn.shards import WriterLock
from bigknn.core.synth import synth

from conftest import CLI_TIMEOUT_S, assert_one_line_error, cli_env, read_manifest, run_json, tree_hashes, wait_until_it_opens

ROWS, DIM, NEW = 2000, 8, 300


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ingest_input")
    write_vectors(d / "base.fbin", synth(ROWS, DIM, seed=3))
    run_json("build", d / "base.fbin", "-o", d / "store", "--k", 5, "--shard-rows", 1000, "--backend", "cpu")
    return d / "store"


@pytest.fixture
def store(built, tmp_path) -> Path:
    shutil.copytree(built, tmp_path / "store")
    return tmp_path / "store"


def batch(rows: int, seed: int) -> np.ndarray:
    return synth(rows, DIM, seed=seed)


def write_fvecs(path: Path, x: np.ndarray, mode: str = "wb") -> None:
    """TEXMEX rows (int32 d, then d floats): every prefix of whole rows is a valid file, as while appending."""
    rec = np.empty(len(x), dtype=[("d", "<i4"), ("x", "<f4", (x.shape[1],))])
    rec["d"], rec["x"] = x.shape[1], x
    with open(path, mode) as f:
        rec.tofile(f)


def committed(store: Path) -> dict[str, str]:
    """The store's bytes, but for the lock file (which records the pid of its last holder)."""
    hashes = tree_hashes(store)
    hashes.pop(".lock", None)
    return hashes


@contextmanager
def ingest_waiting_for_the_lock(store: Path, *args):
    """Start `bigknn ingest STORE ARGS --wait 60` while the test holds the writer lock; yield once the
    ingest has finished its checks and waits for the lock; release it on exit and yield the outcome."""
    outcome: dict = {}
    with WriterLock(store):
        proc = subprocess.Popen([sys.executable, "-m", "bigknn", "ingest", str(store), *map(str, args),
                                 "--wait", "60", "--backend", "cpu", "--json"],
                                env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_until_it_opens(proc, store / ".lock")
        yield outcome
    out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
    outcome.update(code=proc.returncode, out=out, err=err)


def test_a_file_replaced_during_the_ingest_is_refused(store, tmp_path):
    """Reproduction: a file replaced by `mv` during an ingest got the new file's sha256 recorded with the
    old file's rows."""
    data, other = tmp_path / "day1.fbin", tmp_path / "other.fbin"
    write_vectors(data, batch(NEW, seed=10))
    write_vectors(other, batch(NEW, seed=11))
    before = committed(store)
    with ingest_waiting_for_the_lock(store, "--input", data) as result:
        os.replace(other, data)
    line = assert_one_line_error(result["code"], result["out"], result["err"], str(data))
    assert "replaced" in line
    assert committed(store) == before


def test_a_file_appended_to_during_the_ingest_is_refused_then_ingested_once_complete(store, tmp_path):
    """Reproduction: a file still being appended was ingested partially, then again whole (duplicates)."""
    data = tmp_path / "day1.fvecs"
    x = batch(NEW, seed=12)
    write_fvecs(data, x[:200])
    before = committed(store)
    with ingest_waiting_for_the_lock(store, "--input", data) as result:
        write_fvecs(data, x[200:], mode="ab")
    line = assert_one_line_error(result["code"], result["out"], result["err"], str(data))
    assert "changed size" in line
    assert committed(store) == before
    assert not (store / "shards" / "2").exists()  # the refused file's staged shard is gone too
    report = run_json("ingest", store, "--input", data, "--backend", "cpu")
    assert report["rows_added"] == NEW and report["rows"] == ROWS + NEW
    assert [i["rows"] for i in read_manifest(store)["inputs"]] == [ROWS, NEW]


def test_drop_folder_file_still_being_written_is_skipped_and_taken_by_the_next_run(store, tmp_path):
    drop = tmp_path / "drop"
    drop.mkdir()
    write_vectors(drop / "a.fbin", batch(NEW, seed=13))
    growing = drop / "b.fvecs"
    xb = batch(NEW, seed=14)
    write_fvecs(growing, xb[:100])
    with ingest_waiting_for_the_lock(store, "--watch-dir", drop) as result:
        write_fvecs(growing, xb[100:], mode="ab")
    assert result["code"] == 0, result["err"]
    assert [Path(i["path"]).name for i in read_manifest(store)["inputs"][1:]] == ["a.fbin"]
    report = json.loads(result["out"])
    assert report["rows_added"] == NEW and report["still_being_written"] == [str(growing)]
    assert "b.fvecs" in result["err"] and "still being written" in result["err"]
    again = run_json("ingest", store, "--watch-dir", drop, "--backend", "cpu")
    assert again["rows_added"] == NEW and again["rows"] == ROWS + 2 * NEW
    assert [i["rows"] for i in read_manifest(store)["inputs"]] == [ROWS, NEW, NEW]


def test_drop_folder_hidden_and_temporary_names_are_ignored(store, tmp_path):
    """Reproduction: a hidden `.x.fbin` in the drop folder was ingested."""
    drop = tmp_path / "drop"
    drop.mkdir()
    for name in (".x.fbin", ".y.fbin.1234-ab12cd34.tmp", "z.fbin.tmp", "w.fbin.part"):
        write_vectors(drop / "v.fbin", batch(NEW, seed=15))
        os.replace(drop / "v.fbin", drop / name)
    before = committed(store)
    report = run_json("ingest", store, "--watch-dir", drop, "--backend", "cpu")
    assert report["ingested"] == [] and report["rows"] == ROWS
    assert committed(store) == before


def test_ingest_opens_each_input_file_once(store, tmp_path, monkeypatch):
    """The rows, the checks and the sha256 come from one opening of the file, not from separate reads of
    the path (which may name another file by then)."""
    data = tmp_path / "day1.fbin"
    write_vectors(data, batch(NEW, seed=16))
    opened: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def note(path) -> None:
        if isinstance(path, (str, os.PathLike)) and Path(path).resolve() == data.resolve():
            opened.append(str(path))

    def counting_open(file, *args, **kwargs):
        note(file)
        return real_open(file, *args, **kwargs)

    def counting_os_open(path, *args, **kwargs):
        note(path)
        return real_os_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr(os, "open", counting_os_open)
    report = ingest(store, [data], [CpuBackend()], Reporter())
    monkeypatch.undo()
    assert report["rows_added"] == NEW
    assert len(opened) == 1, f"{data.name} was opened {len(opened)} times"
    assert read_manifest(store)["inputs"][-1]["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
