"""Issue 13's acceptance: the notebook-style quick start in examples/ runs as a user runs it, and says what
it should (recall, a CSR of the right size, an Isomap that unrolls the sheet, UMAP where it is installed)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from conftest import CLI_TIMEOUT_S, cli_env

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"


def test_quickstart_example_runs(tmp_path):
    proc = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, env={**cli_env(), "TMPDIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert float(re.search(r"^recall@10: ([\d.]+)$", out, re.M).group(1)) >= 0.95, out
    assert "CSR: (3000, 3000) with 45000 entries" in out
    assert float(re.search(r"roll's angle: ([\d.]+)", out).group(1)) >= 0.9, out
    if importlib.util.find_spec("umap") is not None:
        assert "UMAP embedding: (3000, 2)" in out, out
    else:
        assert "UMAP skipped: pip install umap-learn" in out
    assert list(tmp_path.iterdir()) == []  # the temporary stores (in TMPDIR) are gone after close()
