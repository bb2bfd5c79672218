#!/usr/bin/env python3
"""Reliability acceptance: SIGKILL bigknn's writers at random moments while readers run, rerun, check.

Trials cycle over four kinds (``--kinds``):

* build:  a fresh ``bigknn build``, killed, then rerun to the end;
* merge:  a build killed once it is merging, then ``bigknn merge`` killed, then rerun to the end;
* ingest: a copy of a finished store, ``bigknn ingest`` of a further file killed, then rerun;
* export: ``bigknn export`` of a finished store (``.ibin`` and ``.npy`` in turn) killed, then rerun; every
  other export trial is killed the moment an output file appears, the worst moment for a file written in place.

All the while one reader loop runs ``bigknn info``, ``eval recall`` and ``export`` on the store being written
(info only while some shard has no graph yet). Writers commit after every merge (BIGKNN_CHECKPOINT_S=0), so
stale graph versions are deleted as often as they can be. A trial passes when the rerun exits 0, ``bigknn
verify`` finds the store clean, its recall@10 equals the uninterrupted run's within --tolerance, no reader
failed (exit 0, or 2 for a clean refusal of an unfinished graph) and no export output, a killed one's or a
reader's, was ever there but partial. One JSON line per trial, then a summary line; exit 0 when all passed.

    python scripts/kill_trials.py --trials 20 --rows 10000 --dim 32 --k 10 --shard-rows 2500
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

KINDS = ("build", "merge", "ingest", "export")
RECALL_SAMPLE = 2000
READER_TIMEOUT_S = 300
NOT_FINISHED = "not finished"  # the message of a clean refusal to read an unfinished graph (exit 2)


def bigknn(*args: object) -> list[str]:
    return [sys.executable, "-m", "bigknn", *map(str, args)]


def env() -> dict:
    e = dict(os.environ, BIGKNN_CHECKPOINT_S="0", PYTHONUNBUFFERED="1")
    e.pop("BIGKNN_DEBUG", None)
    return e


def run_json(*args: object) -> dict:
    out = subprocess.run(bigknn(*args, "--json"), capture_output=True, text=True, env=env())
    if out.returncode != 0:
        raise RuntimeError(f"bigknn {' '.join(map(str, args))} exited {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def manifest(store: Path) -> dict | None:
    try:
        return json.loads((store / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def all_graphs(m: dict | None) -> bool:
    return bool(m and m["shards"] and all(s["graph"] is not None for s in m["shards"]))


def output_state(path: Path, reference: dict[str, bytes]) -> str:
    """'absent', 'complete' (every file byte-identical to the uninterrupted export's), 'some' (some files
    complete, the others absent: a .npy export killed between its two files) or 'partial' (a file that is there
    but not whole)."""
    present = {name: (path.parent / name).read_bytes() for name in reference if (path.parent / name).exists()}
    if any(data != reference[name] for name, data in present.items()):
        return "partial"
    return "absent" if not present else "complete" if len(present) == len(reference) else "some"


def export_files(out: Path) -> list[str]:
    """The names an export to ``out`` writes."""
    return [out.name, out.stem + ".dists.npy"] if out.suffix == ".npy" else [out.name]


def complete_export(out: Path, rows: int, k: int) -> bool:
    """Whether a reader's finished export holds every row (ids in range)."""
    if out.suffix == ".npy":
        ids = np.load(out, mmap_mode="r")
        dists = np.load(out.with_name(out.stem + ".dists.npy"), mmap_mode="r")
        return ids.shape == (rows, k) and dists.shape == (rows, k) and bool(((ids >= 0) & (ids < rows)).all())
    raw = out.read_bytes()
    n, kk = np.frombuffer(raw[:8], dtype=np.uint32)
    ids = np.frombuffer(raw[8:8 + n * kk * 4], dtype=np.int32)
    return (n, kk) == (rows, k) and len(raw) == 8 + rows * k * 8 and bool(((ids >= 0) & (ids < rows)).all())


