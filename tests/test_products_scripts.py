"""scripts/bench_products.py at a tiny size on the CPU: every step runs and reports, the dedup step writes what
`bigknn dedup` writes and gives the dedup-over-build ratio the GPU acceptance reads, and the work folder is
left empty."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CLI_TIMEOUT_S, cli_env

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_products.py"
STEPS = ("symmetric_union_distance", "symmetric_union_umap", "symmetric_mutual", "export_npz_out_of_core",
         "components", "dedup", "core_distances", "mutual_reachability")


def bench(*args) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], env=cli_env(), capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_every_step_reports_on_a_tiny_store(tmp_path):
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'bigknn[parquet]'): the dedup "
                                          "step writes groups.parquet")
    r = bench("--rows", 1500, "--dim", 8, "--k", 5, "--host-mem", "4K", "--work", tmp_path)
    assert (r["rows"], r["dim"], r["k"], r["backend"]) == (1500, 8, 5, "cpu") and r["build_s"] > 0
    for step in STEPS:
        assert r[step]["s"] >= 0 and r[step]["peak_bytes"] > 0, step
    assert r["dedup"]["result"] == r["components"]["result"] > 0  # the same groups, written
    assert r["dedup_over_build"] == round(r["dedup"]["s"] / r["build_s"], 4)
    assert r["symmetric_union_distance"]["result"] == r["export_npz_out_of_core"]["result"]
    assert list(tmp_path.iterdir()) == []


def test_untraced_dedup_alone(tmp_path):
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'bigknn[parquet]'): the dedup "
                                          "step writes groups.parquet")
    r = bench("--rows", 1000, "--dim", 4, "--k", 4, "--steps", "dedup", "--no-trace", "--work", tmp_path)
    assert r["dedup"]["peak_bytes"] is None and "components" not in r and r["dedup_over_build"] >= 0
    assert list(tmp_path.iterdir()) == []
