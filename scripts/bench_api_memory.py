#!/usr/bin/env python3
"""``bigknn.build(array)`` as a user calls it, against the GNND kernel inside it: is the API's wall within
1.15x of the kernel's own time (issue 36)? One JSON line per build.

Each build is timed around the public call (array in host memory, graph back as arrays); ``gnnd_s`` is the
GNND task as the build's report books it (``report.phase_s["gnnd"]``: the recall sample's exact search and
the backend's GNND call), ``descent_s`` the descent's own iterations (``report.timeline``). ``--store`` also
times the same build into a store on disk (the path before in-memory builds). Recall@10 is checked exactly
afterwards on ``--check`` rows (``Graph.recall``), outside the timing.

    PYTHONPATH=$PWD python3 scripts/bench_api_memory.py --backend cuda --rows 1000000 --dims 96,384
    PYTHONPATH=$PWD python3 scripts/bench_api_memory.py --backend cuda --data /data/text.fbin --metric cosine
    PYTHONPATH=$PWD python3 scripts/bench_api_memory.py --backend cpu --rows 20000 --dims 32 --store
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import bigknn
from bigknn.formats import open_vectors
from bigknn.memory_graph import InMemoryGraph
from bigknn.core.synth import synth

WARMUP_ROWS = 20_000  # a first build compiles the backend's kernels; it is not timed


def one_build(x: np.ndarray, args: argparse.Namespace, store: Path | None) -> dict:
    t = time.perf_counter()
    g = bigknn.build(x, k=args.k, metric=args.metric, backend=args.backend, store=store)
    wall = time.perf_counter() - t
    phases = g.report.phase_s
    est = g.info.recall_estimate
    checked = g.recall(sample=args.check, backend=args.backend).recall if args.check else None
    g.close()
    return {"rows": len(x), "dim": x.shape[1], "dtype": str(x.dtype), "metric": args.metric, "k": args.k,
            "backend": args.backend, "in_memory": isinstance(g, InMemoryGraph), "api_wall_s": round(wall, 3),
            "gnnd_s": phases.get("gnnd"),
            "descent_s": [line.get("descent_s") for line in g.report.timeline if line["phase"] == "gnnd"],
            "descent": [{key: line.get(key) for key in ("iterations", "widened", "stop")}
                        for line in g.report.timeline if line["phase"] == "gnnd"],
            "wall_over_gnnd": round(wall / phases["gnnd"], 3) if phases.get("gnnd") else None,
            "estimate": None if est is None else [est.recall, est.low, est.high],
            "recall_checked": checked, "check_rows": args.check}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dims", default="96,384", help="comma list of synthetic dims (ignored with --data)")
    ap.add_argument("--data", type=Path, help="an input file (.fbin, .npy, ...), loaded whole into memory")
    ap.add_argument("--metric", default="l2")
    ap.add_argument("--k", type=int, default=bigknn.api.DEFAULTS.k)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--check", type=int, default=10_000, help="rows of the exact recall check (0: none)")
    ap.add_argument("--store", action="store_true", help="also time the build into a store on disk")
    args = ap.parse_args()
    if args.data is not None:
        sets = [np.ascontiguousarray(open_vectors(args.data).data[:args.rows])]
    else:
        sets = [synth(args.rows, int(d), seed=1) for d in args.dims.split(",")]
    bigknn.build(synth(WARMUP_ROWS, sets[0].shape[1]), k=args.k, metric=args.metric, backend=args.backend).close()
    for x in sets:
        for _ in range(args.repeats):
            print(json.dumps(one_build(x, args, None)), flush=True)
            if args.store:
                with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
                    print(json.dumps(one_build(x, args, Path(tmp) / "g.knn")), flush=True)


if __name__ == "__main__":
    main()
