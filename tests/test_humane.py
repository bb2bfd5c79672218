"""Issue 13, items 5 and 6: what people see. Bad usage is one line and exit 2 with nothing written; plan
speaks in human units; progress is a bar on a terminal (NO_COLOR honoured) and log lines otherwise
(--quiet silences them); --plot draws recall and in-degree pictures, and says which extra it needs."""

from __future__ import annotations

import json
import logging
import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bigknn.backends.cuda import cuda_available
from bigknn.formats import open_vectors
from bigknn.core.progress import Reporter

from conftest import CLI_TIMEOUT_S, assert_one_line_error, cli_env, run_cli, run_json, tree_hashes, write_synth

ROWS, DIM, K, SHARD_ROWS = 2400, 8, 5, 1200
COLOR = re.compile(r"\x1b\[[0-9;]*(3[0-8]|9[0-7])[0-9;]*m")  # an SGR sequence that sets a foreground colour


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("humane")
    data = d / "data.fbin"
    write_synth(data, ROWS, DIM, seed=4)
    run_json("build", data, "-o", d / "store", "--k", K, "--shard-rows", SHARD_ROWS, "--backend", "cpu")
    return {"dir": d, "data": data, "store": d / "store"}


def run_env(*args, extra_env: dict) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "bigknn", *map(str, args)], env={**cli_env(), **extra_env},
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    return proc.returncode, proc.stdout, proc.stderr


# ---- bad usage: exit 2, one line, nothing written ------------------------------------------------
@pytest.mark.skipif(cuda_available(), reason="this machine has a GPU, so --backend cuda is not bad usage here")
def test_backend_cuda_without_a_gpu_is_bad_usage(built, tmp_path):
    for args in (["build", built["data"], "-o", tmp_path / "s.knn"], ["eval", "recall", built["store"]],
                 ["plan", "--rows", 1000, "--dim", 8]):
        code, out, err = run_cli(*args, "--backend", "cuda")
        line = assert_one_line_error(code, out, err, "--backend cuda")
        assert "--backend cpu" in line
    assert list(tmp_path.iterdir()) == []


def test_malformed_gpus_is_bad_usage_even_on_the_cpu(built, tmp_path):
    code, out, err = run_cli("build", built["data"], "-o", tmp_path / "s.knn", "--backend", "cpu", "--gpus", "0,x")
    assert_one_line_error(code, out, err, "--gpus 0,x")
    assert list(tmp_path.iterdir()) == []