class Readers:
    """One loop of reader commands on ``store`` until stopped; counts outcomes, keeps failures."""

    def __init__(self, store: Path, work: Path):
        self.store, self.work = store, work
        self.runs = self.ok = self.refused = 0
        self.failures: list[str] = []
        self.partial_outputs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "Readers":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        return {"runs": self.runs, "ok": self.ok, "refused": self.refused, "failed": len(self.failures),
                "partial_outputs": self.partial_outputs}

    def _loop(self) -> None:
        turn = 0
        while not self._stop.is_set():
            m = manifest(self.store)
            if m is None:
                time.sleep(0.05)
                continue
            kinds = ["info", "eval", "export"] if all_graphs(m) else ["info"]
            kind = kinds[turn % len(kinds)]
            turn += 1
            out = self.work / f"reader-{turn}.{'npy' if turn % 2 else 'ibin'}"
            args = {"info": ["info", self.store],
                    "eval": ["eval", "recall", self.store, "--backend", "cpu", "--sample", 200],
                    "export": ["export", self.store, "-o", out, "--format", out.suffix[1:]]}[kind]
            proc = subprocess.run(bigknn(*args, "--json"), capture_output=True, text=True, env=env(),
                                  timeout=READER_TIMEOUT_S)
            self.runs += 1
            if proc.returncode == 0:
                self.ok += 1
                if kind == "export":
                    done = json.loads(proc.stdout)
                    if not complete_export(out, done["rows"], done["k"]):
                        self.partial_outputs += 1
                        self.failures.append(f"export: {out} incomplete")
            elif proc.returncode == 2 and NOT_FINISHED in proc.stderr:
                self.refused += 1
            else:
                self.failures.append(f"{kind} exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
            for f in self.work.glob(f"reader-{turn}.*"):
                f.unlink()


def kill_after(cmd: list[str], delay: float, until=None) -> tuple[bool, float]:
    """Start ``cmd``; SIGKILL it after ``delay`` s, or as soon as ``until()`` holds. (killed, seconds run)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env())
    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < delay and not (until and until()):
        time.sleep(0.01)
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    return killed, round(time.monotonic() - t0, 2)


def finish(cmd: list[str]) -> int:
    return subprocess.run(cmd, capture_output=True, text=True, env=env()).returncode


def state(store: Path) -> dict | None:
    m = manifest(store)
    if m is None:
        return None
    return {"shards_built": sum(s["graph"] is not None for s in m["shards"]), "shards": len(m["shards"]),
            "merged": len(m["merged"]), "pending_ingest": m.get("pending") is not None}


def checked(store: Path, reference_recall: float, tolerance: float) -> dict:
    """Verify and recall of a store after its rerun."""
    v = subprocess.run(bigknn("verify", store, "--json"), capture_output=True, text=True, env=env())
    rec = run_json("eval", "recall", store, "--backend", "cpu", "--sample", RECALL_SAMPLE)["recall"]
    return {"verify_ok": v.returncode == 0, "recall": rec, "reference_recall": reference_recall,
            "recall_ok": abs(rec - reference_recall) <= tolerance}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated trial kinds, used in turn")
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--ingest-rows", type=int, default=1_000)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--shard-rows", type=int, default=2_500)
    ap.add_argument("--tolerance", type=float, default=0.005, help="recall@10 vs the uninterrupted run")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()
    kinds = a.kinds.split(",")
    if not set(kinds) <= set(KINDS):
        ap.error(f"--kinds: choose from {', '.join(KINDS)}")
    t_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="bigknn-kill-"))
    data, extra = work / "data.fbin", work / "extra.fbin"
    run_json("synth", data, "--rows", a.rows, "--dim", a.dim)
    run_json("synth", extra, "--rows", a.ingest_rows, "--dim", a.dim, "--first-row", a.rows)
    build_args = ["--k", a.k, "--shard-rows", a.shard_rows, "--backend", "cpu"]

    # the kernels compiled first (a fresh checkout's first build compiles them for minutes), so that the timed
    # runs below, and hence the random kill moments drawn from them, are the runs the trials kill
    run_json("build", extra, "-o", work / "warm.knn", *build_args)
    shutil.rmtree(work / "warm.knn")

    # the uninterrupted runs
    ref, ref_ingested = work / "ref.knn", work / "ref-ingested.knn"
    t = time.monotonic()
    run_json("build", data, "-o", ref, *build_args)
    t_build = time.monotonic() - t
    shutil.copytree(ref, ref_ingested)
    t = time.monotonic()
    run_json("ingest", ref_ingested, "--input", extra, "--backend", "cpu")
    t_ingest = time.monotonic() - t
    recall_build = run_json("eval", "recall", ref, "--backend", "cpu", "--sample", RECALL_SAMPLE)["recall"]
    recall_ingest = run_json("eval", "recall", ref_ingested, "--backend", "cpu", "--sample", RECALL_SAMPLE)["recall"]
    ref_exports: dict[str, dict[str, bytes]] = {}
    t = time.monotonic()
    for fmt in ("ibin", "npy"):
        out = work / "ref-export" / f"graph.{fmt}"
        out.parent.mkdir(exist_ok=True)
        run_json("export", ref, "-o", out, "--format", fmt)
        ref_exports[fmt] = {name: (out.parent / name).read_bytes() for name in export_files(out)}
    t_export = (time.monotonic() - t) / 2
    print(json.dumps({"setup": {"rows": a.rows, "ingest_rows": a.ingest_rows, "dim": a.dim, "k": a.k,
                                "shard_rows": a.shard_rows, "build_s": round(t_build, 2),
                                "ingest_s": round(t_ingest, 2), "export_s": round(t_export, 2),
                                "recall_build": recall_build, "recall_ingest": recall_ingest}}), flush=True)

    rng = random.Random(a.seed)
    results = []
    for trial in range(a.trials):
        kind = kinds[trial % len(kinds)]
        tdir = work / f"t{trial}"
        tdir.mkdir()
        store = tdir / "s.knn"
        rec: dict = {"trial": trial, "kind": kind}
        if kind in ("ingest", "export"):
            shutil.copytree(ref, store)
        with Readers(store, tdir) as readers:
            if kind in ("build", "merge"):
                build = bigknn("build", data, "-o", store, *build_args)
                if kind == "build":
                    rec["kill_after_s"] = round(rng.uniform(0.3, t_build), 2)
                    rec["killed"], _ = kill_after(build, rec["kill_after_s"])
                    rec["state_at_kill"] = state(store)
                    rec["rerun_exit"] = finish(build)
                else:  # killed at its first merge commit, then the merge itself killed at random
                    kill_after(build, 10 * t_build, until=lambda: bool((manifest(store) or {}).get("merged")))
                    merge = bigknn("merge", store, "--backend", "cpu")
                    rec["kill_after_s"] = round(rng.uniform(0.3, 0.8 * t_build), 2)
                    rec["killed"], _ = kill_after(merge, rec["kill_after_s"])
                    rec["state_at_kill"] = state(store)
                    rec["rerun_exit"] = finish(merge)
                rec.update(checked(store, recall_build, a.tolerance))
            elif kind == "ingest":
                ingest = bigknn("ingest", store, "--input", extra, "--backend", "cpu")
                rec["kill_after_s"] = round(rng.uniform(0.3, t_ingest), 2)
                rec["killed"], _ = kill_after(ingest, rec["kill_after_s"])
                rec["state_at_kill"] = state(store)
                rec["rerun_exit"] = finish(ingest)
                rec.update(checked(store, recall_ingest, a.tolerance))
            else:
                turn = trial // len(kinds)
                fmt = ("ibin", "npy")[turn % 2]
                out = tdir / "out" / f"graph.{fmt}"
                out.parent.mkdir()
                export = bigknn("export", store, "-o", out, "--format", fmt)
                if turn % 4 < 2:
                    rec["kill_after_s"] = round(rng.uniform(0.05, t_export), 2)
                    rec["killed"], _ = kill_after(export, rec["kill_after_s"])
                else:
                    rec["kill_after_s"] = "first output file"
                    rec["killed"], _ = kill_after(export, 10 * t_export, until=lambda: any(
                        (out.parent / name).exists() for name in export_files(out)))
                rec["output_at_kill"] = output_state(out, ref_exports[fmt])
                rec["rerun_exit"] = finish(export)
                rec["output_after_rerun"] = output_state(out, ref_exports[fmt])
        rec["readers"] = readers.summary()
        rec["reader_failures"] = readers.failures[:3]
        partial = rec.get("output_at_kill") == "partial" or rec.get("output_after_rerun", "complete") != "complete"
        rec["passed"] = (rec["rerun_exit"] == 0 and rec.get("verify_ok", True) and rec.get("recall_ok", True)
                         and not readers.failures and not partial)
        results.append(rec)
        print(json.dumps(rec), flush=True)
        if rec["passed"] and not a.keep:
            shutil.rmtree(tdir)

    reader_runs = {key: sum(r["readers"][key] for r in results) for key in ("runs", "ok", "refused", "failed")}
    diffs = [abs(r["recall"] - r["reference_recall"]) for r in results if "recall" in r]
    summary = {"trials": len(results), "passed": sum(r["passed"] for r in results),
               "by_kind": {k: {"trials": sum(r["kind"] == k for r in results),
                               "passed": sum(r["passed"] for r in results if r["kind"] == k),
                               "killed": sum(bool(r.get("killed")) for r in results if r["kind"] == k)}
                           for k in kinds},
               "readers": reader_runs,
               "partial_outputs": sum(r.get("output_at_kill") == "partial" for r in results)
               + sum(r["readers"]["partial_outputs"] for r in results),
               "max_recall_diff": round(max(diffs), 5) if diffs else None,
               "wall_s": round(time.monotonic() - t_start, 1), "work": str(work)}
    print(json.dumps(summary), flush=True)
    if summary["passed"] == summary["trials"] and not a.keep:
        shutil.rmtree(work)
    sys.exit(0 if summary["passed"] == summary["trials"] else 1)


if __name__ == "__main__":
    main()
