"""Issue 38, every refusal loud: a busy store exits 75 saying so, bad environment variables and sizes are refused
naming them before any work, a damaged or inconsistent store is refused naming the file or field (never
committed on, never "nothing to do"), denormal rows are refused like overflowing ones, unreadable chunks are
listed, a killed writer's leftovers are removed, and file errors name the file the user asked for."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bigknn.core import numba_cache as numbacache
from bigknn.core.errors import BadInput, DiskFull
from bigknn.formats import write_vectors
from bigknn.operations import diskrate
from bigknn.operations.export import export
from bigknn.engine.pair_order import round_count, round_robin
from bigknn.shards import Store, WriterLock
from bigknn.core.synth import synth
from conftest import CLI_TIMEOUT_S, assert_one_line_error, cli_env, run_json

ROWS, DIM, K, SHARD_ROWS = 3000, 16, 5, 1000
BUSY = 75


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("refusals")
    write_vectors(d / "x.fbin", synth(ROWS, DIM, seed=7))
    write_vectors(d / "y.fbin", synth(200, DIM, seed=8))
    run_json("build", d / "x.fbin", "-o", d / "s.knn", "--k", K, "--shard-rows", SHARD_ROWS, "--backend", "cpu")
    return d / "s.knn"


@pytest.fixture
def store(built, tmp_path) -> Path:
    shutil.copytree(built, tmp_path / "s.knn", ignore=shutil.ignore_patterns(".readers"))  # leases come and go
    return tmp_path / "s.knn"


def edit_manifest(store: Path, **changes) -> bytes:
    m = json.loads((store / "manifest.json").read_text())
    m.update(changes)
    (store / "manifest.json").write_text(json.dumps(m))
    return (store / "manifest.json").read_bytes()


def run_env(env: dict, *args) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "bigknn", *map(str, args)], env={**cli_env(), **env},
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    return proc.returncode, proc.stdout, proc.stderr


# ---- busy ---------------------------------------------------------------------------------------
def test_a_second_ingest_on_a_busy_store_exits_75_saying_so(cli, store, built):
    with WriterLock(store):
        code, out, err = cli("ingest", store, "--input", built.parent / "y.fbin", "--backend", "cpu")
    assert_one_line_error(code, out, err, str(store), "another writer holds the store", exit_code=BUSY)


def test_ingest_while_a_build_runs_says_a_build_is_running(cli, store, built):
    edit_manifest(store, merged=[])  # what a build still merging has committed
    with WriterLock(store):
        code, out, err = cli("ingest", store, "--input", built.parent / "y.fbin", "--backend", "cpu", "--wait", "0.3")
    line = assert_one_line_error(code, out, err, str(store), exit_code=BUSY)
    assert "build or merge is running" in line and "bigknn merge" not in line


# ---- environment and sizes ----------------------------------------------------------------------
@pytest.mark.parametrize("name, value", [("BIGKNN_CHECKPOINT_S", "inf"), ("BIGKNN_CHECKPOINT_S", "abc"),
                                         ("BIGKNN_LOG_EVERY_S", "-1"), ("BIGKNN_CUDA_MMA", "maybe"),
                                         ("BIGKNN_CUDA_GUNR", "x")])
def test_a_bad_environment_variable_is_refused_naming_it(built, name, value):
    code, out, err = run_env({name: value}, "info", built)
    assert_one_line_error(code, out, err, name, value)


def test_a_garbage_scheduler_address_is_refused_naming_the_variable(store):
    code, out, err = run_env({"DASK_SCHEDULER_ADDRESS": "not an address"}, "merge", store, "--backend", "cpu")
    assert_one_line_error(code, out, err, "DASK_SCHEDULER_ADDRESS", "not an address")


@pytest.mark.parametrize("option", ["--host-mem", "--gpu-mem"])
def test_negative_sizes_are_refused(cli, store, option):
    code, out, err = cli("merge", store, "--backend", "cpu", option, "-1G")
    assert_one_line_error(code, out, err, option, "negative")


def test_plan_counts_rounds_without_listing_pairs():
    assert [round_count(s) for s in range(40)] == [len(round_robin(s)) for s in range(40)]
    assert round_count(10**12) == 10**12 - 1  # a billion-shard plan: no list of pairs built


def test_plan_probes_the_stores_file_system_and_fails_naming_it(tmp_path, monkeypatch):
    from bigknn.operations.sizing import probe_dir
    assert probe_dir(tmp_path / "new" / "s.knn", None) == tmp_path
    monkeypatch.setattr(diskrate.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 30, 1 << 30, 1 << 20))
    with pytest.raises(BadInput, match="too little to measure") as info:
        diskrate.measure_disk(tmp_path)
    assert str(tmp_path) in str(info.value) and not list(tmp_path.iterdir())


# ---- damaged or inconsistent stores ---------------------------------------------------------------
def test_verify_lists_an_unreadable_chunk_with_the_rest(cli, store):
    m = json.loads((store / "manifest.json").read_text())
    unreadable = store / "shards/0/vectors/c/0/0"
    unreadable.unlink()
    unreadable.mkdir()  # a directory in the chunk's place: opening it fails as an unreadable file does
    missing = store / f"shards/2/graph/{m['shards'][2]['graph']}/ids/c/0/0"
    missing.unlink()
    code, out, _ = cli("verify", store, "--json")
    assert code == 1
    files = {p["file"] for p in json.loads(out)["damaged"]}
    assert {str(unreadable), str(missing)} <= files


@pytest.mark.parametrize("field, value, named", [
    ("shards", "gap", "shards[1].offset"), ("pending", "bad key", "pending.graphs")])  # dim: test_identity
def test_an_inconsistent_manifest_is_refused_naming_the_field_and_never_committed_on(cli, store, built, field,
                                                                                     value, named):
    m = json.loads((store / "manifest.json").read_text())
    if value == "gap":
        m["shards"][1]["offset"] += 1
        value = m["shards"]
    elif value == "bad key":
        value = {"inputs": [], "shards": [], "merged": [], "graphs": {"zero": 1}}
    before = edit_manifest(store, **{field: value})
    for args in (("info", store), ("verify", store),
                 ("ingest", store, "--input", built.parent / "y.fbin", "--backend", "cpu")):
        code, out, err = cli(*args)
        assert_one_line_error(code, out, err, str(store / "manifest.json"), named)
    assert (store / "manifest.json").read_bytes() == before


def test_merge_refuses_a_damaged_store(cli, store):
    m = json.loads((store / "manifest.json").read_text())
    missing = store / f"shards/1/graph/{m['shards'][1]['graph']}/dists/c/0/0"
    missing.unlink()
    code, out, err = cli("merge", store, "--backend", "cpu")
    assert_one_line_error(code, out, err, "damaged", str(missing), "bigknn verify")


# ---- inputs and outputs ---------------------------------------------------------------------------
def test_denormal_rows_are_refused_naming_the_row(cli, tmp_path):
    x = synth(300, DIM, seed=9)
    x[17] = 1e-42
    write_vectors(tmp_path / "d.fbin", x)
    code, out, err = cli("build", tmp_path / "d.fbin", "-o", tmp_path / "d.knn", "--backend", "cpu")
    assert_one_line_error(code, out, err, str(tmp_path / "d.fbin"), "row 17", "underflow")
    assert not (tmp_path / "d.knn").exists()


def test_a_directory_named_like_a_vector_file_exits_2_naming_it(cli, tmp_path):
    (tmp_path / "d.fbin").mkdir()
    code, out, err = cli("build", tmp_path / "d.fbin", "-o", tmp_path / "d.knn", "--backend", "cpu")
    assert_one_line_error(code, out, err, str(tmp_path / "d.fbin"), "directory")


def test_a_killed_writers_manifest_temp_file_is_removed_by_the_next_writer(cli, store):
    leftover = store / ".manifest.json.12345-0123abcd.tmp"
    leftover.write_text("{}")
    users = store / ".manifest.json.notes"
    users.write_text("not bigknn's")
    code, _, err = cli("merge", store, "--backend", "cpu")
    assert code == 0, err
    assert not leftover.exists() and users.read_text() == "not bigknn's"


def test_export_into_an_unwritable_directory_names_the_file_asked_for(cli, built):
    code, out, err = cli("export", built, "-o", "/sys/g.npz")  # sysfs: no file can be created there
    line = assert_one_line_error(code, out, err, "/sys/g.npz")
    assert ".tmp" not in line


def test_export_on_a_full_disk_names_the_file(built, tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(np, "savez", full)
    with pytest.raises(DiskFull) as info:
        export(Store.open(built), tmp_path / "g.npz")
    assert str(tmp_path / "g.npz") in str(info.value) and not list(tmp_path.iterdir())


def test_numba_cache_falls_back_to_a_private_directory(tmp_path):
    chosen = numbacache.choose({"HOME": str(tmp_path / "nowhere")}, writable=lambda p: False)
    st = os.stat(chosen)
    assert st.st_uid == os.getuid() and st.st_mode & 0o077 == 0
    assert numbacache.choose({"NUMBA_CACHE_DIR": "/x"}, writable=lambda p: False) is None
    assert numbacache.choose({"HOME": "/h"}, writable=lambda p: True) is None


# ---- the cron job under root ------------------------------------------------------------------------
CRON = Path(__file__).resolve().parents[2] / "scripts" / "cron" / "bigknn-ingest.sh"


@pytest.mark.skipif(os.geteuid() != 0, reason="the script's root check runs only as root")
def test_the_cron_job_as_root_refuses_a_store_others_can_write(store, tmp_path):
    drop = tmp_path / "drop"
    drop.mkdir()
    os.chown(store, 65534, 65534)
    proc = subprocess.run(["bash", str(CRON)], env={**os.environ, "BIGKNN_STORE": str(store),
                                                    "BIGKNN_DROP": str(drop), "BIGKNN": "false"},
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 2 and "refusing to run as root" in proc.stderr and str(store) in proc.stderr
    assert not Path(f"{store}.ingest.log").exists()
