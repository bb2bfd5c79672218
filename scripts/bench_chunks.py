#!/usr/bin/env python3
"""Throughput of the store's chunk I/O on one array, from the page cache: ``Store.write_vectors`` and
``Store.read_vectors`` of ROWS x DIM float32 (default 1M x 96 = 384 MB; 16 MB chunks), best of --repeat,
in wall time and in CPU time of the process (user + system: the cost, also on a busy machine). With chunk
checksums on, both include computing or checking every chunk's crc32c. Prints JSON.

    python scripts/bench_chunks.py --repeat 7
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from bigknn.shards import Manifest, Store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((a.rows, a.dim), dtype=np.float32)
    writes, reads, write_cpu, read_cpu = [], [], [], []
    with tempfile.TemporaryDirectory() as d:
        store = Store.create(Path(d) / "s", Manifest(dim=a.dim, dtype="<f4", metric="l2", k=10,
                                                     shard_rows=a.rows, params={}, seed=0))
        for _ in range(a.repeat):
            t, c = time.perf_counter(), time.process_time()
            store.write_vectors(0, x)
            writes.append(time.perf_counter() - t)
            write_cpu.append(time.process_time() - c)
            t, c = time.perf_counter(), time.process_time()
            back = store.read_vectors(0)
            reads.append(time.perf_counter() - t)
            read_cpu.append(time.process_time() - c)
            assert np.array_equal(back, x)
    gb = x.nbytes / 1e9
    print(json.dumps({"bytes": x.nbytes,
                      "write_gbps": round(gb / min(writes), 2), "read_gbps": round(gb / min(reads), 2),
                      "write_gb_per_cpu_s": round(gb / min(write_cpu), 2),
                      "read_gb_per_cpu_s": round(gb / min(read_cpu), 2),
                      "write_s": [round(s, 3) for s in writes], "read_s": [round(s, 3) for s in reads]}))

if __name__ == "__main__":
    main()
