#!/usr/bin/env python3
"""A store fed one small file a day (issue 39): ``--files`` files of ``--file-rows`` rows, each ingested by its own
``bigknn.ingest`` call into one store built from ``--rows`` rows. Prints one JSON object: every run's counts
(distances, old lists and rows gathered, bytes read and written, shards after it; the recall checks' distances
apart, and how many runs were checked or declined), the shard bound the store
must stay under (bigknn/operations/ingest_join.py shard_bound), the last run's work against the first's (counts,
never time), and recall@10 of old and new rows by an exact check at the end (``Graph.recall(rows=...)``).
``--runs-out`` also writes each run as a JSON line, as it ends.

    PYTHONPATH=$PWD python3 scripts/bench_ingest_daily.py --files 1000
    PYTHONPATH=$PWD python3 scripts/bench_ingest_daily.py --files 50 --rows 3000 --shard-rows 1000 --file-rows 40
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import bigknn
from bigknn.formats import write_vectors
from bigknn.operations.ingest_join import shard_bound
from bigknn.core.synth import synth


def work(run: dict) -> int:
    return run["distances"] + run["lists_gathered"] + run["rows_gathered"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--file-rows", type=int, default=300)
    ap.add_argument("--rows", type=int, default=20_000, help="rows of the store before the first file")
    ap.add_argument("--shard-rows", type=int, default=5000)
    ap.add_argument("--dim", type=int, default=24)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--check", type=int, default=2000, help="rows of each recall check")
    ap.add_argument("--runs-out", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="daily-") as tmp:
        root = Path(tmp)
        x = synth(args.rows + args.files * args.file_rows, args.dim, seed=39)
        write_vectors(root / "old.fbin", x[:args.rows])
        store = root / "s.knn"
        t = time.perf_counter()
        g = bigknn.build(root / "old.fbin", store=store, k=args.k, shard_rows=args.shard_rows, backend=args.backend)
        build_s = time.perf_counter() - t
        built = g.info.shards
        runs, over_bound = [], 0
        runs_out = args.runs_out.open("w") if args.runs_out is not None else None  # a line a run, kept if cut short
        for i in range(args.files):
            lo = args.rows + i * args.file_rows
            path = root / f"day{i:05d}.fbin"
            write_vectors(path, x[lo:lo + args.file_rows])
            t = time.perf_counter()
            report = bigknn.ingest(store, [path], backend=args.backend)
            run = {"file": i, "wall_s": round(time.perf_counter() - t, 3), "shards": report.shards,
                   **(report.joined[0] if report.joined else {"joined": False})}
            over_bound += report.shards > shard_bound(built, (i + 1) * args.file_rows, args.shard_rows)
            runs.append(run)
            if runs_out is not None:
                runs_out.write(json.dumps(run) + "\n")
                runs_out.flush()
            path.unlink()
        end = args.rows + args.files * args.file_rows
        g = bigknn.open(store)
        out = {"files": args.files, "file_rows": args.file_rows, "rows_before": args.rows, "rows_after": end,
               "shard_rows": args.shard_rows, "build_s": round(build_s, 3), "shards_built": built,
               "shards_after": runs[-1]["shards"],
               "shard_bound": shard_bound(built, args.files * args.file_rows, args.shard_rows),
               "runs_over_bound": over_bound,
               "every_run_joined": all("distances" in r and not r.get("declined") for r in runs),
               "runs_declined": sum(bool(r.get("declined")) for r in runs),
               "runs_checked": sum(bool(r.get("checks")) for r in runs),
               "checked_efforts": sorted({r["checks"][-1]["effort"] for r in runs if r.get("checks")}),
               "check_over_search_distances": round(sum(r.get("check_distances", 0) for r in runs)
                                                    / max(1, sum(r.get("distances", 0) for r in runs)), 3),
               "first_run": runs[0], "last_run": runs[-1],
               "last_over_first_work": round(work(runs[-1]) / work(runs[0]), 3),
               "last_over_first_bytes_written": round(runs[-1]["bytes_written"] / runs[0]["bytes_written"], 3),
               "recall_old": g.recall(sample=args.check, rows=(0, args.rows), backend=args.backend).recall,
               "recall_new": g.recall(sample=args.check, rows=(args.rows, end), backend=args.backend).recall}
        if runs_out is not None:
            runs_out.close()
        print(json.dumps(out))


if __name__ == "__main__":
    main()
