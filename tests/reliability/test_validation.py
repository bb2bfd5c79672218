"""Issue 11, Deliver 6: bad input and bad usage exit 2 before anything is written, with one line naming the
file; SIGTERM stops a run like SIGINT; a full disk is one line naming the path and the bytes needed, with
the last commit intact; a malformed manifest or ground truth is a refusal, not a traceback or a wrong
number."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from bigknn.formats import read_truth, write_truth, write_vectors
from bigknn.shards import WriterLock
from bigknn.core.synth import synth

from conftest import (CLI_TIMEOUT_S, assert_one_line_error, cli_env, read_manifest, run_cli, run_json, tree_hashes,
                      wait_until_it_opens)

ROWS, DIM = 2000, 8
BUILD = ("--k", 5, "--shard-rows", 1000, "--backend", "cpu")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("validation")
    write_vectors(d / "base.fbin", synth(ROWS, DIM, seed=4))
    run_json("build", d / "base.fbin", "-o", d / "store", *BUILD)
    return d / "store"


@pytest.fixture
def store(built, tmp_path) -> Path:
    shutil.copytree(built, tmp_path / "store")
    return tmp_path / "store"


def edit_manifest(store: Path, edit) -> None:
    path = store / "manifest.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


# ---- values -------------------------------------------------------------------------------------
def test_build_refuses_a_row_whose_squared_norm_overflows_float32(tmp_path):
    """Reproduction: finite values near 1e20 passed validation and exported as id -1 / inf."""
    x = synth(ROWS, DIM, seed=4)
    x[1234] = 1e20
    write_vectors(tmp_path / "big.fbin", x)
    code, out, err = run_cli("build", tmp_path / "big.fbin", "-o", tmp_path / "store", *BUILD)
    line = assert_one_line_error(code, out, err, "big.fbin", "row 1234")
    assert "overflow" in line
    assert not (tmp_path / "store").exists()


def test_ingest_refuses_a_row_whose_squared_norm_overflows_float32(store, tmp_path):
    x = synth(300, DIM, seed=5)
    x[77, 0] = 3e19  # one value is enough: 9e38 > float32's max
    write_vectors(tmp_path / "big.fbin", x)
    before = tree_hashes(store)
    code, out, err = run_cli("ingest", store, "--input", tmp_path / "big.fbin", "--backend", "cpu")
    assert_one_line_error(code, out, err, "big.fbin", "row 77")
    assert tree_hashes(store) == before


def test_large_values_below_the_limit_export_without_empty_slots(tmp_path):
    """Regression guard (passes on the old code too): rows with squared norms up to 1e37, a little under the
    limit (float32's max / 4), are accepted, and no distance overflows to an empty slot (id -1, inf)."""
    x = synth(ROWS, DIM, seed=6).astype(np.float64)
    x *= np.sqrt(1e37) / np.linalg.norm(x, axis=1).max()
    write_vectors(tmp_path / "large.fbin", x.astype(np.float32))
    run_json("build", tmp_path / "large.fbin", "-o", tmp_path / "store", *BUILD)
    run_json("export", tmp_path / "store", "-o", tmp_path / "g.ibin")
    ids, dists = read_truth(tmp_path / "g.ibin")
    assert (np.asarray(ids) >= 0).all() and np.isfinite(dists).all()


def test_npy_with_trailing_bytes_is_refused(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, synth(ROWS, DIM, seed=7))
    with open(path, "ab") as f:
        f.write(b"\0" * 12)
    code, out, err = run_cli("build", path, "-o", tmp_path / "store", *BUILD)
    line = assert_one_line_error(code, out, err, "x.npy")
    assert "trailing bytes" in line
    assert not (tmp_path / "store").exists()


# ---- usage: refused before anything is written -------------------------------------------------
@pytest.mark.parametrize("command", ["ingest", "merge"])
def test_host_mem_too_small_is_refused_before_anything_is_written(store, tmp_path, command):
    """Reproduction: `ingest --host-mem 1M` exited 2 after it had committed a pending ingest."""
    write_vectors(tmp_path / "day1.fbin", synth(300, DIM, seed=8))
    args = ["--input", tmp_path / "day1.fbin"] if command == "ingest" else []
    before = tree_hashes(store)  # the lock file included: not even it is rewritten
    code, out, err = run_cli(command, store, *args, "--host-mem", "1K", "--backend", "cpu")
    assert_one_line_error(code, out, err, str(store), "--host-mem")
    assert tree_hashes(store) == before


def test_a_merge_count_that_cannot_finish_is_refused_without_a_prompt(tmp_path):
    """Reproduction: `--shard-rows 11 --k 10` planned 183,315 merges without a word (here 20,000 rows give
    408 shards of at least 49 rows, lists being 48 wide, and 83,028 merges). The old code starts merging: the
    timeout fails it."""
    write_vectors(tmp_path / "x.fbin", synth(20000, 4, seed=9))
    code, out, err = run_cli("build", tmp_path / "x.fbin", "-o", tmp_path / "store", "--k", 10, "--shard-rows", 11,
                             "--backend", "cpu", timeout=300)
    line = assert_one_line_error(code, out, err, "83,028 merges", "--shard-rows")
    assert "store" in line
    assert not (tmp_path / "store").exists()


# ---- signals ------------------------------------------------------------------------------------
def test_sigterm_mid_build_exits_143_with_the_last_commit_intact(tmp_path):
    """Reproduction: SIGTERM exited silently. It now unwinds like Ctrl-C: one line, exit 128 + 15, the lock
    free, the last commit readable, and `merge` finishes the build."""
    # 6 shards of 2500 rows (above EXACT_ROWS: each gets NN-Descent, each merge a descent of 5000 rows), 15
    # merges of some 0.1 s each: the signal lands mid-merges, where 120 merges of 250-row shards had all ended
    # between two polls on a loaded machine
    write_vectors(tmp_path / "x.fbin", synth(15000, DIM, seed=10))
    store = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, "-m", "bigknn", "build", str(tmp_path / "x.fbin"), "-o", str(store),
                             "--k", "5", "--shard-rows", "2500", "--backend", "cpu"],
                            env=dict(cli_env(), BIGKNN_LOG_EVERY_S="0"),  # a loaded machine: no 30 s progress line
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _merged(store):  # the build is past its first commits, mid-merges
        assert proc.poll() is None, f"the build ended before it was signalled: {proc.communicate()}"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
    line = assert_one_line_error(proc.returncode, out, err, "SIGTERM", exit_code=143)
    assert "interrupted" in line
    with WriterLock(store):  # free at once
        pass
    m = read_manifest(store)
    assert len(m["shards"]) == 6 and len(m["merged"]) < 15
    done = run_json("merge", store, "--backend", "cpu")
    assert done["merges_done"] == 15


