#!/usr/bin/env python3
"""Does ``--recall`` hold? Builds through ``bigknn.build`` over many seeds, each checked by an exact search.

For each data family (scripts/families.py; ``text`` from an embeddings file given with ``--text``), each seed,
in memory (one shard) and in 4 shards, and each target: the build's true recall@10 by an exact search of
``--check`` rows against all rows (CuPy brute force with ``--backend cuda``, NumPy otherwise, never bigknn's own
exact search), its recorded estimate with the 99 % interval, and its wall time. Prints one JSON line per build,
then one summary line: per target, family and mode, the share of builds whose true recall met the target and
the share whose interval covered it (the README's promise: >= 95 % and >= 90 %).

    PYTHONPATH=$PWD python3 scripts/bench_coverage.py --backend cuda --rows 1000000 --seeds 20
    PYTHONPATH=$PWD python3 scripts/bench_coverage.py --backend cpu --rows 5000 --seeds 5 --families synth,u8
    PYTHONPATH=$PWD python3 scripts/bench_coverage.py --text /data/text.fbin --families text --rows 500000

Seeds change both the rows drawn (a fresh draw of the family, or of the text file's rows) and the build's seed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import families  # noqa: E402 - the family generators live beside this script

import bigknn  # noqa: E402
from bigknn.formats import open_vectors  # noqa: E402

AT = 10  # recall@10, as the build's estimate
TIE_RTOL = 1e-5  # a neighbour at the exact 10th distance counts (bigknn.algorithms.recall_target's tie rule, restated here)
PROMISE = {"met": 0.95, "covered": 0.90}  # README: true recall >= target, interval covers the truth
MODES = {"memory": 1, "shards4": 4}


def family_rows(family: str, rows: int, seed: int, text: Path | None) -> tuple[np.ndarray, str]:
    """``rows`` rows of ``family`` drawn with ``seed``, and the metric the family is built with."""
    if family == "text":
        if text is None:
            raise SystemExit("family text needs --text FILE (unit-norm embeddings, e.g. from scripts/families.py)")
        data = open_vectors(text).data
        if rows > len(data):
            raise SystemExit(f"{text}: {len(data)} rows, {rows} asked")
        pick = np.sort(np.random.default_rng(seed).choice(len(data), rows, replace=False))
        return np.ascontiguousarray(data[pick]), "cosine"
    make, _, _, _ = families.synthetic(family, seed)
    return np.concatenate([make(s, min(families.BLOCK_ROWS, rows - s))
                           for s in range(0, rows, families.BLOCK_ROWS)]), "l2"


def true_recall(x: np.ndarray, ids: np.ndarray, metric: str, rows: np.ndarray, backend: str) -> float:
    """Mean recall@10 of ``ids`` (all rows' lists, nearest first) on ``rows``, by brute force over all of ``x``:
    a listed neighbour counts where its distance is within the exact 10th (ties count), self excluded."""
    xp = np
    if backend == "cuda":
        import cupy as xp
    base = xp.asarray(np.asarray(x, np.float32))
    if metric == "cosine":
        base /= xp.maximum(xp.linalg.norm(base, axis=1, keepdims=True), 1e-30)
    sq = (base * base).sum(axis=1)
    hits = 0.0
    block = max(1, min(1024, (1 << 28) // len(x)))  # rows of keys at a time: ~1 GB of float32
    for s in range(0, len(rows), block):
        r = xp.asarray(rows[s:s + block])
        q = base[r]
        key = -(q @ base.T) if metric == "cosine" else sq[r][:, None] + sq[None, :] - 2.0 * (q @ base.T)
        key[xp.arange(len(r)), r] = xp.inf  # self excluded
        kth = xp.partition(key, AT - 1, axis=1)[:, AT - 1]
        got = xp.asarray(np.asarray(ids[rows[s:s + block], :AT], np.int64))
        got_key = xp.take_along_axis(key, xp.maximum(got, 0), axis=1)
        ok = (got >= 0) & (got_key <= kth[:, None] + TIE_RTOL * xp.maximum(1.0, xp.abs(kth))[:, None])
        hits += float(ok.sum())
    return hits / (len(rows) * AT)


def one_build(x: np.ndarray, metric: str, mode: str, target: float, seed: int, args) -> dict:
    shard_rows = 0 if MODES[mode] == 1 else math.ceil(len(x) / MODES[mode])
    t = time.perf_counter()
    with bigknn.build(x, k=args.k, metric=metric, recall=target, backend=args.backend, seed=seed,
                      shard_rows=shard_rows) as g:
        wall = time.perf_counter() - t
        est = g.info.recall_estimate
        ids = g.neighbors(k=AT).ids
        shards, descents = g.report.shards, g.report.descents
    rows = np.arange(len(x)) if args.check >= len(x) else np.sort(
        np.random.default_rng((seed, 99)).choice(len(x), args.check, replace=False))
    truth = true_recall(x, ids, metric, rows, args.backend)
    return {"target": target, "mode": mode, "shards": shards, "seed": seed, "true": round(truth, 5),
            "estimate": est.recall, "low": est.low, "high": est.high, "build_s": round(wall, 3),
            "met": truth >= target, "covered": est.low <= truth <= est.high, "descents": descents}


def summary(runs: list[dict]) -> dict:
    """Per target, and per (target, family, mode): builds, the share that met the target and that covered."""
    groups: dict[str, list[dict]] = {}
    for r in runs:
        for key in (f"{r['target']}", f"{r['target']}/{r['family']}/{r['mode']}"):
            groups.setdefault(key, []).append(r)
    return {key: {"builds": len(rs), "met": round(np.mean([r["met"] for r in rs]), 3),
                  "covered": round(np.mean([r["covered"] for r in rs]), 3),
                  "worst_true": min(r["true"] for r in rs),
                  "mean_build_s": round(np.mean([r["build_s"] for r in rs]), 3)}
            for key, rs in sorted(groups.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="synth,iid64,u8,f16", help="comma-separated: synth iid64 iid128 u8 f16 text")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds run: first-seed .. first-seed + seeds - 1")
    ap.add_argument("--targets", default="0.99,0.95")
    ap.add_argument("--modes", default="memory,shards4", help="memory (one shard) and/or shards4 (4 shards)")
    ap.add_argument("--backend", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--check", type=int, default=10_000, help="rows checked exactly (all rows if fewer)")
    ap.add_argument("--text", type=Path, help="embeddings file of the text family (cosine)")
    args = ap.parse_args()
    runs = []
    for family in args.families.split(","):
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            x, metric = family_rows(family, args.rows, seed, args.text)
            for mode in args.modes.split(","):
                for target in (float(t) for t in args.targets.split(",")):
                    run = {"family": family, "rows": len(x), **one_build(x, metric, mode, target, seed, args)}
                    print(json.dumps(run), flush=True)
                    runs.append(run)
    print(json.dumps({"summary": summary(runs), "promise": PROMISE, "backend": args.backend, "rows": args.rows,
                      "seeds": args.seeds}), flush=True)


if __name__ == "__main__":
    main()
