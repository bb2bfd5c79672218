#!/usr/bin/env python3
"""CPU acceptance benchmark (issue 2 / target T6): synth -> build -> eval recall through the CLI.

Prints one JSON object: workload, parameters, device, time per phase, recall@10. With --pynndescent,
also times pynndescent (one shard, numba) on the same file for reference.

    python scripts/bench_cpu.py --rows 100000 --dim 96 --k 32 --shard-rows 25000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cli(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "bigknn", *args, "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=96)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--shard-rows", type=int, default=25_000)
    ap.add_argument("--sample", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pynndescent", action="store_true", help="also time pynndescent on the same data")
    ap.add_argument("--workdir", type=Path, default=None)
    a = ap.parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="bigknn-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    data, store = work / "data.fbin", work / "data.knn"
    cli("synth", str(data), "--rows", str(a.rows), "--dim", str(a.dim), "--seed", str(a.seed), "--force")
    t = time.perf_counter()
    built = cli("build", str(data), "-o", str(store), "--k", str(a.k), "--shard-rows", str(a.shard_rows),
                "--backend", "cpu")
    build_s = time.perf_counter() - t
    t = time.perf_counter()
    rec = cli("eval", "recall", str(store), "--sample", str(a.sample), "--backend", "cpu")
    eval_s = time.perf_counter() - t
    result = {"workload": f"synth clustered {a.rows}x{a.dim} float32", "k": a.k, "shard_rows": a.shard_rows,
              "shards": built["shards"], "merges": built["merges_done"], "device": f"cpu {platform.processor() or platform.machine()} x{os.cpu_count()}",
              "build_s": round(build_s, 2), "phase_s": built["phase_s"], "eval_s": round(eval_s, 2),
              "total_s": round(build_s + eval_s, 2), "recall@10": rec["recall"], "sample": rec["sample"]}
    if a.pynndescent:
        import numpy as np
        from pynndescent import NNDescent

        from bigknn.formats import open_vectors

        x = open_vectors(data).read(0, a.rows)
        NNDescent(x[:2000], n_neighbors=a.k)  # numba compilation out of the timing
        t = time.perf_counter()
        ids, _ = NNDescent(x, n_neighbors=a.k + 1, random_state=a.seed).neighbor_graph
        result["pynndescent_s"] = round(time.perf_counter() - t, 2)
        rng = np.random.default_rng(0)
        rows = rng.choice(a.rows, size=min(2000, a.rows), replace=False)
        q = x[rows]
        d = (q * q).sum(1)[:, None] + (x * x).sum(1)[None, :] - 2 * q @ x.T
        d[np.arange(len(rows)), rows] = np.inf
        kth = np.partition(d, 9, axis=1)[:, 9]
        got = np.array([[j for j in r if j != i][:10] for i, r in zip(rows, ids[rows])])
        gd = np.take_along_axis(d, got, axis=1)
        result["pynndescent_recall@10"] = round(float((gd <= kth[:, None] * (1 + 1e-5)).mean()), 5)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
