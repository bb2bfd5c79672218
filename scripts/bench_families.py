#!/usr/bin/env python3
"""T1 on every data family: bigknn's GNND with default parameters (recall target 0.99) against cuVS
NN-Descent (several settings) and cuVS brute force, in one process on the same host array. One JSON line
per measurement; recall@10 on sampled rows against exact top-10 (self excluded, ties counted).

    PYTHONPATH=. python3 scripts/bench_families.py synth.fbin:l2 text.fbin:cosine iid64.fbin:l2 \
        --peers nnd,bf --out $OUT/t1.jsonl

Times include the host->device copy and the graph back on the host, for every tool alike.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

import numpy as np

from bigknn.formats import open_vectors
from bigknn.core.metric import Metric, metric as metric_of, prepare_rows
from bigknn.core.params import GnndParams
from bigknn.algorithms.recall_target import estimate

SAMPLE = 10_000
# graph degree, intermediate degree, iterations: from 8, since NN-Descent runs every iteration it is given (on
# synth more iterations cost time and gained no recall), so its fastest setting at a recall may be a short one
NND_SETTINGS = [(32, 64, 8), (32, 64, 12), (32, 64, 20), (64, 128, 20), (64, 128, 40), (96, 192, 30)]


def load(path: str, metric: str) -> np.ndarray:
    vf = open_vectors(path)
    return np.ascontiguousarray(prepare_rows(vf.read(0, vf.rows), metric))


class Truth:
    """Exact top-10 of sampled rows, and recall@10 of any graph's ids on them (keys recomputed exactly)."""

    def __init__(self, backend, x: np.ndarray, metric: Metric, seed: int = 0):
        self.x, self.metric = x, metric
        self.rows = np.sort(np.random.default_rng(seed).choice(len(x), min(SAMPLE, len(x)), replace=False))
        g = backend.exact_knn(x[self.rows], 11, metric, [(0, x)])
        ids = []
        for r, row in zip(self.rows, g.ids):
            ids.append([v for v in row if v != r][:10])
        self.ids = np.array(ids)
        self.kth = metric.row_keys(x[self.rows], x[self.ids[:, -1]])

    def recall(self, graph_ids: np.ndarray, self_included: bool = False) -> dict:
        got = np.asarray(graph_ids)[self.rows]
        if self_included:  # drop the row itself wherever a tool lists it
            got = np.array([[v for v in row if v != r][:10] for r, row in zip(self.rows, got)])
        got = got[:, :10].astype(np.int64)
        keys = self.metric.row_keys(self.x[self.rows][:, None, :], self.x[np.where(got >= 0, got, 0)])
        return estimate(got, keys, self.ids, self.kth).to_dict()


def emit(rec: dict, out) -> None:
    line = json.dumps(rec)
    print(line, flush=True)
    if out:
        out.write(line + "\n")
        out.flush()


def bench_bigknn(backend, x, metric, truth, family, device, out, k: int, variants: list[str]) -> None:
    base = GnndParams(k=k)
    backend.gnnd(x[:100_000], metric, base, seed=0)  # compile (NVRTC), pinned buffers
    from bigknn.backends.cuda import rows as cuda_module

    default_half, default_bytes = cuda_module.HALF_MIN_DIM, cuda_module.HALF_BYTES
    for variant in variants:
        overrides = {} if variant == "defaults" else json.loads(variant)
        # "_half_min_dim": the CUDA backend's HALF_MIN_DIM for this run (half-precision descent from that dim);
        # "_half_bytes": its HALF_BYTES (byte rows descend on half copies)
        cuda_module.HALF_MIN_DIM = overrides.pop("_half_min_dim", default_half)
        cuda_module.HALF_BYTES = overrides.pop("_half_bytes", default_bytes)
        # "_mma": tensor-core cross-match tiles on (true) or off (false) for this run (default: the backend's)
        backend.tensor_cores = overrides.pop("_mma", None)
        params = replace(base, **overrides)
        if (cuda_module.HALF_MIN_DIM, cuda_module.HALF_BYTES) != (default_half, default_bytes) or \
                backend.tensor_cores is not None or overrides:
            backend.gnnd(x[:100_000], metric, params, seed=0)  # compile that variant's kernels
        t0 = time.perf_counter()
        g = backend.gnnd(x, metric, params, seed=1)
        dt = time.perf_counter() - t0
        cuda_module.HALF_MIN_DIM, cuda_module.HALF_BYTES = default_half, default_bytes
        backend.tensor_cores = None
        st = backend.last_stats
        emit({"workload": "t1", "family": family, "tool": "bigknn", "variant": variant, "rows": len(x),
              "dim": x.shape[1], "dtype": str(x.dtype), "metric": metric.kernel, "k": k, "device": device,
              "time_s": round(dt, 3), "recall@10": truth.recall(g.ids), "estimate": g.report,
              "iters_run": st.get("iters_run"), "p": st.get("p"), "half": st.get("half"), "mma": st.get("mma"),
              "iter_s": round(st.get("iter_s", 0), 3)}, out)


