#!/usr/bin/env python3
"""The CUDA backend's memory model against what its calls allocate (issue 35).

A 250M build's first merge of two ~18M-row shards ran out of GPU memory, and so did its retry without the
copies kept between calls: the call had planned to fit (``memory.plan_slots``), so the model
(bigknn/backends/cuda/memory.py) counts less than the call allocates. For each size, this script runs two
GNNDs of ``rows`` rows and the GGM of the pair, as a build does, and watches CuPy's pool: the peak of the
bytes in use during the call, above what was in use before it, against the bytes the call planned
(``gpu.last_need``). Copies kept from earlier calls are dropped before each call, so the peak is the call's own.
One JSON line per call, then a table.

    PYTHONPATH=$PWD python3 scripts/gpu_memory_model.py --rows 1000000,4000000 --dim 64 --dtype uint8
    PYTHONPATH=$PWD python3 scripts/gpu_memory_model.py --rows 2000000 --dim 96 --dtype float32 --k 32
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from bigknn.backends.cuda import CudaBackend
from bigknn.backends.cuda import memory
from bigknn.core.knn_graph import KnnGraph, ShardPart
from bigknn.core.metric import L2
from bigknn.core.params import GnndParams
from bigknn.core.synth import as_dtype, synth


class PeakWatch:
    """CuPy's allocator, wrapped: the pool's bytes in use after every allocation, the highest kept."""

    def __init__(self):
        import cupy as cp

        self.pool = cp.get_default_memory_pool()
        self.base = self.peak = 0
        cp.cuda.set_allocator(self._malloc)

    def _malloc(self, size: int):
        mem = self.pool.malloc(size)
        self.peak = max(self.peak, self.pool.used_bytes())
        return mem

    def start(self, backend: CudaBackend) -> None:
        """Drop what earlier calls kept on the device, then count from what is in use now."""
        with backend.gpu.context():
            while backend.gpu.resident.drop_oldest():
                pass
            memory.free_pools()
        self.base = self.peak = self.pool.used_bytes()

    def used(self) -> int:
        return self.peak - self.base


def measured(watch: PeakWatch, backend: CudaBackend, call: str, rows: int, run) -> tuple[object, dict]:
    watch.start(backend)
    t = time.perf_counter()
    out = run()
    stats = backend.last_stats
    line = {"call": call, "rows": rows, "seconds": round(time.perf_counter() - t, 2),
            "peak_bytes": watch.used(), "planned_bytes": backend.gpu.last_need,
            "width": stats.get("width"), "p": stats.get("p"), "slots": stats.get("slots")}
    line["peak_over_planned"] = round(line["peak_bytes"] / max(1, line["planned_bytes"]), 3)
    line["bytes_per_row_unplanned"] = round((line["peak_bytes"] - line["planned_bytes"]) / rows, 1)
    return out, line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1000000,4000000", help="rows per shard, comma separated")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--dtype", default="uint8")
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    backend = CudaBackend()
    params = GnndParams(k=args.k)
    watch = PeakWatch()
    lines = []
    for rows in (int(r) for r in args.rows.split(",")):
        x = as_dtype(synth(2 * rows, args.dim, seed=args.seed), args.dtype)
        xa, xb = x[:rows], x[rows:]
        ga, la = measured(watch, backend, "gnnd", rows, lambda: backend.gnnd(xa, L2, params, 0))
        gb, lb = measured(watch, backend, "gnnd", rows, lambda: backend.gnnd(xb, L2, params, 1))
        gb = KnnGraph(np.where(gb.ids >= 0, gb.ids + rows, -1).astype(gb.ids.dtype), gb.dists)
        _, lm = measured(watch, backend, "ggm", 2 * rows, lambda: backend.ggm(
            ShardPart(0, xa, ga), ShardPart(rows, xb, gb), L2, params, 2))
        for line in (la, lb, lm):
            line.update(dim=args.dim, dtype=args.dtype, k=args.k)
            print(json.dumps(line), flush=True)
            lines.append(line)
    print(f"{'call':5} {'rows':>11} {'planned GB':>11} {'peak GB':>8} {'peak/plan':>9} {'unplanned B/row':>15}")
    for ln in lines:
        print(f"{ln['call']:5} {ln['rows']:>11,} {ln['planned_bytes'] / 1e9:>11.2f} {ln['peak_bytes'] / 1e9:>8.2f} "
              f"{ln['peak_over_planned']:>9.3f} {ln['bytes_per_row_unplanned']:>15.1f}")


if __name__ == "__main__":
    main()
