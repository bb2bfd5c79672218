#!/usr/bin/env python3
"""The exact k-NN graph on the GPU (bigknn/backends/cuda/exact.py): where the time of one self-join goes.

For an iid N(0, 1) set made on the device (rows x dim, float32, l2), one JSON line per measurement: the whole
exact_graph call, its phases timed with CUDA events (half copies, fused kernel launches, exact keys, row sort,
copy back), and the fused kernel alone with the filter compiled out (FUSED_MODE=1: the tensor-core tiles and
tile loads only), against the count of operations it must do.

    PYTHONPATH=. python3 scripts/bench_exact.py --rows 1000000 --dims 64,128 --k 32
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def timed(fn, reps: int = 1) -> float:
    import cupy as cp

    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / 1e3 / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--k", type=int, default=32)
    args = ap.parse_args()
    import cupy as cp

    from bigknn.backends.cuda import CudaBackend, exact
    from bigknn.backends.cuda.compile import compile_kernels, source
    from bigknn.core.metric import L2

    backend = CudaBackend()
    gpu = backend.gpu
    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    device = name.decode() if isinstance(name, bytes) else str(name)
    for d in (int(v) for v in args.dims.split(",")):
        x = cp.random.default_rng(d).standard_normal((args.rows, d), dtype=cp.float32)
        with gpu.context():
            exact.exact_graph(gpu, x[:50_000], args.k, L2)  # compile, warm up
            t0 = time.perf_counter()
            g = exact.exact_graph(gpu, x, args.k, L2)
            whole = time.perf_counter() - t0
            Q = x
            qn = (Q * Q).sum(axis=1)
            sel = exact._Fused(gpu, Q, qn, 0, args.k + 1)
            t_half = timed(lambda: exact.half_rows(x, sel.dp))
            t_fused = timed(lambda: sel.add(0, x, qn))
            cc = cp.cuda.Device().compute_capability
            mode1 = cp.RawModule(code=source(), options=("-std=c++17", f"-arch=sm_{cc}", "-DFUSED_MODE=1"),
                                 name_expressions=[f"knn_fused<0, {sel.dp // 16}>"])
            sel.kernel = mode1.get_function(f"knn_fused<0, {sel.dp // 16}>")
            sel.kernel.max_dynamic_shared_size_bytes = sel.smem
            t_mma = timed(lambda: sel.add(0, x, qn))
            mod = compile_kernels(("knn_exact_keys<0>",))
            kw = sel.width
            t_keys = timed(lambda: mod.get_function("knn_exact_keys<0>")(
                (((args.rows * kw) * 32 + 255) // 256,), (256,), (Q, np.int32(args.rows), x, np.int32(args.rows),
                                                                 np.int32(d), np.int64(0), np.int32(kw), sel.ti, sel.tk)))
            ok = cp.empty((args.rows, args.k), cp.float32)
            oi = cp.empty((args.rows, args.k), cp.int32)
            t_sort = timed(lambda: mod.get_function("knn_sort_rows")(((args.rows + 3) // 4,), (128,), (
                sel.tk, sel.ti, np.int32(args.rows), np.int32(kw), np.int32(args.k), np.int64(0), ok, oi)))
        pairs = args.rows * args.rows
        print(json.dumps({"workload": "exact_graph", "rows": args.rows, "dim": d, "k": args.k, "device": device,
                          "whole_s": round(whole, 3), "half_s": round(t_half, 4), "fused_s": round(t_fused, 3),
                          "fused_no_filter_s": round(t_mma, 3), "exact_keys_s": round(t_keys, 4),
                          "sort_rows_s": round(t_sort, 4), "predicted_s": round(exact.exact_seconds(args.rows, args.rows, d), 3),
                          "tflops_mma": round(2 * pairs * sel.dp / t_mma / 1e12, 1), "list_width": kw,
                          "first_row": g.ids[0, :5].tolist()}), flush=True)


if __name__ == "__main__":
    main()
