#!/usr/bin/env python3
"""The Dask path against the in-process build (issue: ``--scheduler local:N`` within 10 % of ``--gpus all``,
same recall). Builds one input twice through the CLI, (a) in-process on every GPU and (b) on a local Dask
cluster of one worker per GPU, each into a fresh store after dropping the page cache (where permitted), then
measures each store's recall with ``bigknn eval recall``. Prints one JSON line per build.

    python scripts/bench_dask.py --input /data/t2_10m.fbin --store-base /scratch/bench --workload t2 \\
        -- --shard-rows 1000000 --list-width 48
    python scripts/bench_dask.py --input tiny.fbin --store-base /tmp/b --backend cpu --workers 2 -- --k 10

Arguments after ``--`` go to both builds. GPU runs need dask-cuda for the Dask build.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

MODES = ("in-process", "dask")


def bigknn(*args: str) -> dict:
    """Run a bigknn CLI command with --json; its JSON output (the command's error ends the benchmark)."""
    proc = subprocess.run([sys.executable, "-m", "bigknn", *args, "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bigknn {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def drop_page_cache() -> bool:
    """Empty the page cache so each build reads from disk (needs root; False where not permitted)."""
    subprocess.run(["sync"], check=False)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def gpu_names() -> list[str]:
    """The names of this machine's GPUs (nvidia-smi), none without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def mode_args(mode: str, backend: str, workers: int) -> list[str]:
    """What a mode adds to the build: every GPU in this process, or a local Dask cluster of ``workers``."""
    if mode == "dask":
        return ["--scheduler", f"local:{workers}"]
    return ["--gpus", "all"] if backend != "cpu" else []


def run(mode: str, args: argparse.Namespace, workers: int, device: str) -> dict:
    store = args.store_base / f"{args.workload}-{mode}.knn"
    shutil.rmtree(store, ignore_errors=True)
    dropped = drop_page_cache()
    t = time.perf_counter()
    built = bigknn("build", str(args.input), "-o", str(store), "--backend", args.backend,
                   *mode_args(mode, args.backend, workers), *args.build_args)
    wall = time.perf_counter() - t
    recall = bigknn("eval", "recall", str(store), "--backend", args.backend)
    if not args.keep_stores:  # a 50M store is ~40 GB: the two would not fit a 128 GB disk beside the input
        shutil.rmtree(store, ignore_errors=True)
    return {"workload": args.workload, "rows": built["rows"], "dim": built["dim"], "shards": built["shards"],
            "merges": built["merges_done"], "gpus": workers if args.backend != "cpu" else 0, "mode": mode,
            "wall_s": round(wall, 3), "build_wall_s": built["wall_s"], "recall": recall["recall"],
            "recall_k": recall["k"], "device": device, "backend": args.backend, "page_cache_dropped": dropped,
            "busy_frac": built.get("busy_frac"), "read_gb": built.get("read_gb"),
            "written_gb": built.get("written_gb")}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", type=Path, required=True)
    p.add_argument("--store-base", type=Path, required=True, help="Directory the stores are built in.")
    p.add_argument("--workload", default=None, help="Name in the output (default: the input's stem).")
    p.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--workers", type=int, default=None,
                   help="Dask workers (default: one per GPU; 2 with --backend cpu).")
    p.add_argument("--modes", default=",".join(MODES), help="Comma-separated subset of in-process,dask.")
    p.add_argument("--keep-stores", action="store_true", help="Keep each store (default: deleted once measured).")
    p.add_argument("build_args", nargs="*", help="After --: options for both builds.")
    args = p.parse_args(argv)
    args.workload = args.workload or args.input.stem
    return args


def main(argv: list[str]) -> None:
    args = parse(argv)
    names = gpu_names() if args.backend != "cpu" else []
    if args.backend != "cpu" and not names:
        sys.exit("no GPU seen (nvidia-smi); use --backend cpu")
    workers = args.workers or (len(names) if names else 2)
    device = f"{len(names)} x {names[0]}" if names else cpu_name()
    args.store_base.mkdir(parents=True, exist_ok=True)
    for mode in args.modes.split(","):
        if mode not in MODES:
            sys.exit(f"--modes: {mode!r} is not one of {', '.join(MODES)}")
        print(json.dumps(run(mode, args, workers, device)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
