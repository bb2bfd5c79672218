#!/usr/bin/env python3
"""bigknn's search as a user runs it, against cuVS CAGRA in the same process on the same data.

bigknn is timed only through its public API, at each ``--degrees`` (32 and 64, as CAGRA): ``bigknn.build``
(k = 2 x degree) and ``Graph.prune`` (tsdg), then
``g.search_index(...)`` and ``index.search`` in batches of 10K and one query a call, and ``Graph.search`` after its
first call (the index it keeps). CAGRA (graph degree 32 and 64, its own nn_descent build) is searched over its
itopk_size sweep, results copied to the host as bigknn returns them. The last ``--queries`` rows of each input are
held out as queries. Recall@10 counts ties with the 10th true neighbour (exact truth by ``Graph.truth``).

An input is FILE:METRIC (l2, ip, cosine) or a family of scripts/families.py (text, tokens, sift, u8, f16, synth,
iid64, iid128), made into ``--work`` with ``--rows`` rows first (text and tokens need the model of
scripts/package_model.sh, sift OpenCV; where it cannot be made, a JSON note says so and the run goes on). Every family runs in this one process.

    PYTHONPATH=$PWD python3 scripts/bench_search_api.py text u8 f16 --rows 1000000 --work $WORK/api \\
        --out $OUT/search_api.jsonl
    PYTHONPATH=$PWD python3 scripts/bench_search_api.py u8 --rows 20000 --queries 200 --backend cpu --work /tmp/w

One JSON line per measurement (``--out`` keeps them), then one summary line per family: per method (bigknn-D
index.search, bigknn-D Graph.search for each degree D, cagra-32, cagra-64) and batch (10000, 1) the best QPS at recall@10 >= 0.95
and >= 0.99, the build times (kNN + prune against CAGRA's build), and a one-query call's time split into the
backend's search (queries up, entry GEMM, kernel, results back: ``backend_us``, with the GPU's span of it) and
what the API adds around it (``api_overhead_us``; the only place the script calls bigknn's backend directly).
``bigknn search`` of ``--stream-queries`` queries (a subprocess) is timed against ``index.search`` of the same
batches (``cli_wall_over_index_search``: its whole stream, file I/O included, over the in-process searches).
Without cuvs the CAGRA records are one note. Kernels are compiled by a warm-up build and prune of WARMUP_ROWS
rows (and a warm-up CAGRA build) before anything is timed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np

import bigknn
from bigknn.formats import read_truth, write_vectors

sys.path.insert(0, str(Path(__file__).resolve().parent))
import families  # noqa: E402 - scripts/ on the path first
from bench_families import emit  # noqa: E402
from search_bench import cagra_build, cagra_search, device_name, held_out, timed  # noqa: E402

BUDGETS = [10, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256]  # bigknn's search list length
ITOPK = [16, 32, 64, 96, 128, 160, 192, 256, 384, 512]  # CAGRA's
BATCHES = [10_000, 1]
TARGETS = (0.95, 0.99)
WARMUP_ROWS = 20_000
TIE_RTOL = 1e-5  # a found row within this of the 10th true key counts (float32 rounding of equal distances)
K = 10


# ---- data ---------------------------------------------------------------------------------------
def inputs(spec: str, work: Path, rows: int) -> tuple[str, Path, str] | dict:
    """(family, file, metric) of an input spec, making a scripts/families.py family first; a note on failure."""
    if spec in families.EXT:
        path = work / f"{spec}-{rows}{families.EXT[spec]}"
        if not path.exists():
            try:
                families.write_family(spec, path, rows, seed=0)
            except (SystemExit, ImportError) as e:  # the text family without its model or torch
                return {"family": spec, "note": f"not made: {e}"}
        return spec, path, families.METRIC.get(spec, "l2")
    path, metric = spec.rsplit(":", 1)
    return Path(path).name.split(".")[0], Path(path), metric


def user_keys(q: np.ndarray, x: np.ndarray, ids: np.ndarray, metric: str) -> np.ndarray:
    """Ordering keys of q to x[ids] (cosine: rows and queries unit length, then as ip)."""
    rows = x[np.maximum(ids, 0)].astype(np.float32)
    if metric in ("ip", "cosine"):
        keys = -np.einsum("qd,qkd->qk", q, rows)
    else:
        keys = np.einsum("qkd,qkd->qk", rows - q[:, None, :], rows - q[:, None, :])
    return np.where(ids >= 0, keys, np.inf)


def recall(q, x, ids, truth, metric) -> float:
    kth = user_keys(q, x, truth[:, K - 1:K], metric)
    keys = user_keys(q, x, np.asarray(ids[:, :K], np.int64), metric)
    return float((keys <= kth + TIE_RTOL * np.maximum(1.0, np.abs(kth))).sum(axis=1).mean() / K)


# ---- timing -------------------------------------------------------------------------------------
def sweep(name: str, knobs: list, make_search, q, qs, xs, truth, metric, base: dict, out,
          limit_s: float) -> list[dict]:
    """Each knob at each batch size: ``make_search(knob)(queries) -> ids`` on ``q``; recall on ``qs`` / ``xs``
    (the queries and rows as the search compares them)."""
    points = []
    for batch in BATCHES:
        for knob in knobs:
            ids, qps, done = timed(make_search(knob), q, min(batch, len(q)), limit_s)
            rec = {**base, "method": name, "batch": min(batch, len(q)), "knob": knob, "searched": done,
                   "recall@10": round(recall(qs[:done], xs, ids, truth[:done], metric), 5), "qps": round(qps, 1)}
            emit(rec, out)
            points.append(rec)
    return points


def best(points: list[dict]) -> dict:
    """Per method and batch, the best QPS at each recall target (None where no point reached it)."""
    table: dict = {}
    for p in points:
        row = table.setdefault(p["method"], {}).setdefault(str(p["batch"]), {f"qps@{t}": None for t in TARGETS})
        for t in TARGETS:
            key = f"qps@{t}"
            if p["recall@10"] >= t and (row[key] is None or p["qps"] > row[key]):
                row[key] = p["qps"]
    return table


def overhead(index, backend_name: str, q: np.ndarray, calls: int) -> dict:
    """A one-query call of ``index.search`` against the backend's search of the same prepared query (µs a call,
    medians of ``calls``), the two called in turn so that the GPU's and host's drift falls on both alike (the
    overhead is the median of the pairs' differences), and the GPU's span of the latter (CUDA events)."""
    from bigknn.operations.search_queries import load_queries

    backend, arrays = index._backend, index.arrays
    plan = index.plan(K, None, "auto", 0)
    one = load_queries(q[:1], index.manifest)

    def took(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6

    pairs = np.array([(took(lambda: index.search(q[0], k=K)),  # the same query as the backend's
                       took(lambda: backend.graph_search(arrays, one, plan, 1))) for _ in range(calls)])
    rec = {"api_us": round(float(np.median(pairs[:, 0])), 1), "backend_us": round(float(np.median(pairs[:, 1])), 1),
           "api_overhead_us": round(float(np.median(pairs[:, 0] - pairs[:, 1])), 1), "budget": plan.budget}
    if backend_name == "cuda":
        import cupy as cp

        start, end = cp.cuda.Event(), cp.cuda.Event()
        spans = []
        for _ in range(calls):
            start.record()
            backend.graph_search(arrays, one, plan, 1)
            end.record()
            end.synchronize()
            spans.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
        rec["gpu_span_us"] = round(float(np.median(spans)), 1)
    return rec


# ---- the tools ----------------------------------------------------------------------------------
def bench_bigknn(x, q, metric, degree: int, args, base: dict, out, truth: np.ndarray | None = None
                 ) -> tuple[list[dict], dict, np.ndarray]:
    """Build (k = 2 x degree), prune and search as a user does; also the exact truth of the queries (untimed,
    once: ``truth`` given by an earlier degree)."""
    store = args.work / f"{base['family']}-{degree}.knn"
    shutil.rmtree(store, ignore_errors=True)
    t0 = time.perf_counter()
    g = bigknn.build(x, k=2 * degree, metric=metric, store=store, recall=args.recall, backend=args.backend)
    knn_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    g.prune("tsdg", degree=degree, backend=args.backend)
    prune_s = time.perf_counter() - t0
    if truth is None:
        gt = args.work / f"{base['family']}.gt.ibin"
        gt.unlink(missing_ok=True)
        g.truth(q, gt, k=K, backend=args.backend)
        truth = np.asarray(read_truth(gt)[0], np.int64)
    t0 = time.perf_counter()
    index = g.search_index(backend=args.backend)
    load_s = time.perf_counter() - t0
    build = {"knn_s": round(knn_s, 2), "prune_s": round(prune_s, 2), "knn_plus_prune_s": round(knn_s + prune_s, 2),
             "index_load_s": round(load_s, 2), "degree": degree, "knn_k": 2 * degree}
    name = f"bigknn-{degree}"
    emit({**base, "method": name, **build}, out)
    xs, qs = as_searched(x, metric), as_searched(q, metric)
    bb = {**base, "degree": degree}
    points = sweep(f"{name} index.search", BUDGETS, lambda b: lambda qq: index.search(qq, k=K, budget=b).ids,
                   q, qs, xs, truth, metric, bb, out, args.batch1_seconds)
    g.search(q[:1], k=K, backend=args.backend)  # its first call loads the index it keeps
    points += sweep(f"{name} Graph.search", BUDGETS,
                    lambda b: lambda qq: g.search(qq, k=K, budget=b, backend=args.backend).ids,
                    q, qs, xs, truth, metric, bb, out, args.batch1_seconds)
    calls = overhead(index, args.backend, q, args.overhead_calls)
    emit({**base, "method": f"{name} one-query call", **calls}, out)
    streamed = bench_stream(index, store, q, args, base)
    emit({**base, "method": f"{name} search (CLI, streamed)", **streamed}, out)
    index.close()
    g.close()
    shutil.rmtree(store)  # the next degree's store and the made families share --work's disk
    return points, {**build, "one_query_call": calls, "cli_stream": streamed}, truth


def bench_stream(index, store: Path, q: np.ndarray, args, base: dict) -> dict:
    """``bigknn search`` (a subprocess, --json) of ``--stream-queries`` queries (the held-out ones repeated) in
    batches of 10K against ``index.search`` of the same batches in this process."""
    n = args.stream_queries
    queries = np.tile(q, (-(-n // len(q)), 1))[:n]
    qfile, found = args.work / f"{base['family']}.stream.fbin", args.work / f"{base['family']}.stream.ibin"
    qfile.unlink(missing_ok=True)
    found.unlink(missing_ok=True)
    write_vectors(qfile, queries)
    batch = BATCHES[0]
    t0 = time.perf_counter()
    for b0 in range(0, n, batch):
        index.search(queries[b0:b0 + batch], k=K)
    in_process = time.perf_counter() - t0
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "bigknn", "search", str(store), "--queries", str(qfile), "-o",
                          str(found), "--batch", str(batch), "--k", str(K), "--backend", args.backend, "--json"],
                         capture_output=True, text=True, check=True)
    process_s = time.perf_counter() - t0
    report = json.loads(run.stdout)
    qfile.unlink()
    found.unlink()
    return {"queries": n, "batch": batch, "index_search_s": round(in_process, 3), "cli_search_s": report["search_s"],
            "cli_stream_wall_s": report["wall_s"], "cli_process_s": round(process_s, 3),
            "cli_search_over_index_search": round(report["search_s"] / in_process, 3),
            "cli_wall_over_index_search": round(report["wall_s"] / in_process, 3)}


def as_searched(rows: np.ndarray, metric: str) -> np.ndarray:
    """float32 rows as the search compares them (cosine: unit length)."""
    out = np.asarray(rows, np.float32).copy()
    if metric == "cosine":
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-30)
    return out


def bench_cagra(x, q, truth, metric, args, base: dict, out) -> tuple[list[dict], dict]:
    import cupy as cp

    xd = cp.asarray(x, dtype=cp.float32)
    points, builds = [], {}
    for degree in (32, 64):
        idx, build_s = cagra_build(xd, metric, degree, WARMUP_ROWS)
        builds[f"cagra-{degree}"] = round(build_s, 2)
        emit({**base, "method": f"cagra-{degree}", "build_s": builds[f"cagra-{degree}"]}, out)
        points += sweep(f"cagra-{degree}", ITOPK, lambda itopk, idx=idx: cagra_search(idx, itopk, K), q, q, x, truth,
                        metric, {**base, "degree": degree}, out, args.batch1_seconds)
        del idx
    return points, builds


def bench_family(spec: str, args, device: str, cagra_note: str | None, out) -> None:
    made = inputs(spec, args.work, args.rows)
    if isinstance(made, dict):
        emit(made, out)
        return
    family, path, metric = made
    x, q = held_out(path, args.queries)
    x, q = np.ascontiguousarray(x), np.ascontiguousarray(q, np.float32)
    base = {"workload": "search_api", "family": family, "rows": len(x), "dim": x.shape[1], "metric": metric,
            "queries": len(q), "device": device, "backend": args.backend}
    warm = args.work / "warm-up.knn"  # kernels compiled before anything is timed
    shutil.rmtree(warm, ignore_errors=True)
    with bigknn.build(x[:WARMUP_ROWS], k=2 * max(args.degrees), metric=metric, store=warm,
                      backend=args.backend) as g:
        for degree in args.degrees:
            g.prune("tsdg", degree=degree, backend=args.backend)
            g.search(q[:1], backend=args.backend)  # the search kernels too: index_load_s is the load alone
    shutil.rmtree(warm)
    points, build, truth = [], {}, None
    for degree in args.degrees:
        found, build[f"bigknn-{degree}"], truth = bench_bigknn(x, q, metric, degree, args, base, out, truth)
        points += found
    cagra: dict | str = cagra_note or {}
    if cagra_note is None:
        cagra_points, cagra = bench_cagra(as_searched(x, metric), as_searched(q, metric), truth, metric, args,
                                          base, out)
        points += cagra_points
    emit({**base, "summary": best(points), "bigknn_build": build, "cagra_build_s": cagra}, out)


def cagra_missing(backend: str) -> str | None:
    """Why CAGRA is not run (a note for the JSON), or None."""
    if backend != "cuda":
        return "cagra runs on the GPU only (--backend cpu)"
    try:
        import cuvs.neighbors.cagra  # noqa: F401
    except ImportError as e:
        return f"cuvs is not importable ({e}); CAGRA not measured"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="FILE:METRIC, or a scripts/families.py family (made into --work)")
    ap.add_argument("--work", type=Path, required=True, help="folder for the stores and made families")
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of a family made here (queries included)")
    ap.add_argument("--queries", type=int, default=10_000, help="rows held out at the end of each input")
    ap.add_argument("--degrees", type=int, nargs="+", default=[32, 64],
                    help="search graph degrees, each its own build (the kNN graph has twice it)")
    ap.add_argument("--recall", type=float, default=0.99, help="the kNN build's recall target")
    ap.add_argument("--batch1-seconds", type=float, default=2.0, help="one query a call: seconds per point")
    ap.add_argument("--stream-queries", type=int, default=1_000_000, help="queries `bigknn search` streams")
    ap.add_argument("--overhead-calls", type=int, default=2_000, help="one-query calls timed for the overhead")
    ap.add_argument("--backend", choices=["cuda", "cpu"], default="cuda", help="cpu: a smoke test of the script")
    ap.add_argument("--out", default=None, help="JSONL file the records are appended to")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    device = device_name(args.backend)
    note = cagra_missing(args.backend)
    with open(args.out, "a") if args.out else nullcontext() as out:
        if note:
            emit({"workload": "search_api", "cagra": note}, out)
        for spec in args.inputs:
            bench_family(spec, args, device, note, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
