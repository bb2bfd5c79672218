"""Where a partitioned build's partition pass spends its time, stage by stage (docs/perf-notes.md).

    python scripts/bench_partition.py data.fbin --shard-rows 230000 [--backend cpu]

Stages run one after another (no overlap) for the breakdown, then ``layout`` as the build runs it (the next
chunk read and checked by threads), the per-shard gather of the sharding pass, and the file's sha256. CPU
seconds (all threads) next to wall seconds: on a shared machine they vary less with the load.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

from bigknn.backends import get_backend
from bigknn.formats import CHECK_CHUNK_ROWS, check_rows, file_sha256, open_vectors
from bigknn.core.metric import prepare_rows
from bigknn.algorithms.partition.labelling import LABEL_CHUNK_ROWS, layout, learn_from_file, shard_count
from bigknn.algorithms.partition.balance import assign_balanced, take_first_choices
from bigknn.algorithms.partition.learn import SLACK
from bigknn.algorithms.partition.nearest import backend_nearest

MIN_ROWS = 48  # --list-width's default: the smallest shard kept


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("input")
    ap.add_argument("--shard-rows", type=int, required=True)
    ap.add_argument("--backend", default="cpu")
    args = ap.parse_args()
    vf = open_vectors(args.input)
    nearest = backend_nearest(get_backend(args.backend))
    t: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # wall, CPU (every thread of the process)

    def timed(name, f, *a):
        t0, c0 = time.perf_counter(), time.process_time()
        out = f(*a)
        t[name][0] += time.perf_counter() - t0
        t[name][1] += time.process_time() - c0
        return out

    part = timed("sample + learn", learn_from_file, vf, "kmeans", shard_count(vf.rows, args.shard_rows, MIN_ROWS),
                 "l2", 0)
    room = np.full(part.shards, min(args.shard_rows, int(np.ceil(SLACK * vf.rows / part.shards))), np.int64)
    spilled_rows = 0
    buffer = np.empty((min(LABEL_CHUNK_ROWS, vf.rows), vf.dim), vf.read_dtype)
    for start in range(0, vf.rows, LABEL_CHUNK_ROWS):  # as assign._checked_chunks, one buffer, no thread
        block = buffer[:min(LABEL_CHUNK_ROWS, vf.rows - start)]
        timed("label: read", np.copyto, block, vf.data[start:start + len(block)])
        for lo in range(0, len(block), CHECK_CHUNK_ROWS):
            timed("label: check_rows", check_rows, vf.path, start + lo, block[lo:lo + CHECK_CHUNK_ROWS])
        x = timed("label: prepare_rows", prepare_rows, block, "l2")
        first, key = timed("label: nearest centroid", part.first_choice, x, nearest)
        labels, spilled = timed("label: first choices", take_first_choices, first, key, room)
        if spilled.size:
            cost = timed("label: spilled rows' costs", part.cost, x[spilled], nearest)
            timed("label: spilled rows' assign", assign_balanced, cost, room)
        spilled_rows += spilled.size
    rows_of = timed("layout as built (overlapped)", layout, vf, part, "l2", args.shard_rows, MIN_ROWS, nearest)
    for rows in rows_of:
        timed("gather: vf.take per shard", vf.take, rows)
    timed("sha256", file_sha256, vf)
    print(f"{'stage':32s} {'wall s':>7s} {'CPU s':>7s}")
    for name, (wall, cpu) in t.items():
        print(f"{name:32s} {wall:7.2f} {cpu:7.2f}")
    print(f"shards {part.shards}, sizes {[len(r) for r in rows_of]}, spilled rows {spilled_rows:,}")


if __name__ == "__main__":
    main()
