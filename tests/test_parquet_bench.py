"""scripts/bench_parquet.py at a tiny size on the CPU: the same rows as Parquet files and as one .f16bin, both
built through the CLI, with recall, peak RSS and the ratios the GPU acceptance reads; the folder removed after."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CLI_TIMEOUT_S, cli_env

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_parquet.py"


def test_parquet_and_f16bin_builds_of_the_same_rows_report(tmp_path):
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'bigknn[parquet]'): the script "
                                          "writes Parquet")
    folder = tmp_path / "bench"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rows", "3000", "--dim", "16", "--files", "3",
                           "--group-rows", "400", "--k", "5", "--recall-sample", "300", "--dir", str(folder), "--",
                           "--backend", "cpu"], env=cli_env(), capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert (r["rows"], r["dim"], r["files"]) == (3000, 16, 3)
    assert r["f16bin_gb"] == round(3000 * 16 * 2 / 1e9 + 8 / 1e9, 6)  # header + float16 rows
    for name in ("f16bin", "parquet"):
        assert r[name]["recall"] >= 0.9 and r[name]["peak_rss_gb"] > 0 and r[name]["build_wall_s"] > 0, name
        assert r[name]["store_gb"] > 0
    assert r["wall_ratio"] == round(r["parquet"]["build_wall_s"] / r["f16bin"]["build_wall_s"], 3)
    assert not folder.exists()
