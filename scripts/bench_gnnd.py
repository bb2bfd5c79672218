#!/usr/bin/env python3
"""Benchmarks of the CUDA backend: GNND (T1 and variants), GGM (one T2 merge) and exact k-NN (T5).
One JSON object per line.

Times exclude data generation and include the H2D copy, all kernels and the result back on the host.
Recall@10 is measured on 2000 sampled rows against exact top-10 computed on the GPU (self excluded).

    PYTHONPATH=. python3 scripts/bench_gnnd.py --workloads t1,u8,cos,exact
    PYTHONPATH=. python3 scripts/bench_gnnd.py --workloads ggm      # 2 x 1M x 96 shards, one merge
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

import numpy as np

from bigknn.core.metric import IP, L2
from bigknn.core.params import GnndParams
from bigknn.core.synth import synth


def _device_name() -> str:
    import cupy as cp

    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _emit(rec: dict, out):
    line = json.dumps(rec)
    print(line, flush=True)
    if out is not None:
        out.write(line + "\n")
        out.flush()


def recall_at10(backend, x, ids, metric, sample=2000, seed=0) -> float:
    rows = np.random.default_rng(seed).choice(len(x), min(sample, len(x)), replace=False)
    g = backend.exact_knn(x[rows], 11, metric, [(0, x)])
    hits = 0
    for r, ex, got in zip(rows, g.ids, ids[rows]):
        ex = [v for v in ex if v != r][:10]
        hits += len(set(ex) & set(got[:10].tolist()))
    return hits / (10 * len(rows))


def bench_gnnd(backend, x, metric, workload, k, iters_list, p_list, out, min_update_frac=0.0, seed=1,
               widths=(0,)):
    # warm-up on a slice: compiles (NVRTC) the kernels of this dtype / dim / p class
    # (100K rows: also allocates the pinned staging buffers used for copies of >= 16 MB)
    for p in p_list:
        backend.gnnd(x[:100000], metric, GnndParams(k=k, samples=p, iters=2), seed=0)
    for lw, p, iters in [(lw, p, it) for lw in widths for p in p_list for it in iters_list]:
        kw = {} if min_update_frac is None else {"min_update_frac": min_update_frac}
        kw["list_width"] = lw
        params = GnndParams(k=k, samples=p, iters=iters, **kw) if iters else GnndParams(k=k, samples=p, **kw)
        t0 = time.perf_counter()
        g = backend.gnnd(x, metric, params, seed=seed)
        dt = time.perf_counter() - t0
        stats = dict(backend.last_stats)
        rec = {
            "workload": workload, "rows": int(x.shape[0]), "dim": int(x.shape[1]), "dtype": str(x.dtype),
            "metric": metric.name, "k": k, "p": stats.get("p", p), "iters": params.iters,
            "min_update_frac": params.min_update_frac,
            "device": _device_name(), "time_s": round(dt, 4),
            "recall@10": round(recall_at10(backend, x, g.ids, metric), 4),
            "iters_run": stats.get("iters_run"), "updates": stats.get("updates"),
            "k_built": stats.get("k_built"), "list_width": params.width(),
            "phases_s": {key: round(stats.get(key, 0.0), 4) for key in ("h2d_s", "init_s", "iter_s", "d2h_s")},
            "kernel_ms": stats.get("kernel_ms"), "cross_ms_per_iter": stats.get("cross_ms_per_iter"),
        }
        _emit(rec, out)


def bench_ggm(backend, rows, dim, k, list_width, repeats, out, seed=0, variants=("{}",)):
    """One T2 merge: two shards of ``rows`` x dim (synth, one set of 2 * rows split in halves), each built
    by gnnd with GnndParams defaults (k, list_width), then CudaBackend.ggm timed ``repeats`` times (same
    inputs). Recall@10 of the union's rows: before (shard graphs) and after the merge."""
    from bigknn.core.knn_graph import ShardPart
    from bigknn.core.knn_graph import KnnGraph

    x = synth(2 * rows, dim, seed=seed)
    params = GnndParams(k=k, list_width=list_width)
    ga = backend.gnnd(x[:rows], L2, params, seed=1)
    gnnd_s = backend.last_stats.get("total_s")
    gb = backend.gnnd(x[rows:], L2, params, seed=2)
    gb = KnnGraph(np.where(gb.ids >= 0, gb.ids + rows, -1).astype(np.int32), gb.dists)
    a, b = ShardPart(0, x[:rows], ga), ShardPart(rows, x[rows:], gb)
    # warm-up on slices: compiles the GGM kernels of this dtype / dim / p class, allocates the staging
    wa = KnnGraph(np.where(ga.ids[:50000] < 50000, ga.ids[:50000], -1).astype(np.int32), ga.dists[:50000])
    wb = KnnGraph(np.where(gb.ids[:50000] < rows + 50000, gb.ids[:50000], -1).astype(np.int32), gb.dists[:50000])
    backend.ggm(ShardPart(0, x[:50000], wa), ShardPart(rows, x[rows:rows + 50000], wb), L2, params, seed=0)
    before = np.concatenate([ga.ids, gb.ids])
    r_before = recall_at10(backend, x, before, L2)
    del before
    for variant, rep in [(v, r) for v in variants for r in range(repeats)]:
        params = replace(GnndParams(k=k, list_width=list_width), **json.loads(variant))
        t0 = time.perf_counter()
        ma, mb = backend.ggm(a, b, L2, params, seed=3 + rep)
        dt = time.perf_counter() - t0
        stats = dict(backend.last_stats)
        ids = np.concatenate([ma.ids, mb.ids])
        _emit({"workload": "ggm_2x1m", "rows": [rows, rows], "dim": dim, "dtype": "float32", "metric": "l2",
               "k": k, "list_width": params.width(), "p": stats.get("p"), "merge_iters": params.merge_iters,
               "min_update_frac": params.min_update_frac, "device": _device_name(), "repeat": rep,
               "time_s": round(dt, 4), "recall@10": round(recall_at10(backend, x, ids, L2), 4),
               "recall@10_before": round(r_before, 4), "gnnd_shard_s": round(gnnd_s or 0.0, 4),
               "variant": variant, "report": ma.report,
               "iters_run": stats.get("iters_run"), "updates": stats.get("updates"),
               "phases_s": {key: round(stats.get(key, 0.0), 4)
                            for key in ("h2d_s", "setup_s", "iter_s", "finish_s", "d2h_s")},
               "kernel_ms": stats.get("kernel_ms")}, out)
        del ids, ma, mb