def test_sigint_while_waiting_for_the_lock_exits_130_with_one_line(store):
    """Ctrl-C used to print a blank line and 'aborted' with exit 1; both signals now exit 128 + N."""
    with WriterLock(store):
        proc = subprocess.Popen([sys.executable, "-m", "bigknn", "merge", str(store), "--wait", "60",
                                 "--backend", "cpu"], env=cli_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        wait_until_it_opens(proc, store / ".lock")  # started, handlers installed, waiting for the lock
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
    assert_one_line_error(proc.returncode, out, err, "SIGINT", exit_code=130)


def _merged(store: Path) -> bool:
    try:
        return bool(read_manifest(store)["merged"])
    except (OSError, ValueError, KeyError):
        return False


# ---- malformed stores and ground truth ----------------------------------------------------------
MANIFEST_DAMAGE = {
    "a JSON list": lambda m: [m],
    "shard rows as a string": lambda m: {**m, "shards": [{**m["shards"][0], "rows": str(m["shards"][0]["rows"])},
                                                         *m["shards"][1:]]},
    "a missing field": lambda m: {k: v for k, v in m.items() if k != "dim"},
    "a graph version as a string": lambda m: {**m, "shards": [{**s, "graph": "1"} for s in m["shards"]]},
    "a merged pair that is not a pair": lambda m: {**m, "merged": [[0]]},
}


@pytest.mark.parametrize("damage", MANIFEST_DAMAGE)
def test_malformed_manifest_is_a_one_line_refusal(store, damage):
    """Reproduction: a manifest that is a JSON list, or a shard `rows` that is a string, gave a traceback
    (exit 1); a graph version or a merged pair of the wrong type was accepted silently. (A missing field
    was refused before too: a regression guard.)"""
    edit_manifest(store, MANIFEST_DAMAGE[damage])
    code, out, err = run_cli("info", store)
    assert_one_line_error(code, out, err, str(store / "manifest.json"))


@pytest.mark.parametrize("command", [("eval", "recall"), ("export",), ("merge",), ("ingest",)])
def test_every_command_refuses_a_malformed_manifest(store, tmp_path, command):
    edit_manifest(store, MANIFEST_DAMAGE["shard rows as a string"])
    extra = {"eval": ["--k", 5], "export": ["-o", tmp_path / "g.ibin"],
             "ingest": ["--input", tmp_path / "day.fbin"]}.get(command[0], [])
    write_vectors(tmp_path / "day.fbin", synth(300, DIM, seed=11))
    before = tree_hashes(store)
    code, out, err = run_cli(*command, store, *extra)
    assert_one_line_error(code, out, err, str(store / "manifest.json"))
    assert tree_hashes(store) == before and not (tmp_path / "g.ibin").exists()


@pytest.mark.parametrize("bad_id", [ROWS + 5, -3])
def test_eval_with_truth_ids_outside_the_store_is_refused(built, tmp_path, bad_id):
    """Reproduction: `eval --truth` with out-of-range ids read uninitialised memory."""
    rows = np.arange(ROWS)
    ids = (rows[:, None] + np.arange(12)[None, :]) % ROWS  # self first, then 11 other rows
    ids[700, 4] = bad_id
    write_truth(tmp_path / "gt.ibin", ids, np.zeros(ids.shape))
    code, out, err = run_cli("eval", "recall", built, "--truth", tmp_path / "gt.ibin", "--k", 5, "--backend", "cpu")
    line = assert_one_line_error(code, out, err, "gt.ibin")
    assert f"id {bad_id}" in line and "row 700" in line


def test_eval_recall_of_an_unfinished_store_is_refused(store):
    """Reproduction: `eval recall` on an unfinished store reported 0.25 with exit 0."""
    edit_manifest(store, lambda m: {**m, "merged": m["merged"][:-1]})
    code, out, err = run_cli("eval", "recall", store, "--k", 5, "--backend", "cpu")
    line = assert_one_line_error(code, out, err, str(store))
    assert "not finished" in line and "bigknn merge" in line


# ---- a full disk (a small tmpfs in a private mount namespace) -----------------------------------
SMALL_FS_PRELUDE = """
import json, os, shutil, subprocess, sys
from pathlib import Path
p = json.loads(sys.argv[1])
mnt = Path(p["mount"])
subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={p['size_kb']}k", "tmpfs", str(mnt)], check=True)
def cli(*args):
    r = subprocess.run([sys.executable, "-m", "bigknn", *map(str, args)], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr
def fill_leaving(nbytes):
    (mnt / "filler").write_bytes(bytes(max(0, shutil.disk_usage(mnt).free - nbytes)))
result = {}
"""


def in_small_fs(tmp_path: Path, size_kb: int, body: str, **params) -> dict:
    """Run ``body`` (Python) with a tmpfs of ``size_kb`` KiB mounted at ``params['mount']``, in a user and
    mount namespace of its own (no root needed); the body fills ``result``, which is returned."""
    mount = tmp_path / "small"
    mount.mkdir()
    script = SMALL_FS_PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(result))\n"
    args = json.dumps({"mount": str(mount), "size_kb": size_kb, **{k: str(v) for k, v in params.items()}})
    proc = subprocess.run(["unshare", "-rm", sys.executable, "-c", script, args], env=cli_env(),
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def small_fs_available(tmp_path_factory) -> None:
    d = tmp_path_factory.mktemp("probe")
    try:
        probe = subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(d)],
                               capture_output=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("no `unshare` here: the full-disk tests need a private tmpfs")
    if probe.returncode:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {probe.stderr.decode().strip()}")


