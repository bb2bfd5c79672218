#!/usr/bin/env python3
"""Graph products (bigknn/products/): time and peak traced memory of the symmetric graph (in memory, and
written to .npz through disk buckets under a host budget), near-duplicate components and ``bigknn dedup``'s
whole work (components plus groups.parquet and the kept rows), core distances and the mutual-reachability
graph, on a store of N rows. One JSON object on stdout, with the build's time: the dedup bar is
``dedup.s / build_s`` (``dedup_over_build``).

The store is built here (clustered synth rows, --backend) unless --store names one. Peak memory is what
tracemalloc sees (NumPy's allocations), beside the graph's own size (rows x k ids and distances), so the
streamed steps can be told from ones that hold the graph (--no-trace leaves tracemalloc off: at 50M rows its
per-allocation cost shows in the times). components and dedup are timed after an untimed pass over the
lists (k = 1) and a tiny write, so that neither numba's loading or compiling of their loops nor pyarrow's
import is counted.

    PYTHONPATH=. python3 scripts/bench_products.py --rows 200000 --dim 32 --k 16 --host-mem 64M
    PYTHONPATH=. python3 scripts/bench_products.py --store data.knn --max-distance 0.1 --steps components,export_npz_out_of_core
    PYTHONPATH=. python3 scripts/bench_products.py --rows 50000000 --dim 96 --k 32 --backend cuda --steps dedup \
        --no-trace --work /tmp/bp
    PYTHONPATH=. python3 scripts/bench_products.py --store s50.knn --steps graph_reads,components,dedup --no-trace

graph_reads is a diagnostic: the components step's reads alone (its read threads, every chunk read and checked,
no union).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

STEPS = ("symmetric_union_distance", "symmetric_union_umap", "symmetric_mutual", "export_npz_out_of_core",
         "graph_reads", "components", "dedup", "core_distances", "mutual_reachability")
WARM_ROWS = 20_000  # an untimed build first on a GPU backend


def measured(fn, trace: bool):
    """(result, seconds, peak traced bytes or None) of ``fn()``."""
    if trace:
        tracemalloc.start()
        tracemalloc.reset_peak()
    t0 = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t0
    peak = None
    if trace:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return result, round(seconds, 3), peak


def graph_reads(store) -> int:
    """Every graph chunk read and checked by components()'s read threads, with no union (a diagnostic: the
    floor of the components step); returns the blocks read."""
    from bigknn.products.components import each_graph_block

    blocks = []
    each_graph_block(store, lambda first, g: blocks.append(first))
    return len(blocks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, default=None, help="An existing store (default: build one here).")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--host-mem", type=str, default="32M", help="Edge budget of the out-of-core .npz export.")
    ap.add_argument("--max-distance", type=float, default=None,
                    help="Components' threshold (default: the median first-neighbour distance).")
    ap.add_argument("--min-samples", type=int, default=10)
    ap.add_argument("--backend", default="cpu", choices=("cpu", "cuda", "auto"), help="The build's backend.")
    ap.add_argument("--work", type=Path, default=None,
                    help="Folder for the store and outputs (default: the system's temporary directory); removed after.")
    ap.add_argument("--no-trace", dest="trace", action="store_false", help="Time the steps without tracemalloc.")
    ap.add_argument("--steps", default=None,
                    help="Comma-separated steps to run (default all): " + ", ".join(STEPS) + ". dedup is `bigknn "
                         "dedup`'s work: components, groups.parquet and the kept rows. mutual_reachability holds "
                         "the union graph and the vectors in memory.")
    args = ap.parse_args()
    unknown = set() if args.steps is None else {s.strip() for s in args.steps.split(",")} - set(STEPS)
    if unknown:
        ap.error(f"unknown steps {', '.join(sorted(unknown))}; choose from {', '.join(STEPS)}")

    import bigknn
    from bigknn.cli.common import parse_bytes
    from bigknn.core.synth import synth
    from bigknn.products.components import Components

    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-products-", dir=args.work) as work:
        work = Path(work)
        if args.store is None:
            t0 = time.perf_counter()
            x = synth(args.rows, args.dim, seed=41)
            synth_s = round(time.perf_counter() - t0, 3)
            if args.backend != "cpu":  # the device's kernels compiled and loaded before the timed build
                bigknn.build(x[:WARM_ROWS], k=args.k, backend=args.backend, store=work / "warm.knn").close()
            t0 = time.perf_counter()
            g = bigknn.build(x, k=args.k, backend=args.backend, store=work / "bench.knn")
            build_s = round(time.perf_counter() - t0, 3)
            del x
        else:
            g, build_s, synth_s = bigknn.open(args.store), None, None
        info = g.info
        _, first = g.neighbors(k=1)
        max_distance = float(np.median(first)) if args.max_distance is None else args.max_distance
        min_samples = min(args.min_samples, info.k + 1)
        host_mem = parse_bytes(args.host_mem)
        result = {"rows": info.rows, "dim": info.dim, "k": info.k, "metric": info.metric, "backend": args.backend,
                  "synth_s": synth_s, "build_s": build_s, "graph_bytes": info.rows * info.k * 8, "host_mem": host_mem}
        steps = {
            "symmetric_union_distance": lambda: g.symmetric("union").nnz,
            "symmetric_union_umap": lambda: g.symmetric("union", weights="umap").nnz,
            "symmetric_mutual": lambda: g.symmetric("mutual").nnz,
            "export_npz_out_of_core": lambda: g.export_symmetric(work / "sym.npz", host_mem=host_mem)["entries"],
            "graph_reads": lambda: graph_reads(g._store),
            "components": lambda: g.components(max_distance).summary()["groups"],
            "dedup": lambda: g.components(max_distance).write(work / "groups.parquet", work / "keep.npy")["groups"],
            "core_distances": lambda: float(g.core_distances(min_samples).mean()),
            "mutual_reachability": lambda: g.mutual_reachability(min_samples).nnz,
        }
        chosen = STEPS if args.steps is None else [s.strip() for s in args.steps.split(",")]
        if {"components", "dedup"} & set(chosen):  # compiled loops loaded (or compiled), pyarrow imported
            g.components(max_distance, k=1)
            groups = "warm-groups.parquet" if "dedup" in chosen else "warm-groups.npy"
            Components(np.zeros(2, np.int64), 0.0).write(work / groups, work / "warm-keep.npy")
        for name in chosen:
            value, seconds, peak = measured(steps[name], args.trace)
            result[name] = {"s": seconds, "peak_bytes": peak, "result": value}
        if build_s and "dedup" in result:
            result["dedup_over_build"] = round(result["dedup"]["s"] / build_s, 4)
        result["components_max_distance"] = max_distance
        result["min_samples"] = min_samples
        g.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
