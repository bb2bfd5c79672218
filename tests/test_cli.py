"""The command line end to end, as a user runs it (``python -m bigknn ...`` in a subprocess): synth, build,
eval, info, export, resume, help and --json. Bad input and `bigknn synth`'s rows: tests/test_cli_inputs.py."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import click
import numpy as np
import pytest

from bigknn.formats import open_vectors, read_truth, write_truth, write_vectors
from bigknn.shards import WriterLock
from bigknn.shards.manifest import FORMAT_VERSION
from bigknn.core.synth import synth

from conftest import assert_one_line_error, exact_neighbours, read_manifest, recall_at, run_cli, run_json, tree_hashes

ROWS, DIM, K, SHARD_ROWS = 8000, 32, 10, 2000


# ---- one finished l2 build shared by the read-only tests ---------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    data = d / "data.fbin"
    s = run_json("synth", data, "--rows", ROWS, "--dim", DIM)
    assert s["rows"] == ROWS and s["dim"] == DIM and data.is_file()
    summary = run_json("build", data, "-o", d / "store", "--k", K, "--shard-rows", SHARD_ROWS, "--backend", "cpu")
    x = open_vectors(data).read(0, ROWS)
    return {"dir": d, "data": data, "store": d / "store", "summary": summary, "x": x}


def test_synth_writes_the_seeded_benchmark_rows(built):
    np.testing.assert_array_equal(built["x"], synth(ROWS, DIM, seed=0))


def test_build_summary(built):
    s = built["summary"]
    assert s["rows"] == ROWS and s["dim"] == DIM and s["k"] == K and s["metric"] == "l2"
    assert s["shards"] == 4 and s["merges_done"] == 6 and s["merges_total"] == 6
    assert s["resumed"] is False and s["backend"] == "cpu"
    m = read_manifest(built["store"])
    assert [sh["rows"] for sh in m["shards"]] == [2000] * 4
    assert [sh["offset"] for sh in m["shards"]] == [0, 2000, 4000, 6000]
    assert sorted(map(tuple, m["merged"])) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]


def test_build_timeline_books_every_task_once_and_adds_up_to_busy(built):
    s = built["summary"]
    lines = s["timeline"]
    assert sorted(t["phase"] for t in lines) == ["ggm"] * 6 + ["gnnd"] * 4
    merges = [t for t in lines if t["phase"] == "ggm"]  # (the GNND of 2,000 rows is exact: no descent)
    assert sum(t["iterations"] for t in merges) == s["descents"]["ggm"]["iterations"]
    for t in lines:
        assert 0 <= t["start"] <= t["end"] <= s["wall_s"]
    assert all(0 < t["descent_s"] <= t["end"] - t["start"] for t in merges)
    for a, b in zip(lines, lines[1:]):  # one worker's calls one after the other
        assert a["worker"] != b["worker"] or a["end"] <= b["start"], (a, b)
    for worker, frac in s["busy_frac"].items():
        busy = sum(t["end"] - t["start"] for t in lines if t["worker"] == worker)
        assert abs(busy / s["wall_s"] - frac) < 0.01, (worker, busy, frac)


def test_eval_recall(built):
    r = run_json("eval", "recall", built["store"], "--backend", "cpu")
    assert r["k"] == 10 and r["sample"] == ROWS
    assert r["recall"] >= 0.95, r


def test_eval_recall_with_ground_truth_file_agrees_with_exact_mode(built, tmp_path):
    x = built["x"]
    rows = np.arange(ROWS)
    ids, keys = exact_neighbours(x, rows, K)
    # the .ibin lists each row itself first, as big-ann-benchmarks ground truth of a base set does
    write_truth(tmp_path / "gt.ibin", np.concatenate([rows[:, None], ids], axis=1),
                np.sqrt(np.concatenate([np.zeros((ROWS, 1)), keys], axis=1)))
    exact = run_json("eval", "recall", built["store"], "--backend", "cpu", "--sample", ROWS)
    truth = run_json("eval", "recall", built["store"], "--backend", "cpu", "--sample", ROWS,
                     "--truth", tmp_path / "gt.ibin")
    assert abs(exact["recall"] - truth["recall"]) <= 1e-3, (exact, truth)
    # and both match this suite's own recall of the exported graph
    code, _, err = run_cli("export", built["store"], "-o", tmp_path / "g.npy", "--format", "npy")
    assert code == 0, err
    mine = recall_at(np.load(tmp_path / "g.npy"), x, rows, K, truth=(ids, keys))
    assert abs(mine - truth["recall"]) <= 1e-3, (mine, truth)


def test_info(built):
    i = run_json("info", built["store"])
    assert i["complete"] is True and i["merges_pending"] == 0 and i["merges_done"] == 6
    assert i["shards"] == 4 and i["shards_built"] == 4 and i["rows"] == ROWS
    assert i["k"] == K and i["dim"] == DIM and i["metric"] == "l2" and i["format"] == FORMAT_VERSION
    assert i["inputs"] == [str(built["data"].resolve())]
    assert i["disk_bytes"] >= ROWS * DIM * 4


def check_export(ids: np.ndarray, dists: np.ndarray, x: np.ndarray, metric: str) -> None:
    n = len(x)
    assert ids.shape == (n, K) and dists.shape == (n, K)
    assert ids.min() >= 0 and ids.max() < n
    assert not np.any(ids == np.arange(n)[:, None]), "a row lists itself"
    s = np.sort(ids, axis=1)
    assert not np.any(s[:, 1:] == s[:, :-1]), "a row lists one id twice"
    xd = x.astype(np.float64)
    dots = np.einsum("ij,ikj->ik", xd, xd[ids])
    if metric == "l2":
        want = np.sqrt(((xd[:, None, :] - xd[ids]) ** 2).sum(-1))
    elif metric == "ip":
        want = 1.0 - dots  # a distance: ascending as the inner product descends
    else:
        norms = np.linalg.norm(xd, axis=1)
        want = 1.0 - dots / (norms[:, None] * norms[ids])
    assert np.all(np.diff(dists, axis=1) >= -1e-6), "not nearest first"
    np.testing.assert_allclose(dists, want, rtol=1e-3, atol=1e-3)


def test_export_ibin_and_npy(built, tmp_path):
    x = built["x"]
    out = run_json("export", built["store"], "-o", tmp_path / "g.ibin")
    assert out["rows"] == ROWS and out["k"] == K and out["format"] == "ibin"
    ids, dists = read_truth(tmp_path / "g.ibin")
    ids, dists = np.array(ids), np.array(dists)
    check_export(ids, dists, x, "l2")
    rows = np.sort(np.random.default_rng(0).choice(ROWS, 1000, replace=False))
    assert recall_at(ids[rows], x, rows, K) >= 0.95

    out = run_json("export", built["store"], "-o", tmp_path / "g.npy", "--format", "npy")
    assert sorted(out["files"]) == sorted([str(tmp_path / "g.npy"), str(tmp_path / "g.dists.npy")])
    ids2, dists2 = np.load(tmp_path / "g.npy"), np.load(tmp_path / "g.dists.npy")
    assert ids2.dtype == np.int32 and dists2.dtype == np.float32
    np.testing.assert_array_equal(ids2, ids)
    np.testing.assert_array_equal(dists2, dists)


def test_export_refuses_a_mismatched_extension(built, tmp_path):
    code, out, err = run_cli("export", built["store"], "-o", tmp_path / "g.npy", "--format", "ibin")
    assert_one_line_error(code, out, err, "g.npy")
    assert not (tmp_path / "g.npy").exists()


@pytest.mark.parametrize("metric", ["ip", "cosine"])
def test_build_other_metrics(built, tmp_path, metric):
    store = tmp_path / f"store_{metric}"
    s = run_json("build", built["data"], "-o", store, "--k", K, "--shard-rows", SHARD_ROWS, "--backend", "cpu",
                 "--metric", metric, "--threads", 1)
    assert s["metric"] == metric and s["merges_done"] == 6
    assert read_manifest(store)["dtype"] == "<f4"
    r = run_json("eval", "recall", store, "--backend", "cpu", "--sample", 2000)
    assert r["recall"] >= 0.9, r
    assert run_json("info", store)["metric"] == metric
    run_json("export", store, "-o", tmp_path / "g.ibin")
    ids, dists = read_truth(tmp_path / "g.ibin")
    check_export(np.array(ids), np.array(dists), built["x"], metric)


def test_rerun_is_a_resume_that_changes_nothing(built, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(built["store"], store)
    before = tree_hashes(store)
    s = run_json("build", built["data"], "-o", store, "--k", K, "--shard-rows", SHARD_ROWS, "--backend", "cpu")
    assert s["resumed"] is True and s["merges_done"] == 6 and s["merges_total"] == 6
    after = tree_hashes(store)
    before.pop(".lock", None), after.pop(".lock", None)  # a writer run legitimately records itself there
    assert after == before


def test_build_with_other_k_is_refused_and_changes_nothing(built, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(built["store"], store)
    before = (store / "manifest.json").read_bytes()
    tree = tree_hashes(store)
    code, out, err = run_cli("build", built["data"], "-o", store, "--k", K + 2, "--shard-rows", SHARD_ROWS,
                             "--backend", "cpu")
    line = assert_one_line_error(code, out, err, str(store))
    assert "k" in line
    assert (store / "manifest.json").read_bytes() == before
    after = tree_hashes(store)
    tree.pop(".lock", None), after.pop(".lock", None)
    assert after == tree


def test_merge_of_a_finished_store_does_nothing(built, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(built["store"], store)
    before = tree_hashes(store)
    s = run_json("merge", store, "--backend", "cpu", "--threads", 1)
    assert s["merges_done"] == 6 and s["merges_total"] == 6
    after = tree_hashes(store)
    before.pop(".lock", None), after.pop(".lock", None)
    assert after == before


def test_second_writer_exits_cleanly_or_waits(built, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(built["store"], store)
    before = tree_hashes(store)
    with WriterLock(store):
        code, out, err = run_cli("merge", store, "--backend", "cpu")
        line = assert_one_line_error(code, out, err, str(store), exit_code=75)  # busy: EX_TEMPFAIL
        assert "another writer" in line and f"pid {os.getpid()}" in line
        during = tree_hashes(store)
        assert {k: v for k, v in during.items() if k != ".lock"} == \
            {k: v for k, v in before.items() if k != ".lock"}
    # --wait: the writer waits for the holder instead of failing
    lock = WriterLock(store)
    lock.__enter__()
    threading.Timer(1.0, lock.__exit__, args=(None, None, None)).start()
    t0 = time.monotonic()
    s = run_json("merge", store, "--backend", "cpu", "--wait", 30)
    assert time.monotonic() - t0 >= 0.9
    assert s["merges_done"] == 6
    after = tree_hashes(store)
    before.pop(".lock", None), after.pop(".lock", None)
    assert after == before


def test_commands_on_a_missing_store_create_nothing(tmp_path):
    nope = tmp_path / "nope"
    for args in (["info", nope], ["merge", nope, "--backend", "cpu"], ["eval", "recall", nope, "--backend", "cpu"],
                 ["export", nope, "-o", tmp_path / "g.ibin"]):
        code, out, err = run_cli(*args)
        assert_one_line_error(code, out, err, "nope")
        assert not nope.exists(), f"`bigknn {args[0]}` created the missing store's directory"
    assert list(tmp_path.iterdir()) == []


def test_largest_k_lists_every_other_row(tmp_path):
    """k = rows - 1 is the largest k accepted: every row must list all the others, once."""
    n = 40
    write_vectors(tmp_path / "tiny.fbin", np.random.default_rng(0).standard_normal((n, 8)).astype(np.float32))
    run_json("build", tmp_path / "tiny.fbin", "-o", tmp_path / "s", "--k", n - 1, "--backend", "cpu")
    run_json("export", tmp_path / "s", "-o", tmp_path / "g.npy", "--format", "npy")
    ids = np.load(tmp_path / "g.npy")
    want = [sorted(set(range(n)) - {i}) for i in range(n)]
    assert [sorted(r) for r in ids.tolist()] == want


def test_small_set_with_k_below_the_internal_list_width(tmp_path):
    """20 rows, k = 10: fewer rows than the width lists are built with; the k best must still be found."""
    n = 20
    x = np.random.default_rng(1).standard_normal((n, 8)).astype(np.float32)
    write_vectors(tmp_path / "tiny.fbin", x)
    run_json("build", tmp_path / "tiny.fbin", "-o", tmp_path / "s", "--k", 10, "--backend", "cpu")
    assert run_json("eval", "recall", tmp_path / "s", "--backend", "cpu")["recall"] == 1.0
    run_json("export", tmp_path / "s", "-o", tmp_path / "g.npy", "--format", "npy")
    ids = np.load(tmp_path / "g.npy")
    want, _ = exact_neighbours(x, np.arange(n), 10)
    np.testing.assert_array_equal(ids, want)


# ---- help and --json --------------------------------------------------------------------------
def all_commands() -> list[tuple[list[str], bool]]:
    """Every command path of the CLI, with whether it is a group."""
    from bigknn.cli.app import cli

    out = []

    def walk(cmd, path):
        is_group = isinstance(cmd, click.Group)
        out.append((path, is_group))
        if is_group:
            for name, sub in cmd.commands.items():
                walk(sub, path + [name])

    walk(cli, [])
    return out


def test_every_command_has_help_with_examples():
    """The top level's help through a real process (what a user runs); every command's through click's runner in
    this process (a process each cost ~1 s, 19 s in all)."""
    from click.testing import CliRunner

    from bigknn.cli.app import cli

    commands = all_commands()
    assert {"build", "merge", "info", "export", "synth"} <= {p[0] for p, _ in commands if p}
    assert ["eval", "recall"] in [p for p, _ in commands]
    code, top, err = run_cli("--help")
    assert code == 0 and "Usage:" in top, err
    runner = CliRunner()
    for path, is_group in commands:
        result = runner.invoke(cli, [*path, "--help"], prog_name="bigknn", terminal_width=120)
        code, out = result.exit_code, result.output
        assert code == 0, f"bigknn {' '.join(path)} --help exited {code}: {result.output}"
        assert "Usage:" in out
        if is_group:
            assert "Commands:" in out
            for name in {p[len(path)] for p, _ in commands if len(p) == len(path) + 1 and p[:len(path)] == path}:
                assert name in out
        if not is_group or not path:  # every command (and the top level) shows how it is run
            assert "Examples:" in out or "Quick start:" in out, f"bigknn {' '.join(path)} --help has no Examples"
        if not is_group:
            assert "Examples:" in out, f"bigknn {' '.join(path)} --help has no Examples section"
            assert "bigknn " + " ".join(path) in out  # the examples show this very command


def test_json_output_is_one_json_object(built, tmp_path):
    for args in (["info", built["store"]], ["eval", "recall", built["store"], "--backend", "cpu", "--sample", 100],
                 ["synth", tmp_path / "s.fbin", "--rows", 50, "--dim", 4],
                 ["export", built["store"], "-o", tmp_path / "e.ibin"]):
        code, out, err = run_cli(*args, "--json")
        assert code == 0, err
        assert out.count("\n") == 1 and isinstance(json.loads(out), dict), out
