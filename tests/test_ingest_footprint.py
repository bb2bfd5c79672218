"""scripts/ingest_footprint.py: the old lists a batch enters equal those a brute-force k-NN of old and new rows
changes, and its page counts are those of the rows it names; the script runs and prints one line per case."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from conftest import CLI_TIMEOUT_S, cli_env

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ingest_footprint.py"


def _script():
    spec = importlib.util.spec_from_file_location("ingest_footprint", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lists_entered_are_those_a_brute_force_knn_changes():
    fp = _script()
    rng = np.random.default_rng(1)
    old, new, k = rng.standard_normal((700, 8)).astype(np.float32), rng.standard_normal((9, 8)).astype(np.float32), 5
    got = fp.entered(old, new, fp.kth_old_key(old, k))
    both = np.vstack([old, new])
    d2 = ((old[:, None, :].astype(np.float64) - both[None]) ** 2).sum(-1)
    d2[np.arange(len(old)), np.arange(len(old))] = np.inf
    want = (np.argsort(d2, axis=1, kind="stable")[:, :k] >= len(old)).any(1)
    assert 0 < want.sum() < len(old) and np.array_equal(got, want)


def test_pages_hold_the_rows_named():
    fp = _script()
    mask = np.zeros(100, bool)
    mask[[0, 33]] = True
    assert fp.pages_touched(mask, 1024) == 2 / 25  # 4 rows a page: pages 0 and 8 of 25
    assert fp.pages_touched(mask, 8192) == 2 / 100  # a row larger than a page: one row a page


def test_the_script_prints_one_line_per_family_and_fraction():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rows", "600", "--dim", "8", "--k", "4",
                           "--fractions", "0.01,0.05", "--families", "synth,iid"], env=cli_env(),
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["family"], r["new_rows"]) for r in lines] == [("synth", 6), ("synth", 30), ("iid", 6), ("iid", 30)]
    assert all(0 <= r[key] <= 1 for r in lines for key in ("lists_entered", "rows_pages", "graph_pages"))
    assert all(r["lists_entered"] > 0 for r in lines if r["new_rows"] == 30)
