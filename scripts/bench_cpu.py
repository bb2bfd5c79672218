#!/usr/bin/env python3
"""CPU benchmark (issue 16, target T6): bigknn vs pynndescent in one process, on the same data, through the
calls a user makes, with recall@10 of both by the same exact checker. Prints JSON lines, one per run.

Both tools run back to back in this process, so they see the same machine load (state it with the numbers:
this machine's cores are shared). pynndescent's first run in the process includes its numba compilation and
is reported as ``cold``; later runs are ``warm``. bigknn's first API call is ``cold`` too (numba kernels
compiled, or loaded from numba's cache); its CLI runs are a fresh process each, as a user's command is.

    python scripts/bench_cpu.py --rows 100000 --dim 96 --k 32 --repeat 2
    python scripts/bench_cpu.py --input /work/data/text100k.fbin --metric cosine --k 32
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RECALL_AT = 10
TIE_RTOL = 1e-5  # a neighbour at the exact 10th key (float32 rounding aside) counts: ties are hits


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def load(path: Path) -> np.ndarray:
    from bigknn.formats import open_vectors

    src = open_vectors(path)
    return np.ascontiguousarray(src.read(0, src.rows), dtype=np.float32)


def checker(x: np.ndarray, metric: str, rows: np.ndarray):
    """recall@10 of an (n, >= 10) id table (self excluded) on ``rows``, against brute force."""
    if metric == "cosine":
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-30)
    q = x[rows]
    keys = -(q @ x.T) if metric in ("ip", "cosine") else \
        (q * q).sum(1)[:, None] + (x * x).sum(1)[None, :] - 2 * (q @ x.T)
    keys[np.arange(len(rows)), rows] = np.inf
    kth = np.partition(keys, RECALL_AT - 1, axis=1)[:, RECALL_AT - 1]
    slack = TIE_RTOL * np.maximum(1.0, np.abs(kth))

    def recall(ids: np.ndarray) -> float:
        got = ids[rows, :RECALL_AT]
        hit = np.take_along_axis(keys, np.where(got < 0, rows[:, None], got), axis=1) <= (kth + slack)[:, None]
        return round(float(hit.mean()), 5)

    return recall


PYNN_SETTINGS = {"n_neighbors": int, "n_trees": int, "n_iters": int, "max_candidates": int, "delta": float}


def pynn_setting(text: str) -> dict:
    """``n_trees=4,max_candidates=16,n_iters=3`` -> the keyword arguments of NNDescent (only its cost knobs)."""
    setting = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name.strip() not in PYNN_SETTINGS or not value:
            raise argparse.ArgumentTypeError(f"{part!r}: give NAME=VALUE with NAME among {', '.join(PYNN_SETTINGS)}")
        setting[name.strip()] = PYNN_SETTINGS[name.strip()](value)
    return setting


def run_pynndescent(x: np.ndarray, metric: str, k: int, seed: int, setting: dict | None = None
                    ) -> tuple[float, np.ndarray]:
    """pynndescent's graph cut to k (self dropped); ``setting``: NNDescent's cost knobs (default: n_neighbors
    k + 1, the rest its defaults). Lists wider than k are one way to a higher recall (text 100K: 0.986 at its
    defaults, 0.991 at 38); fewer trees, candidates or iterations the way to a cheaper graph."""
    from pynndescent import NNDescent

    setting = {"n_neighbors": k + 1, **(setting or {})}
    t = time.perf_counter()
    ids, _ = NNDescent(x, metric={"l2": "euclidean", "ip": "dot"}.get(metric, metric), random_state=seed,
                       **setting).neighbor_graph
    wall = time.perf_counter() - t
    rows = np.arange(len(x))[:, None]
    out = np.array([r[r != i][:k] for i, r in zip(rows[:, 0], ids)])  # self dropped wherever it landed
    return wall, out


def run_api(path: Path, metric: str, k: int, threads: int | None, seed: int) -> tuple[float, np.ndarray, dict]:
    import bigknn

    t = time.perf_counter()
    with bigknn.build(path, k=k, metric=metric, backend="cpu", threads=threads, seed=seed) as g:
        wall = time.perf_counter() - t
        return wall, g.neighbors(RECALL_AT).ids, g.report.to_dict()


def run_cli(path: Path, metric: str, k: int, threads: int | None, seed: int, work: Path) -> tuple[float, dict]:
    store = Path(tempfile.mkdtemp(dir=work)) / "g.knn"
    cmd = [sys.executable, "-m", "bigknn", "build", str(path), "-o", str(store), "--k", str(k), "--metric", metric,
           "--backend", "cpu", "--seed", str(seed), "--json"] + (["--threads", str(threads)] if threads else [])
    t = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return time.perf_counter() - t, json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", type=Path, default=None, help="vectors file (default: `bigknn synth` data)")
    ap.add_argument("--rows", type=int, default=100_000, help="synth rows (without --input)")
    ap.add_argument("--dim", type=int, default=96, help="synth dimension (without --input)")
    ap.add_argument("--metric", default="l2", choices=["l2", "ip", "cosine"])
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=1, help="warm runs of each tool after the cold ones")
    ap.add_argument("--threads", type=int, default=None, help="bigknn --threads (default: all cores)")
    ap.add_argument("--sample", type=int, default=2000, help="rows the recall checker samples")
    ap.add_argument("--seed", type=int, default=0, help="data (synth), recall rows, and both tools' seed")
    ap.add_argument("--vary-seed", action="store_true",
                    help="warm round r runs both tools with seed + r: a descent's stop can fall an iteration later "
                         "by the luck of its draws, so one seed's time is one sample")
    ap.add_argument("--no-cli", action="store_true", help="skip the CLI runs")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--pynn", type=pynn_setting, nargs="*", default=[], metavar="SETTING",
                    help="also time pynndescent with each SETTING (e.g. n_neighbors=38, or "
                         "n_trees=4,max_candidates=16,n_iters=3), cut to k, in every warm round: its cheapest "
                         "setting at the recall bigknn reaches")
    a = ap.parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="bigknn-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    path = a.input
    if path is None:
        path = work / f"synth{a.rows}x{a.dim}.fbin"
        subprocess.run([sys.executable, "-m", "bigknn", "synth", str(path), "--rows", str(a.rows), "--dim", str(a.dim),
                        "--seed", str(a.seed), "--force", "--json"], check=True, capture_output=True)
    x = load(path)
    rows = np.random.default_rng(a.seed).choice(len(x), size=min(a.sample, len(x)), replace=False)
    recall = checker(x, a.metric, rows)
    common = {"data": path.name, "rows": len(x), "dim": x.shape[1], "metric": a.metric, "k": a.k,
              "cores": len(os.sched_getaffinity(0)), "load1": round(os.getloadavg()[0], 2)}
    for run in range(1 + a.repeat):
        mode = "cold" if run == 0 else "warm"
        seed = a.seed + run if a.vary_seed else a.seed
        common["seed"] = seed
        wall, ids = run_pynndescent(x, a.metric, a.k, seed)
        emit(tool="pynndescent", mode=mode, wall_s=round(wall, 2), recall_at_10=recall(ids), **common)
        wall, ids, report = run_api(path, a.metric, a.k, a.threads, seed)
        emit(tool="bigknn-api", mode=mode, wall_s=round(wall, 2), recall_at_10=recall(ids),
             descents=report.get("descents"), **common)
        if not a.no_cli:
            wall, report = run_cli(path, a.metric, a.k, a.threads, seed, work)
            with __import__("bigknn").open(report["store"]) as g:
                emit(tool="bigknn-cli", mode="process", wall_s=round(wall, 2), build_wall_s=report["wall_s"],
                     recall_at_10=recall(g.neighbors(RECALL_AT).ids), **common)
        for setting in a.pynn if run > 0 else []:  # each warm round: the peer's other settings too
            wall, ids = run_pynndescent(x, a.metric, a.k, seed, setting)
            emit(tool="pynndescent", mode="warm", setting=setting, wall_s=round(wall, 2),
                 recall_at_10=recall(ids), **common)
        common["load1"] = round(os.getloadavg()[0], 2)


if __name__ == "__main__":
    main()
