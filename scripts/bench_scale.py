#!/usr/bin/env python3
"""Out-of-core builds of one input under several schedules, through the CLI as a user runs them (issue 35):
each run builds a fresh store after dropping the page cache (where permitted), measures its recall with
``bigknn eval recall``, and prints one JSON line: wall, recall, bytes read and written, busy share per GPU,
and where each backend call's time went (the build timeline's stage seconds summed per phase: kernel
compiles, copies, descent iterations), so that a schedule's cost is seen, not guessed. The disk's read and
write rates are measured once before the runs (``--disk-probe-gb``), and each run states its disk floor: one read
of the input plus one write of what the store holds, at those rates, and its CLI wall over that floor. The store
is removed after each run (a 50M store is as large as its input).

    python scripts/bench_scale.py --input /tmp/bk/d50m.fbin --store /tmp/bk/s.knn --family synth \\
        --run contiguous:0 --run kmeans:0 --run auto:0,1 -- --k 32
    python scripts/bench_scale.py --input tiny.fbin --store /tmp/s.knn --backend cpu --run auto:0 -- --k 5

``--run PARTITION:GPUS[:SHARD_ROWS]`` (repeatable, in order; no SHARD_ROWS: automatic); arguments after ``--`` go
to every build.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dask import bigknn, drop_page_cache  # noqa: E402 - the CLI runner and cache drop of the Dask benchmark

from bigknn.operations.diskrate import measure_disk  # noqa: E402

STAGES = ("compile_s", "h2d_s", "init_s", "setup_s", "iter_s", "finish_s", "d2h_s", "sample_s", "descent_s")


def stage_sums(timeline: list[dict]) -> dict:
    """Seconds per phase (gnnd, ggm) and stage of the build's backend calls, and the calls' own wall."""
    out: dict = {}
    for line in timeline:
        phase = out.setdefault(line["phase"], {"calls": 0, "wall_s": 0.0})
        phase["calls"] += 1
        phase["wall_s"] = round(phase["wall_s"] + line["end"] - line["start"], 3)
        for key in STAGES:
            if key in line:
                phase[key] = round(phase.get(key, 0.0) + line[key], 3)
    return out


def device() -> str:
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, check=True).stdout.split("\n")
        return ", ".join(n for n in names if n) or platform.processor()
    except (OSError, subprocess.CalledProcessError):
        return f"cpu ({platform.processor() or platform.machine()})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True)
    ap.add_argument("--store", required=True, help="the store path each run builds into (removed after each)")
    ap.add_argument("--run", action="append", required=True,
                    help="PARTITION:GPUS[:SHARD_ROWS], e.g. auto:0 or kmeans:0,1 or contiguous:0,1:12500000")
    ap.add_argument("--family", default="synth")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--eval-sample", type=int, default=10_000)
    ap.add_argument("--disk-probe-gb", type=float, default=4.0,
                    help="bytes written and read back once, before the runs, to measure the disk floor")
    ap.add_argument("build_args", nargs="*")
    args = ap.parse_args()
    store = Path(args.store)
    store.parent.mkdir(parents=True, exist_ok=True)
    drop_page_cache()
    disk = measure_disk(store.parent, int(args.disk_probe_gb * (1 << 30)))
    input_bytes = Path(args.input).stat().st_size
    for run in args.run:
        partition, _, rest = run.partition(":")
        gpus, _, shard_rows = rest.partition(":")
        shutil.rmtree(store, ignore_errors=True)
        dropped = drop_page_cache()
        build = [args.input, "-o", str(store), "--partition", partition, "--backend", args.backend, *args.build_args]
        if args.backend == "cuda":
            build += ["--gpus", gpus or "0"]
        if shard_rows:
            build += ["--shard-rows", shard_rows]
        t = time.perf_counter()
        out = bigknn("build", *build)
        cli_wall = time.perf_counter() - t
        ev = bigknn("eval", "recall", str(store), "--backend", args.backend, "--sample", str(args.eval_sample),
                    "--k", str(min(10, out["k"])))
        du = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
        # the disk floor: one read of the input and one write of what the store holds, at this call's rates
        floor = input_bytes / 1e9 / disk["read_gbps"] + du / 1e9 / disk["write_gbps"]
        print(json.dumps({
            "workload": "out-of-core build", "family": args.family, "input": args.input, "rows": out["rows"],
            "dim": out["dim"], "k": out["k"], "partition_asked": partition, "partition": out["partition"],
            "gpus": gpus, "shard_rows_asked": int(shard_rows or 0), "device": device(), "page_cache_dropped": dropped, "build_args": args.build_args,
            "wall_s": out["wall_s"], "cli_wall_s": round(cli_wall, 3), "disk": disk,
            "disk_floor_s": round(floor, 2), "wall_over_floor": round(cli_wall / floor, 3), "recall@10": ev.get("recall"), "recall_estimate": out.get("recall_estimate"),
            "shards": out["shards"], "merges": out["merges_done"], "all_pairs": out["all_pairs"],
            "read_gb": out["read_gb"], "written_gb": out["written_gb"], "store_gb": round(du / 1e9, 3),
            "busy_frac": out["busy_frac"], "phase_wall_s": out["phase_wall_s"],
            "stages": stage_sums(out["timeline"]), "timeline": out["timeline"]}), flush=True)
        shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