def test_disk_full_during_ingest_names_the_path_and_keeps_the_last_commit(small_fs_available, built, tmp_path):
    """Reproduction: disk full said `OSError: [Errno 28]` with no path or hint."""
    write_vectors(tmp_path / "day1.fbin", synth(1000, DIM, seed=12))
    result = in_small_fs(tmp_path, 4096, """
        shutil.copytree(p["store"], mnt / "store")
        manifest = (mnt / "store" / "manifest.json").read_bytes()
        fill_leaving(200 << 10)  # room for the new rows, not for their graph
        result["first"] = cli("ingest", mnt / "store", "--input", p["input"], "--backend", "cpu")
        result["info"] = cli("info", mnt / "store", "--json")
        (mnt / "filler").unlink()
        result["again"] = cli("ingest", mnt / "store", "--input", p["input"], "--backend", "cpu", "--json")
    """, store=built, input=tmp_path / "day1.fbin")
    code, out, err = result["first"]
    line = assert_one_line_error(code, out, err, str(tmp_path / "small" / "store"), exit_code=1)
    assert "no space left on device" in line and "needs" in line and "bytes" in line
    code, out, _ = result["info"]
    info = json.loads(out)
    assert code == 0 and info["complete"] is True and info["rows"] == ROWS  # the last commit, readable
    code, out, err = result["again"]
    assert code == 0, err
    assert json.loads(out)["rows"] == ROWS + 1000


def test_disk_full_export_names_the_file_and_keeps_the_previous_one(small_fs_available, built, tmp_path):
    result = in_small_fs(tmp_path, 64, """
        (mnt / "g.ibin").write_bytes(b"the previous export")
        result["first"] = cli("export", p["store"], "-o", mnt / "g.ibin")
        result["previous"] = (mnt / "g.ibin").read_text()
        result["names"] = sorted(os.listdir(mnt))
    """, store=built)
    code, out, err = result["first"]
    needed = 8 + ROWS * 5 * 8
    line = assert_one_line_error(code, out, err, str(tmp_path / "small" / "g.ibin"), f"{needed:,}", exit_code=1)
    assert "no space left on device" in line
    assert result["previous"] == "the previous export" and result["names"] == ["g.ibin"]
