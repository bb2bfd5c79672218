#!/usr/bin/env python3
"""Reliability acceptance: SIGKILL `bigknn build` at random moments, rerun it, check the result.

Each trial starts a fresh build, kills it after a random delay, reruns the same command to the end,
then checks that `bigknn info` is complete and consistent and that recall@10 >= --min-recall.
Prints one JSON line per trial and a summary line.

    python scripts/kill_trials.py --trials 5 --rows 100000 --dim 96 --k 32 --shard-rows 25000
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def bigknn(*args: str) -> list[str]:
    return [sys.executable, "-m", "bigknn", *args]


def run_json(*args: str) -> dict:
    out = subprocess.run(bigknn(*args, "--json"), check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=96)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--shard-rows", type=int, default=25_000)
    ap.add_argument("--max-delay", type=float, default=40.0, help="kill within this many seconds")
    ap.add_argument("--min-recall", type=float, default=0.95)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bigknn-kill-"))
    data = work / "data.fbin"
    run_json("synth", str(data), "--rows", str(a.rows), "--dim", str(a.dim))
    rng = random.Random(a.seed)
    ok = 0
    for trial in range(a.trials):
        store = work / f"t{trial}.knn"
        cmd = bigknn("build", str(data), "-o", str(store), "--k", str(a.k), "--shard-rows", str(a.shard_rows),
                     "--backend", a.backend, "--json")
        delay = rng.uniform(0.5, a.max_delay)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        killed = proc.poll() is None
        if killed:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        before = run_json("info", str(store)) if (store / "manifest.json").exists() else None
        rerun = subprocess.run(cmd, capture_output=True, text=True)
        info = run_json("info", str(store))
        rec = run_json("eval", "recall", str(store), "--backend", a.backend, "--sample", "2000")
        consistent = (info["complete"] and info["merges_pending"] == 0 and info["rows"] == a.rows
                      and info["shards_built"] == info["shards"])
        passed = rerun.returncode == 0 and consistent and rec["recall"] >= a.min_recall
        ok += passed
        print(json.dumps({"trial": trial, "kill_after_s": round(delay, 2), "killed": killed,
                          "state_at_kill": None if before is None else
                          {"shards_built": before["shards_built"], "merges_done": before["merges_done"]},
                          "rerun_exit": rerun.returncode, "consistent": consistent, "recall@10": rec["recall"],
                          "passed": passed}), flush=True)
    print(json.dumps({"trials": a.trials, "passed": ok}))
    sys.exit(0 if ok == a.trials else 1)


if __name__ == "__main__":
    main()