def synth_blocks_gpu(rows_total: int, dim: int, block: int, seed: int = 0):
    """The synth recipe (200 clusters in 12-d, lifted, + noise) generated on the GPU, returned as host blocks."""
    import cupy as cp

    rs = cp.random.RandomState(seed)
    centres = rs.normal(0.0, 4.0, size=(200, 12)).astype(cp.float32)
    lift = rs.normal(0.0, np.sqrt(1.0 / 12), size=(12, dim)).astype(cp.float32)
    out = []
    for start in range(0, rows_total, block):
        n = min(block, rows_total - start)
        lab = rs.randint(0, 200, size=n)
        low = centres[lab] + rs.normal(size=(n, 12), dtype=cp.float32)
        x = low @ lift + rs.normal(0.0, 0.05, size=(n, dim), dtype=cp.float32)
        out.append((start, cp.asnumpy(x.astype(cp.float32))))
        del low, x, lab
    cp.get_default_memory_pool().free_all_blocks()
    return out


def bench_exact(backend, rows, nq, dim, k, out, block=1_000_000):
    blocks = synth_blocks_gpu(rows, dim, block, seed=3)
    rng = np.random.default_rng(0)
    # queries: rows of the set itself (so the nearest one is the query: a sanity check)
    qidx = np.sort(rng.choice(rows, nq, replace=False))
    queries = np.concatenate([blocks[i // block][1][i % block][None] for i in qidx])
    backend.exact_knn(queries[:64], k, L2, [blocks[0]])  # warm-up: compile, cuBLAS handle
    t0 = time.perf_counter()
    g = backend.exact_knn(queries, k, L2, blocks)
    dt = time.perf_counter() - t0
    self_first = float(np.mean(g.ids[:, 0] == qidx))
    _emit({"workload": "exact_knn", "rows": rows, "dim": dim, "dtype": "float32", "metric": "l2", "k": k,
           "queries": nq, "block_rows": block, "device": _device_name(), "time_s": round(dt, 4),
           "self_first": round(self_first, 4)}, out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--workloads", default="t1,u8,cos,exact", help="comma list of t1,t1default,u8,cos,exact,ggm")
    ap.add_argument("--iters", default="6,8,10,12")
    ap.add_argument("--samples", default="16", help="comma list of p values for t1")
    ap.add_argument("--list-width", default="0",
                    help="comma list of GnndParams.list_width values (0: automatic, max(k, 32))")
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--exact-rows", type=int, default=10_000_000)
    ap.add_argument("--exact-queries", type=int, default=10_000)
    ap.add_argument("--profile", action="store_true", help="time each GNND kernel with events")
    ap.add_argument("--min-update-frac", type=float, default=0.0, help="stop rule for the t1/u8/cos sweeps")
    ap.add_argument("--ggm-repeats", type=int, default=2, help="timed merges of the ggm workload")
    ap.add_argument("--merge-variants", default="{}",
                    help="';'-separated JSON dicts of GnndParams overrides for the ggm workload's merges")
    ap.add_argument("--out", default=None, help="also append the JSON lines to this file")
    args = ap.parse_args(argv)

    from bigknn.backends.cuda import CudaBackend, cuda_available

    if not cuda_available():
        print("no CUDA device / CuPy", file=sys.stderr)
        return 2
    backend = CudaBackend(profile=args.profile)
    out = open(args.out, "a") if args.out else None
    iters = [int(v) for v in args.iters.split(",")]
    ps = [int(v) for v in args.samples.split(",")]
    work = args.workloads.split(",")
    widths = [int(v) for v in args.list_width.split(",")]
    if "t1" in work or "t1default" in work:
        x = synth(args.rows, 96, seed=0)
        if "t1" in work:
            bench_gnnd(backend, x, L2, "t1_f32_l2", args.k, iters, ps, out, min_update_frac=args.min_update_frac,
                       widths=widths)
        if "t1default" in work:
            # GnndParams defaults for everything but k (p, iters, stop rule), lists of k and of 1.5 k
            bench_gnnd(backend, x, L2, "t1_f32_l2_defaults", args.k, [0], [0], out, min_update_frac=None,
                       widths=[0, args.k * 3 // 2])
        del x
    if "u8" in work:
        x = synth(args.rows, 128, seed=1)
        lo, hi = np.percentile(x[:100000], 0.5), np.percentile(x[:100000], 99.5)
        x = np.clip(np.round((x - lo) / (hi - lo) * 255), 0, 255).astype(np.uint8)
        bench_gnnd(backend, x, L2, "u8_l2", args.k, [max(iters)], [ps[-1]], out,
                   min_update_frac=args.min_update_frac, widths=widths)
        del x
    if "cos" in work:
        x = synth(args.rows, 384, seed=2)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        bench_gnnd(backend, x, IP, "f32_cosine", args.k, [max(iters)], [ps[-1]], out,
                   min_update_frac=args.min_update_frac, widths=widths)
        del x
    if "exact" in work:
        bench_exact(backend, args.exact_rows, args.exact_queries, 96, 10, out)
    if "ggm" in work:
        for lw in widths:
            bench_ggm(backend, args.rows, 96, args.k, lw, args.ggm_repeats, out,
                      variants=args.merge_variants.split(";"))
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
