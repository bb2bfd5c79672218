#!/usr/bin/env python3
"""The same rows as M Parquet files (float16 fixed-size lists and a string id column) and as one .f16bin:
``bigknn build`` on each through the CLI, timed, with each build's peak RSS (the child's own, from wait4) and
its recall@10 on sampled rows (``bigknn eval recall``). One JSON object on stdout.

    PYTHONPATH=. python3 scripts/bench_parquet.py --rows 10000000 --dim 384 --files 100 --dir /scratch/pq \
        -- --gpus all

Arguments after ``--`` go to every build. The issue's bar: the Parquet build within 1.1x of the .f16bin's wall
time at the same recall, its peak RSS bounded (one row group per reading thread beside what the build itself
holds); ``rss_ratio`` and ``wall_ratio`` say how the two compare. An untimed build of the first Parquet file
goes first (a GPU's kernels compiled and loaded, pyarrow imported), and each store is removed once its recall
is measured (disk: the two inputs, about 2 x rows x dim x 2 bytes, and one store at a time), unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bigknn.formats import vectors_writer
from bigknn.core.synth import synth_blocks

RECALL_K = 10  # recall@10, or @k of a smaller graph


def write_inputs(folder: Path, rows: int, dim: int, files: int, group_rows: int, seed: int) -> tuple[Path, Path]:
    """The clustered synth set as ``files`` Parquet files under folder/parquet (written with pyarrow's defaults,
    as a user's pipeline would: snappy, dictionary pages, statistics; on a thread per core, since float16
    columns encode slowly) and as folder/x.f16bin."""
    parts, flat = folder / "parquet", folder / "x.f16bin"
    parts.mkdir(parents=True)
    bounds = np.linspace(0, rows, files + 1).astype(np.int64)
    workers = os.cpu_count() or 1
    with vectors_writer(flat, rows, dim, np.float16) as out, ThreadPoolExecutor(workers) as pool:
        at, part, pending, writing = 0, 0, [], []
        for block in synth_blocks(rows, dim, seed=seed):
            out[at:at + len(block)] = block
            pending.append(block.astype(np.float16))
            at += len(block)
            while part < files and at >= bounds[part + 1]:
                rows_here = np.concatenate(pending)
                cut = int(bounds[part + 1] - (at - len(rows_here)))
                writing.append(pool.submit(write_part, parts / f"part-{part:05d}.parquet", rows_here[:cut],
                                           int(bounds[part]), group_rows))
                pending, part = [rows_here[cut:]], part + 1
                while len(writing) > 2 * workers:  # parts in memory: bounded
                    writing.pop(0).result()
        for done in writing:
            done.result()
    return parts, flat


def write_part(path: Path, x: np.ndarray, first: int, group_rows: int) -> None:
    emb = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1])
    ids = pa.array([f"doc-{first + i:012d}" for i in range(len(x))])
    pq.write_table(pa.table({"doc_id": ids, "emb": emb}), path, row_group_size=group_rows)


def timed_cli(args: list[str]) -> dict:
    """Run ``python -m bigknn ARGS --json``; its JSON, wall time and the child's own peak RSS."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "bigknn", *args, "--json", "-q"], stdout=subprocess.PIPE)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"bigknn {' '.join(args)} exited {proc.returncode}")
    return {"wall_s": round(time.perf_counter() - t, 2), "peak_rss_gb": round(usage.ru_maxrss * 1024 / 1e9, 2),
            "report": json.loads(out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--group-rows", type=int, default=16_384, help="rows per Parquet row group")
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--dir", type=Path, required=True, help="a new or empty folder for the inputs and stores")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recall-sample", type=int, default=2000, help="rows `bigknn eval recall` checks")
    ap.add_argument("--keep", action="store_true", help="keep the inputs and stores")
    ap.add_argument("build_args", nargs="*", help="after --: more `bigknn build` options for both builds")
    a = ap.parse_args()
    if a.dir.exists() and any(a.dir.iterdir()):
        raise SystemExit(f"{a.dir}: not empty")
    t = time.perf_counter()
    parts, flat = write_inputs(a.dir, a.rows, a.dim, a.files, a.group_rows, a.seed)
    result = {"rows": a.rows, "dim": a.dim, "files": a.files, "group_rows": a.group_rows, "k": a.k,
              "write_s": round(time.perf_counter() - t, 1),
              "parquet_gb": round(sum(p.stat().st_size for p in parts.iterdir()) / 1e9, 6),
              "f16bin_gb": round(flat.stat().st_size / 1e9, 6)}
    columns = ["--column", "emb", "--id-column", "doc_id"]
    warm = a.dir / "warm.knn"
    result["warm_up_s"] = timed_cli(["build", str(min(parts.iterdir())), *columns, "-o", str(warm), "--k", str(a.k),
                                     *a.build_args])["wall_s"]
    shutil.rmtree(warm)
    runs = {"f16bin": [str(flat)], "parquet": [str(parts), *columns]}
    for name, source in runs.items():
        store = a.dir / f"{name}.knn"
        run = timed_cli(["build", *source, "-o", str(store), "--k", str(a.k), *a.build_args])
        recall = timed_cli(["eval", "recall", str(store), "--sample", str(a.recall_sample), "--k",
                            str(min(RECALL_K, a.k))])["report"]
        result[name] = {"wall_s": run["wall_s"], "peak_rss_gb": run["peak_rss_gb"],
                        "build_wall_s": run["report"]["wall_s"], "phase_s": run["report"]["phase_s"],
                        "recall": recall.get("recall"), "shards": run["report"]["shards"],
                        "store_gb": round(sum(f.stat().st_size for f in store.rglob("*") if f.is_file()) / 1e9, 6)}
        if not a.keep:
            shutil.rmtree(store)
    result["wall_ratio"] = round(result["parquet"]["build_wall_s"] / result["f16bin"]["build_wall_s"], 3)
    result["rss_ratio"] = round(result["parquet"]["peak_rss_gb"] / max(result["f16bin"]["peak_rss_gb"], 1e-9), 3)
    print(json.dumps(result))
    if not a.keep:
        shutil.rmtree(a.dir)


if __name__ == "__main__":
    main()
