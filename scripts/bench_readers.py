#!/usr/bin/env python3
"""Readers' throughput through the public API: ``bigknn.open`` + ``neighbors()`` + ``close`` of one store, over
and over, timed in CPU seconds (this process's own, so that other work on a shared machine counts less) and wall
seconds. Two stores, built by the code under test unless --work already holds them (then they are read as they
are: two checkouts compared on the same bytes, the older reading what the newer wrote where its format allows):

* large: ``--rows`` x ``--dim`` float32 in 4 shards, k = 10; a pass reads every graph array (MB per CPU second);
* small: 3,000 rows in one shard; a pass is open + neighbors() + close, where the per-open costs
  (manifest, identity record, reader lease, checksum lists) dominate (opens per CPU second).

Compare two checkouts on the same stores by running this script under each in turn (alternated, several times):

    PYTHONPATH=. python3 scripts/bench_readers.py --work /tmp/rb --keep
    PYTHONPATH=/path/to/old python3 scripts/bench_readers.py --work /tmp/rb --keep
    PYTHONPATH=. python3 scripts/bench_readers.py --work /tmp/rb --keep

One JSON object on stdout (rates per CPU second and per wall second: passes over the large store, opens of the
small one). The stores are built with the CPU backend and removed at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import bigknn

SMALL_ROWS = 3000


def store_bytes(path: Path) -> int:
    """Bytes of the whole store on disk (vectors included: the MB rate is of the store's size, per pass)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def build(path: Path, rows: int, dim: int, shards: int) -> None:
    x = np.random.default_rng(0).standard_normal((rows, dim)).astype(np.float32)
    g = bigknn.build(x, k=10, store=path, backend="cpu", shard_rows=-(-rows // shards), seed=0)
    g.close()


def timed_passes(read, passes: int) -> tuple[float, float]:
    """CPU and wall seconds of ``passes`` calls of ``read``."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(passes):
        read()
    return time.process_time() - cpu0, time.perf_counter() - wall0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="A folder for the two stores (made, or read as it is).")
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--passes", type=int, default=30, help="Passes over the large store.")
    ap.add_argument("--opens", type=int, default=200, help="Opens of the small store.")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    large, small = args.work / "large.knn", args.work / "small.knn"
    built = not large.exists()
    if built:
        args.work.mkdir(parents=True)
        build(large, args.rows, args.dim, 4)
        build(small, SMALL_ROWS, args.dim, 1)

    def read_large() -> None:
        g = bigknn.open(large)
        g.neighbors()
        g.close()

    def read_small() -> None:
        g = bigknn.open(small)
        g.neighbors()
        g.close()

    for _ in range(3):  # page cache and imports warm
        read_large(), read_small()
    large_mb = store_bytes(large) / 1e6
    large_cpu, large_wall = timed_passes(read_large, args.passes)
    small_cpu, small_wall = timed_passes(read_small, args.opens)
    commit = subprocess.run(["git", "-C", str(Path(bigknn.__file__).parent), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(json.dumps({
        "workload": "readers", "code": commit, "built_here": built, "store_mb": round(large_mb, 1),
        "large_passes": args.passes, "large_passes_per_cpu_s": round(args.passes / large_cpu, 2),
        "large_passes_per_wall_s": round(args.passes / large_wall, 2),
        "small_opens": args.opens, "small_opens_per_cpu_s": round(args.opens / small_cpu, 1),
        "small_opens_per_wall_s": round(args.opens / small_wall, 1), "python": sys.version.split()[0]}))
    if not args.keep:
        shutil.rmtree(args.work)


if __name__ == "__main__":
    main()