def test_output_paths_that_cannot_be_written_are_bad_usage(built, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_bytes(b"keep")
    before = tree_hashes(tmp_path)
    for args, named in ((["export", built["store"], "-o", tmp_path / "missing" / "g.npy"], "missing"),
                        (["export", built["store"], "-o", a_file / "g.ibin"], "a_file"),
                        (["synth", tmp_path / "missing" / "x.fbin", "--rows", 10, "--dim", 2], "missing"),
                        (["export", built["store"], "-o", tmp_path], str(tmp_path))):
        code, out, err = run_cli(*args)
        assert_one_line_error(code, out, err, named)
    assert tree_hashes(tmp_path) == before


def test_synth_refuses_to_replace_a_file_without_force(tmp_path):
    out = tmp_path / "x.fbin"
    run_json("synth", out, "--rows", 20, "--dim", 3)
    before = out.read_bytes()
    code, stdout, err = run_cli("synth", out, "--rows", 50, "--dim", 3, "--seed", 1)
    assert "--force" in assert_one_line_error(code, stdout, err, str(out))
    assert out.read_bytes() == before
    run_json("synth", out, "--rows", 50, "--dim", 3, "--seed", 1, "--force")
    assert open_vectors(out).rows == 50


def test_click_usage_errors_are_one_line_too(tmp_path):
    code, out, err = run_cli("synth", tmp_path / "x.fbin", "--rows", 0, "--dim", 2)
    line = assert_one_line_error(code, out, err, "--rows")
    assert "bigknn synth --help" in line
    code, out, err = run_cli("build", "--no-such-option")
    assert_one_line_error(code, out, err, "--no-such-option")


def test_plan_without_timings_in_the_store_is_bad_usage(tmp_path):
    write_synth(tmp_path / "x.fbin", 300, 4)
    run_json("build", tmp_path / "x.fbin", "-o", tmp_path / "s.knn", "--k", 3, "--backend", "cpu")  # no merges
    code, out, err = run_cli("plan", "--rows", 10**6, "--dim", 4, "--store", tmp_path / "s.knn")
    assert_one_line_error(code, out, err, "s.knn", "timings")


# ---- plan in human units ---------------------------------------------------------------------------
def test_plan_speaks_in_human_units_and_shows_calibration_progress():
    code, out, err = run_cli("plan", "--rows", 10**9, "--dim", 96, "--k", 32, "--backend", "cpu",
                             "--calibrate-rows", 1000, "-v")
    assert code == 0, err
    assert re.search(r"disk +[\d.]+ (GB|TB) for the store", out), out
    assert re.search(r"time +≈ [\d.]+ (years|days) on cpu", out), out
    assert "a GPU would take" in out  # a CPU estimate beyond a day says what to do instead
    assert "calibrate: 9/9 steps (100 %)" in err, err
    as_json = run_json("plan", "--rows", 10**6, "--dim", 96, "--backend", "cpu", "--calibrate-rows", 1000)
    assert as_json["estimate_s"]["total"] > 0  # --json keeps the machine units


# ---- progress: log lines off a terminal, bars on one, NO_COLOR ---------------------------------------
def test_progress_is_logged_every_n_seconds_off_a_terminal_and_quiet_silences_it(built, tmp_path):
    args = ["build", built["data"], "-o", tmp_path / "a.knn", "--k", K, "--shard-rows", SHARD_ROWS // 2,
            "--backend", "cpu", "--json"]
    code, out, err = run_env(*args, extra_env={"BIGKNN_LOG_EVERY_S": "0.02"})
    assert code == 0, err
    assert json.loads(out)["merges_done"] == 6  # stdout stays the one JSON object
    lines = [line for line in err.splitlines()
             if re.match(r"bigknn: build: \d/4 shards' GNND, \d/6 pair merges \(\d+ %\)", line)]
    assert len(lines) >= 2 and lines[-1].startswith("bigknn: build: 4/4 shards' GNND, 6/6 pair merges (100 %)"), err
    plan = ["plan", "--rows", 10**6, "--dim", 8, "--backend", "cpu", "--calibrate-rows", 1000, "--json"]
    code, out, err = run_env(*plan, extra_env={"BIGKNN_LOG_EVERY_S": "0.001"})
    assert code == 0 and "bigknn: calibrate: 9/9 steps" in err, err
    code, out, err = run_env(*plan, "--quiet", extra_env={"BIGKNN_LOG_EVERY_S": "0.001"})
    assert code == 0 and err == "", err


def test_a_short_build_off_a_terminal_logs_its_start_and_end_naming_its_tasks(built, tmp_path):
    """A build shorter than the log interval said nothing at all; "tasks" were never explained."""
    args = ["build", built["data"], "-o", tmp_path / "a.knn", "--k", K, "--shard-rows", SHARD_ROWS // 2,
            "--backend", "cpu"]
    code, out, err = run_env(*args, extra_env={"BIGKNN_LOG_EVERY_S": "3600"})
    assert code == 0, err
    lines = err.splitlines()
    assert "bigknn: build: 4 shards' GNND and 6 pair merges to do" in lines, err
    assert any(line.startswith("bigknn: build: 4/4 shards' GNND, 6/6 pair merges (100 %) in ") for line in lines), err
    assert "tasks" not in err, err


def test_reporter_logs_every_phase_start_and_end(caplog):
    caplog.set_level(logging.DEBUG, logger="bigknn")
    with Reporter(every_s=0.01).phase("merge", 3, "pairs") as advance:
        advance(1)
        deadline = time.monotonic() + 60  # until the ticker has logged (a loaded machine schedules it late)
        while len(caplog.records) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        advance(2)
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert info[0] == "merge: 3 pairs to do", info
    assert len(info) >= 3 and info[-1].startswith("merge: 3/3 pairs (100 %) in "), info
    assert re.match(r"merge: 1/3 pairs \(33 %\) in [\d.]+ s, ([\d.]+ pairs/s|[\d.]+ s per pair), about [\d.]+ s left$",
                    info[1]), info
    caplog.clear()
    with Reporter(every_s=10).phase("gnnd", 1, "shards") as advance:
        advance(1)
    start, end = caplog.records  # however short the phase
    assert (start.levelno, start.getMessage()) == (logging.INFO, "gnnd: 1 shards to do")
    assert end.levelno == logging.INFO and end.getMessage().startswith("gnnd: 1/1 shards (100 %) in "), end


def on_a_terminal(args: list, env: dict) -> str:
    """Run the CLI with stderr on a pseudo-terminal; return what it showed there."""
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "bigknn", *map(str, args)], stdout=subprocess.DEVNULL,
                            stderr=child, env={**cli_env(), "TERM": "xterm-256color", **env})
    os.close(child)
    shown = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(main)
    assert proc.wait(timeout=CLI_TIMEOUT_S) == 0, shown
    return shown.decode(errors="replace")


