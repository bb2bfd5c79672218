#!/usr/bin/env python3
"""Search in batches of 10K, bigknn against CAGRA at chosen knobs, timed in interleaved rounds: one round times
every method once (``index.search``, ``Graph.search``, CAGRA at each itopk), so that the GPU's clock and
temperature drift over a run fall on all of them alike. ``bench_search_api.py`` sweeps each method in turn, and
its ratios near 1 move with that drift (issue 37); this script settles such a point. One JSON line per
method and round, then a summary (median QPS per method, recall@10 on the held-out queries).

    PYTHONPATH=$PWD python3 scripts/bench_search_rounds.py /data/sift.u8bin:l2 --degree 64 --budgets 10 \
        --cagra-degree 64 --itopk 16 32 --rounds 5 --work /tmp/bk
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bigknn  # noqa: E402
from bench_search_api import K, as_searched, recall  # noqa: E402
from bigknn.formats import read_truth  # noqa: E402
from search_bench import cagra_build, cagra_search, device_name, held_out  # noqa: E402

QUERIES = 10_000
BATCH = 10_000
CALLS = 40  # searches of the whole batch a round, per method


def per_second(search, q: np.ndarray, calls: int) -> float:
    """QPS of ``calls`` back-to-back searches of the batch ``q`` (after one untimed)."""
    search(q)
    t0 = time.perf_counter()
    for _ in range(calls):
        search(q)
    return calls * len(q) / (time.perf_counter() - t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input", help="FILE:METRIC; its last 10K rows are the queries")
    ap.add_argument("--degree", type=int, default=64, help="bigknn's search degree (built with k = 2 x degree)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[10], help="bigknn search list lengths")
    ap.add_argument("--cagra-degree", type=int, default=64)
    ap.add_argument("--itopk", type=int, nargs="+", default=[16, 32], help="CAGRA itopk sizes")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bigknn-rounds"))
    args = ap.parse_args(argv)
    import cupy as cp

    path, metric = args.input.rsplit(":", 1)
    family = Path(path).name.split(".")[0]
    x, q = held_out(path, QUERIES)
    args.work.mkdir(parents=True, exist_ok=True)
    store = args.work / f"{family}-rounds.knn"
    shutil.rmtree(store, ignore_errors=True)
    g = bigknn.build(x, k=2 * args.degree, metric=metric, store=store, backend="cuda")
    g.prune("tsdg", degree=args.degree, backend="cuda")
    gt = args.work / f"{family}-rounds.gt.ibin"
    gt.unlink(missing_ok=True)
    g.truth(q, gt, k=K, backend="cuda")
    truth = np.asarray(read_truth(gt)[0], np.int64)
    index = g.search_index(backend="cuda")
    g.search(q[:1], k=K, backend="cuda")  # its first call loads the index it keeps
    xs, qs = as_searched(x, metric), as_searched(q, metric)
    methods = {}  # name -> (search, the queries it is given: bigknn takes them as the user has them)
    for b in args.budgets:
        methods[f"bigknn-{args.degree} index.search budget {b}"] = (
            lambda qq, b=b: index.search(qq, k=K, budget=b).ids, q)
        methods[f"bigknn-{args.degree} Graph.search budget {b}"] = (
            lambda qq, b=b: g.search(qq, k=K, budget=b, backend="cuda").ids, q)
    cagra, _ = cagra_build(cp.asarray(xs), metric, args.cagra_degree, 20_000)
    for it in args.itopk:
        methods[f"cagra-{args.cagra_degree} itopk {it}"] = (cagra_search(cagra, it, K), qs)
    base = {"workload": "search_rounds", "family": family, "rows": len(x), "dim": x.shape[1], "metric": metric,
            "queries": len(q), "batch": BATCH, "calls_per_round": CALLS, "device": device_name("cuda")}
    rates: dict[str, list[float]] = {name: [] for name in methods}
    for r in range(args.rounds):
        for name, (search, given) in methods.items():
            rates[name].append(per_second(search, given[:BATCH], CALLS))
            print(json.dumps({**base, "round": r, "method": name, "qps": round(rates[name][-1], 1)}), flush=True)
    summary = {name: {"qps_median": round(statistics.median(v), 1), "qps_min": round(min(v), 1),
                      "qps_max": round(max(v), 1),
                      "recall@10": round(recall(qs, xs, np.asarray(methods[name][0](methods[name][1])), truth,
                                                metric), 5)}
               for name, v in rates.items()}
    print(json.dumps({**base, "rounds": args.rounds, "summary": summary}), flush=True)
    index.close()
    g.close()
    shutil.rmtree(store)
    return 0


if __name__ == "__main__":
    sys.exit(main())
