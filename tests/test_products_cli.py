"""Graph products (issue 41) through the command line: `bigknn export --symmetric / --core-distances` and
`bigknn dedup` equal the API's, bad input is one line and writes nothing, and the README chapters' example runs."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import bigknn
from conftest import CLI_TIMEOUT_S, assert_one_line_error, cli_env, run_cli, run_json
from test_products import with_duplicates


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    x = with_duplicates(300, 5, seed=42)
    np.save(d / "x.npy", x)
    run_json("build", d / "x.npy", "-o", d / "x.knn", "--k", 6, "--backend", "cpu", "--shard-rows", 150)
    return d, x


def test_cli_export_symmetric_and_core_distances_equal_the_api(stored, tmp_path):
    d, _ = stored
    g = bigknn.open(d / "x.knn")
    r = run_json("export", d / "x.knn", "-o", tmp_path / "u.npz", "--symmetric", "union", "--weights", "umap",
                 "--host-mem", "4K")
    assert r["entries"] == g.symmetric(weights="umap").nnz
    assert (sp.load_npz(tmp_path / "u.npz") != g.symmetric(weights="umap")).nnz == 0
    run_json("export", d / "x.knn", "-o", tmp_path / "core.npy", "--core-distances", 4)
    np.testing.assert_array_equal(np.load(tmp_path / "core.npy"), g.core_distances(4))
    r = run_json("dedup", d / "x.knn", "--max-distance", 0.01, "-o", tmp_path / "g.csv", "--keep",
                 tmp_path / "k.npy")
    assert r == {**g.components(0.01).summary(), "files": [str(tmp_path / "g.csv"), str(tmp_path / "k.npy")]}


@pytest.mark.parametrize("args, names", [
    (["export", "{s}", "-o", "{t}/a.npz", "--symmetric", "union", "--core-distances", "3"], ["--core-distances"]),
    (["export", "{s}", "-o", "{t}/a.ibin", "--symmetric", "union"], ["a.ibin", ".npz"]),
    (["export", "{s}", "-o", "{t}/a.npy", "--core-distances", "8"], ["min_samples = 8", "k = 6"]),
    (["export", "{s}", "-o", "{t}/a.txt", "--core-distances", "3"], ["a.txt", ".npy"]),
    (["export", "{s}", "-o", "{t}/a.npy", "--weights", "umap"], ["--weights", "--symmetric"]),
    (["dedup", "{s}", "--max-distance", "0.1", "-o", "{t}/g.json"], ["g.json", ".parquet"]),
    (["dedup", "{s}", "--max-distance", "0.1", "-o", "{t}/g.csv", "--keep", "{t}/k.bin"], ["k.bin"]),
])
def test_cli_bad_input_is_one_line_and_writes_nothing(stored, tmp_path, args, names):
    d, _ = stored
    code, out, err = run_cli(*[a.format(s=d / "x.knn", t=tmp_path) for a in args])
    assert_one_line_error(code, out, err, *names)
    assert list(tmp_path.iterdir()) == []


def test_cli_help_names_the_products():
    code, out, _ = run_cli("export", "--help")
    assert code == 0 and "--symmetric union" in out and "--core-distances 10" in out
    code, out, _ = run_cli("dedup", "--help")
    assert code == 0 and "--max-distance 0.05" in out


def test_products_example_runs(tmp_path):
    """The README chapters' example, as a user runs it."""
    example = Path(__file__).resolve().parents[1] / "examples" / "graph_products.py"
    proc = subprocess.run([sys.executable, str(example)], cwd=tmp_path, env={**cli_env(), "TMPDIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "groups: 5 rows removed: 68 largest: 40" in out and "rows kept: 2005" in out
    assert "symmetric: True" in out and "fuzzy weights in (0, 1]: True" in out
    assert float(re.search(r"ARI against HDBSCAN on the rows: ([\d.]+)", out).group(1)) >= 0.95, out
    umap_line = "UMAP embedding: (1500, 2)" if importlib.util.find_spec("umap") else "UMAP skipped"
    leiden_line = "Leiden on the mutual graph, ARI:" if importlib.util.find_spec("leidenalg") else "Leiden skipped"
    assert umap_line in out and leiden_line in out, out
    assert list(tmp_path.iterdir()) == []