def test_a_terminal_gets_a_progress_bar_in_colour_unless_no_color(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    args = ["synth", tmp_path / "x.fbin", "--rows", 1000, "--dim", 4, "--force"]
    coloured = on_a_terminal(args, {"NO_COLOR": ""} if "NO_COLOR" in env else {})
    assert "synth" in coloured and "1000/1000" in coloured and COLOR.search(coloured), repr(coloured)
    plain = on_a_terminal(args, {"NO_COLOR": "1"})
    assert "1000/1000" in plain and not COLOR.search(plain), repr(plain)


# ---- pictures ------------------------------------------------------------------------------------------
def test_eval_recall_plot_draws_a_png(built, tmp_path):
    picture = tmp_path / "recall.png"
    r = run_json("eval", "recall", built["store"], "--k", K, "--sample", 500, "--backend", "cpu", "--plot", picture)
    assert r["plot"] == str(picture) and r["sample"] == 500
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_info_plot_draws_the_in_degrees(built, tmp_path):
    picture = tmp_path / "degrees.svg"
    info = run_json("info", built["store"], "--plot", picture)
    d = info["in_degree"]
    ids = np.load(_export(built, tmp_path))
    want = np.bincount(ids.ravel(), minlength=ROWS)
    assert (d["mean"], d["max"], d["zero"]) == (K, want.max(), (want == 0).sum())
    assert b"<svg" in picture.read_bytes()[:1000]


def _export(built: dict, tmp_path: Path) -> Path:
    run_json("export", built["store"], "-o", tmp_path / "g.npy")
    return tmp_path / "g.npy"


def test_plot_without_matplotlib_names_the_extra(built, tmp_path):
    fake = tmp_path / "no_matplotlib"
    (fake / "matplotlib").mkdir(parents=True)
    (fake / "matplotlib" / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(fake), *filter(None, [os.environ.get("PYTHONPATH")])])}
    for args in (["eval", "recall", built["store"], "--k", K, "--backend", "cpu", "--plot", tmp_path / "r.png"],
                 ["info", built["store"], "--plot", tmp_path / "d.png"]):
        code, out, err = run_env(*args, extra_env=env)
        assert_one_line_error(code, out, err, "pip install matplotlib", "'.[plot]'")
    code, out, err = run_cli("info", built["store"], "--plot", tmp_path / "d.nope")
    assert_one_line_error(code, out, err, "d.nope", ".png")
    code, out, err = run_cli("eval", "recall", built["store"], "--plot", tmp_path / "missing" / "r.png", "--k", K,
                             "--backend", "cuda")  # refused before the backend is even chosen
    assert_one_line_error(code, out, err, "missing")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no_matplotlib"]  # nothing drawn, nothing left
