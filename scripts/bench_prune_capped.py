#!/usr/bin/env python3
"""Issue 15's out-of-core prune: ``bigknn prune STORE --backend cuda`` uncapped, then with ``--gpu-mem CAP``
(a quarter of the vectors is the acceptance's cap), and the two search graphs compared array for array (ids
and occlusion factors of every row). CLI walls, so each run pays its own start. Prints JSON.

    python scripts/bench_prune_capped.py /tmp/bk/t2.knn --cap 960M --method tsdg
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bigknn.operations.search_arrays import current
from bigknn.shards import Store


def _prune(store: Path, method: str, extra: list[str]) -> tuple[dict, float]:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "bigknn", "prune", str(store), "--method", method, "--backend", "cuda",
                        "--json", *extra], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"bigknn prune {' '.join(extra)} failed (rc {r.returncode}): {r.stderr[-2000:]}")
    return json.loads(r.stdout), time.perf_counter() - t


def _graph(store: Path) -> tuple[np.ndarray, np.ndarray]:
    s = Store.open(store)
    try:
        e = current(s)
        shards = s.manifest.shards
        return (np.concatenate([s.read_search(e.version, f"shards/{sh.id}/ids") for sh in shards]),
                np.concatenate([s.read_search(e.version, f"shards/{sh.id}/lambdas") for sh in shards]))
    finally:
        s.close()


def _device_name() -> str:
    import cupy as cp

    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store", type=Path)
    ap.add_argument("--cap", required=True, help="--gpu-mem of the capped prune (e.g. 960M)")
    ap.add_argument("--method", default="tsdg", choices=["tsdg", "rng"])
    a = ap.parse_args()
    uncapped, t_uncapped = _prune(a.store, a.method, [])
    ids, lambdas = _graph(a.store)
    capped, t_capped = _prune(a.store, a.method, ["--gpu-mem", a.cap])
    c_ids, c_lambdas = _graph(a.store)
    print(json.dumps({
        "workload": "prune_capped", "store": str(a.store), "method": a.method, "rows": int(ids.shape[0]),
        "cap": a.cap, "device": _device_name(),
        "uncapped_cli_s": round(t_uncapped, 2), "capped_cli_s": round(t_capped, 2),
        "uncapped_prune_s": uncapped["wall_s"], "capped_prune_s": capped["wall_s"],
        "rows_ids_equal": float((ids == c_ids).all(axis=1).mean()),
        "rows_lambdas_equal": float((lambdas == c_lambdas).all(axis=1).mean()),
        "mean_degree": [uncapped["mean_degree"], capped["mean_degree"]]}))


if __name__ == "__main__":
    main()