def bench_nnd(x, metric, truth, family, device, out) -> None:
    import cupy as cp
    from cuvs.neighbors import nn_descent

    cuvs_metric = "inner_product" if metric.dot_keys else "sqeuclidean"
    warm = nn_descent.IndexParams(metric=cuvs_metric, graph_degree=32, intermediate_graph_degree=64, max_iterations=2)
    nn_descent.build(warm, x[:100_000])
    for gd, igd, it in NND_SETTINGS:
        params = nn_descent.IndexParams(metric=cuvs_metric, graph_degree=gd, intermediate_graph_degree=igd,
                                        max_iterations=it)
        t0 = time.perf_counter()
        idx = nn_descent.build(params, x)
        graph = cp.asnumpy(cp.asarray(idx.graph))
        cp.cuda.Device().synchronize()
        dt = time.perf_counter() - t0
        emit({"workload": "t1", "family": family, "tool": "cuvs_nn_descent", "rows": len(x), "dim": x.shape[1],
              "dtype": str(x.dtype), "metric": metric.kernel, "graph_degree": gd, "intermediate_graph_degree": igd,
              "max_iterations": it, "device": device, "time_s": round(dt, 3),
              "recall@10": truth.recall(graph, self_included=True)}, out)
        del idx, graph


def bench_bf(x, metric, family, device, out) -> None:
    import cupy as cp
    from cuvs.neighbors import brute_force

    cuvs_metric = "inner_product" if metric.dot_keys else "sqeuclidean"
    t0 = time.perf_counter()
    xd = cp.asarray(x) if x.dtype in (np.float32, np.float16) else cp.asarray(x, dtype=cp.float32)  # its dtypes
    index = brute_force.build(xd, metric=cuvs_metric)
    _, nbrs = brute_force.search(index, xd, 11)
    ids = cp.asnumpy(cp.asarray(nbrs))
    dt = time.perf_counter() - t0
    emit({"workload": "t1", "family": family, "tool": "cuvs_brute_force", "rows": len(x), "dim": x.shape[1],
          "dtype": str(x.dtype), "metric": metric.kernel, "k": 11, "device": device, "time_s": round(dt, 3),
          "recall@10": 1.0, "note": "exact graph (self included, k=11)", "rows_out": int(ids.shape[0])}, out)
    del xd, index, nbrs


def bench_exact(backend, x, metric, truth, family, device, out, k: int, tiled: bool = False) -> None:
    """bigknn's own exact graph (what a descent that cannot reach its target falls back to): the fused
    tensor-core kernel, or with ``tiled`` the cuBLAS tiles + select it replaced."""
    from bigknn.backends.cuda import exact

    fused_min = exact.FUSED_MIN_QUERIES
    exact.FUSED_MIN_QUERIES = len(x) + 1 if tiled else fused_min
    try:
        with backend.gpu.context():
            exact.exact_graph(backend.gpu, x[:40_000], k, metric)  # compile, warm up
            t0 = time.perf_counter()
            g = exact.exact_graph(backend.gpu, x, k, metric)
            dt = time.perf_counter() - t0
    finally:
        exact.FUSED_MIN_QUERIES = fused_min
    emit({"workload": "t1", "family": family, "tool": "bigknn_exact_tiled" if tiled else "bigknn_exact",
          "rows": len(x), "dim": x.shape[1], "dtype": str(x.dtype), "metric": metric.kernel, "k": k, "device": device,
          "time_s": round(dt, 3), "recall@10": truth.recall(g.ids),
          "predicted_s": round(exact.exact_seconds(len(x), len(x), x.shape[1]), 3)}, out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="FILE:METRIC (metric l2, ip or cosine); the family is the file stem")
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--peers", default="nnd", help="comma list of nnd, bf (cuVS), exact, exact_tiled (bigknn's "
                                                   "exact graph, fused or tiled), or none")
    ap.add_argument("--variants", default="defaults",
                    help="';'-separated bigknn variants: 'defaults' or a JSON dict of GnndParams overrides")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from bigknn.backends.cuda import CudaBackend, cuda_available

    if not cuda_available():
        print("no CUDA device / CuPy", file=sys.stderr)
        return 2
    import cupy as cp

    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    device = name.decode() if isinstance(name, bytes) else str(name)
    backend = CudaBackend()
    out = open(args.out, "a") if args.out else None
    peers = [p for p in args.peers.split(",") if p and p != "none"]
    for spec in args.inputs:
        path, metric = spec.rsplit(":", 1)
        family = path.rsplit("/", 1)[-1].split(".")[0]
        x = load(path, metric)
        km = metric_of(metric)
        truth = Truth(backend, x, km)
        bench_bigknn(backend, x, km, truth, family, device, out, args.k, args.variants.split(";"))
        if "nnd" in peers:
            bench_nnd(x, km, truth, family, device, out)
        if "bf" in peers:
            bench_bf(x, km, family, device, out)
        for tool in ("exact", "exact_tiled"):
            if tool in peers:
                bench_exact(backend, x, km, truth, family, device, out, args.k, tiled=tool == "exact_tiled")
        del x, truth
    return 0


if __name__ == "__main__":
    sys.exit(main())
