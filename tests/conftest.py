"""Shared fixtures and helpers of the CPU test suite: small synthetic inputs, a CLI runner, exact
neighbours by plain NumPy, and recall / graph-invariant checks used by several files."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bigknn.formats import write_vectors
from bigknn.core.metric import L2, Metric
from bigknn.core.synth import synth

CLI_TIMEOUT_S = 1800  # a subprocess's hang guard, never a verdict: a fresh clone's first CLI call compiles every
# numba kernel, which takes minutes on a loaded 2-core machine (a 300 s guard failed a CI run's first fixture)


# ---- the command line -------------------------------------------------------------------------
def cli_env() -> dict:
    env = dict(os.environ)
    env.pop("BIGKNN_DEBUG", None)  # the documented one-line errors, never a traceback
    env["PYTHONUNBUFFERED"] = "1"
    env["BIGKNN_CHECKPOINT_S"] = "0"  # commit every merge, so kill tests see (and cut) a merge phase in progress
    env.setdefault("COLUMNS", "120")
    return env


def run_cli(*args, cwd: Path | None = None, timeout: float = CLI_TIMEOUT_S) -> tuple[int, str, str]:
    """Run ``python -m bigknn ARGS`` and return (exit code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "bigknn", *map(str, args)], cwd=cwd, env=cli_env(),
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def run_json(*args, cwd: Path | None = None) -> dict:
    """Run a CLI command with ``--json`` that must succeed; return its one JSON object."""
    code, out, err = run_cli(*args, "--json", cwd=cwd)
    assert code == 0, f"bigknn {' '.join(map(str, args))} exited {code}: {err}"
    return json.loads(out)


# the lines a run logs as it goes (every phase's start and end, the kernels' compile), before an error found
# halfway through its work
PROGRESS_LINE = re.compile(r"bigknn: ([\w ]+: .*( to do|\(\d+ %\) in .*)|kernels ready in .*|compiling CPU kernels .*)$")


def error_lines(err: str) -> list[str]:
    """stderr's lines less the progress lines: what a failing run says of its failure."""
    return [line for line in err.strip("\n").split("\n") if line.strip() and not PROGRESS_LINE.match(line)]


def assert_one_line_error(code: int, out: str, err: str, *names: str, exit_code: int = 2) -> str:
    """Exit code 2 (bad input), nothing on stdout, exactly one error line on stderr naming every one of ``names``
    (after the progress lines of the work done before the error was found, if any)."""
    assert code == exit_code, f"exit {code}, stderr: {err!r}"
    lines = err.strip("\n").split("\n")
    assert lines[-1].strip() and all(PROGRESS_LINE.match(line) for line in lines[:-1]), \
        f"stderr is not one error line: {err!r}"
    assert "Traceback" not in err
    for name in names:
        assert name in lines[-1], f"{name!r} not named in {lines[-1]!r}"
    assert out == "", f"unexpected stdout {out!r}"
    return lines[-1]


def wait_until_it_opens(proc: subprocess.Popen, path: Path, timeout: float = 60.0) -> None:
    """Wait until the process ``proc`` holds ``path`` open (e.g. a command that took or waits for the
    store's lock: it is past its start-up and its checks)."""
    deadline = time.monotonic() + timeout
    target = str(Path(path).resolve())
    while not _holds_open(proc.pid, target):
        assert proc.poll() is None, f"the process ended before it opened {path}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"the process never opened {path}"
        time.sleep(0.02)


def _holds_open(pid: int, target: str) -> bool:
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        return any(os.readlink(fd_dir / fd) == target for fd in os.listdir(fd_dir))
    except OSError:  # a descriptor closed while listing, or the process ended
        return False


@pytest.fixture(scope="session")
def cuda_backend():
    """One CUDA backend for the GPU tests (marked ``gpu``); they skip cleanly where CuPy or a device is missing."""
    from bigknn.backends.cuda import CudaBackend, cuda_available

    if not cuda_available():
        pytest.skip("CuPy or a CUDA device is not available")
    return CudaBackend()


@pytest.fixture
def cli():
    """The CLI runner as a fixture: ``cli("build", ...) -> (code, stdout, stderr)``."""
    return run_cli


# ---- inputs -----------------------------------------------------------------------------------
def write_synth(path: Path, rows: int, dim: int, seed: int = 0) -> np.ndarray:
    x = synth(rows, dim, seed=seed)
    write_vectors(path, x)
    return x


@pytest.fixture
def small_fbin(tmp_path) -> tuple[Path, np.ndarray]:
    """A 2000 x 16 clustered float32 .fbin and its rows."""
    path = tmp_path / "small.fbin"
    return path, write_synth(path, 2000, 16, seed=5)


# ---- search graphs ----------------------------------------------------------------------------
def clustered(rng: np.random.Generator, centres: np.ndarray, rows: int) -> np.ndarray:
    """``rows`` float32 rows, each a randomly chosen centre plus unit normal noise."""
    return (centres[rng.integers(0, len(centres), rows)] + rng.normal(size=(rows, centres.shape[1]))).astype(np.float32)


def search_set(d: Path, seed: int, clusters: int, spread: float, dim: int, rows: int, queries: int) -> dict:
    """A clustered base set ``x`` and held-out queries ``q`` around the same centres, the queries also written to
    ``d/q.fbin``: what the search tests search (the base set built by ``pruned_store``)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim)) * spread
    x, q = clustered(rng, centres, rows), clustered(rng, centres, queries)
    write_vectors(d / "q.fbin", q)
    return {"dir": d, "x": x, "q": q}


def ranked_candidates(rng: np.random.Generator, table: np.ndarray, metric: str, rows: int, width: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For ``rows`` random rows of ``table``: (candidates (rows, width) int64, EMPTY-padded at the end, each list
    1..width random rows ascending by key (stable), their float32 keys (l2 or ip, from float64), the rows)."""
    t = table.astype(np.float64)
    cands = np.full((rows, width), -1, np.int64)
    keys = np.full((rows, width), np.inf, np.float32)
    at = rng.integers(0, len(table), rows)
    for r in range(rows):
        c = rng.choice(len(table), size=int(rng.integers(1, width + 1)), replace=False)
        key = ((t[c] - t[at[r]]) ** 2).sum(1) if metric == "l2" else -(t[c] @ t[at[r]])
        order = np.argsort(key, kind="stable")
        cands[r, :len(c)], keys[r, :len(c)] = c[order], key[order]
    return cands, keys, at


def pruned_store(path: Path, x: np.ndarray, k: int, degree: int, shard_rows: int = 0, method: str = "tsdg",
                 metric: str = "l2") -> Path:
    """``x`` built into a store at ``path`` and pruned to a search graph of ``degree`` (both on the CPU)."""
    import bigknn

    with bigknn.build(x, k=k, metric=metric, store=path, backend="cpu", shard_rows=shard_rows) as g:
        g.prune(method, degree=degree, backend="cpu")
    return path


def stored_index(path: Path, metric: Metric = L2):
    """The committed search graph and rows of the store at ``path`` as a search reads them (``metric``: the
    store's), loaded as a loaded index loads them."""
    from bigknn.operations.search_arrays import load_index
    from bigknn.shards import Store

    store = Store.open(path)
    try:
        return load_index(store, metric)[0]
    finally:
        store.close()


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list:
    """Patch ``owner.name`` to record each call's positional arguments (and still make the call); returns the
    record, e.g. every search-graph load a loaded index makes."""
    seen: list = []
    real = getattr(owner, name)

    def counted(*args, **kwargs):
        seen.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return seen


# ---- exact neighbours and recall --------------------------------------------------------------
def exact_keys(q: np.ndarray, x: np.ndarray, metric: str = "l2") -> np.ndarray:
    """Ordering keys between every query and every row, in float64 (squared L2, or -dot for ip)."""
    q = np.asarray(q, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    dots = q @ x.T
    if metric == "ip":
        return -dots
    d = (q * q).sum(1)[:, None] + (x * x).sum(1)[None, :] - 2.0 * dots
    return np.maximum(d, 0.0)


def exact_neighbours(x: np.ndarray, rows: np.ndarray, k: int, metric: str = "l2",
                     chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Plain NumPy reference: the k nearest rows of each sampled row (itself excluded) and their keys."""
    ids_out, keys_out = [], []
    for s in range(0, len(rows), chunk):
        r = rows[s:s + chunk]
        keys = exact_keys(x[r], x, metric)
        keys[np.arange(len(r)), r] = np.inf  # self excluded
        part = np.argpartition(keys, k - 1, axis=1)[:, :k] if k < keys.shape[1] else \
            np.broadcast_to(np.arange(keys.shape[1]), keys.shape)
        pk = np.take_along_axis(keys, part, axis=1)
        within = np.argsort(pk, axis=1, kind="stable")
        ids_out.append(np.take_along_axis(part, within, axis=1))
        keys_out.append(np.take_along_axis(pk, within, axis=1))
    return np.concatenate(ids_out), np.concatenate(keys_out)


def recall_at(graph_ids: np.ndarray, x: np.ndarray, rows: np.ndarray, k: int, metric: str = "l2",
              truth: tuple[np.ndarray, np.ndarray] | None = None) -> float:
    """Recall@k of ``graph_ids`` (rows of the graph for the sampled ``rows``), self excluded, ties counted:
    a listed neighbour is correct when its true key is no larger than the exact k-th key (+ float slack)."""
    _, tkeys = truth if truth is not None else exact_neighbours(x, rows, k, metric)
    kth = tkeys[:, k - 1]
    g = np.asarray(graph_ids)[:, :k].astype(np.int64)
    valid = (g >= 0) & (g != rows[:, None])
    safe = np.where(valid, g, 0)
    xq = np.asarray(x, dtype=np.float64)[rows]
    xn = np.asarray(x, dtype=np.float64)[safe]
    if metric == "ip":
        keys = -np.einsum("ij,ikj->ik", xq, xn)
    else:
        keys = ((xq[:, None, :] - xn) ** 2).sum(-1)
    slack = 1e-5 * np.maximum(1.0, np.abs(kth))
    correct = valid & (keys <= (kth + slack)[:, None])
    # a row listed twice counts once
    earlier = np.tril(np.ones((k, k), dtype=bool), -1)  # [j, i]: i < j
    repeated = ((g[:, :, None] == g[:, None, :]) & earlier).any(axis=2)
    return float((correct & ~repeated).sum(1).mean() / k)


def check_graph(ids: np.ndarray, dists: np.ndarray, x: np.ndarray, metric: str = "l2", first_id: int = 0,
                allow_empty: bool = False, rtol: float = 1e-3) -> None:
    """Invariants of a k-NN graph of rows ``first_id .. first_id + len(ids)`` (global ids) over ``x``
    (indexed by global id): shapes and dtypes, no self, no duplicate ids per row, keys ascending, and
    stored keys equal to the keys recomputed in float64."""
    n, k = ids.shape
    assert dists.shape == (n, k)
    assert ids.dtype == np.int32 and dists.dtype == np.float32
    empty = ids == -1
    if not allow_empty:
        assert not empty.any(), f"{int(empty.sum())} empty slots"
    assert np.all(np.isinf(dists[empty])), "an empty slot has a finite key"
    assert np.all(np.isfinite(dists[~empty])), "a listed neighbour has an infinite key"
    assert ids.min() >= -1 and ids.max() < len(x)
    me = np.arange(first_id, first_id + n)[:, None]
    assert not np.any(ids == me), "a row lists itself"
    s = np.sort(ids, axis=1)
    assert not np.any((s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)), "a row lists one id twice"
    assert np.all(np.diff(dists, axis=1) >= 0), "keys are not ascending"
    safe = np.where(empty, 0, ids).astype(np.int64)
    xq = np.asarray(x, dtype=np.float64)[me[:, 0]]
    xn = np.asarray(x, dtype=np.float64)[safe]
    if metric == "ip":
        want = -np.einsum("ij,ikj->ik", xq, xn)
    else:
        want = ((xq[:, None, :] - xn) ** 2).sum(-1)
    scale = float(np.abs(want[~empty]).max()) if (~empty).any() else 1.0
    np.testing.assert_allclose(dists[~empty], want[~empty], rtol=rtol, atol=1e-5 * scale)


# ---- stores -----------------------------------------------------------------------------------
def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative path -> digest)."""
    out = {}
    for p in sorted(Path(root).rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def read_manifest(store: Path) -> dict:
    return json.loads((Path(store) / "manifest.json").read_text())


def merged_shards(backend, x: np.ndarray, shard_rows: int, params, metric: Metric = L2) -> list:
    """ShardParts of x's rows in shards of ``shard_rows``: GNND each, then GGM of every pair (a built store)."""
    from bigknn.core.knn_graph import ShardPart
    from bigknn.core.knn_graph import KnnGraph

    parts = []
    for i, lo in enumerate(range(0, len(x), shard_rows)):
        g = backend.gnnd(x[lo:lo + shard_rows], metric, params, seed=i)
        ids = np.where(g.ids >= 0, g.ids.astype(np.int64) + lo, -1).astype(np.int32)
        parts.append(ShardPart(lo, x[lo:lo + shard_rows], KnnGraph(ids, g.dists)))
    for i in range(len(parts)):
        for j in range(i + 1, len(parts)):
            ga, gb = backend.ggm(parts[i], parts[j], metric, params, seed=100 + 31 * i + j)
            parts[i] = ShardPart(parts[i].offset, parts[i].vectors, ga)
            parts[j] = ShardPart(parts[j].offset, parts[j].vectors, gb)
    return parts


def fold_in(backend, old: list, batch, params, seeded: bool, metric: Metric = L2) -> tuple[list, object, list]:
    """An ingest's merges: the batch part against each old part in turn, each merge after the first seeded
    through the old parts merged before it (the last SEED_SHARDS) when ``seeded``. Returns (old parts, batch
    part, update counts per merge)."""
    from bigknn.core.knn_graph import ShardPart
    from bigknn.algorithms.merge_setup import SEED_SHARDS

    old, updates = list(old), []
    for i, part in enumerate(old):
        vias = old[:i][-SEED_SHARDS:] if seeded else []
        counts: list[int] = []
        ga, gb = backend.ggm(part, batch, metric, params, seed=500 + i, on_iter=counts.append, vias=vias)
        old[i] = ShardPart(part.offset, part.vectors, ga)
        batch = ShardPart(batch.offset, batch.vectors, gb)
        updates.append(counts)
    return old, batch, updates


def replay_loads(shards: int, capacity: int, cache_aware: bool, pairs: list | None = None,
                 choose_held_first: bool = False, evict: str = "scheduler") -> int:
    """Shard reads of one worker merging ``pairs`` (default: every pair, in the schedule's order) through a
    cache of ``capacity`` shards holding the last GNND results at first, the pairs chosen by the Scheduler
    (told what is cached, or not): the explicit replay bigknn plan's read count is checked against.
    ``choose_held_first``: the pairs chosen by cached shards first, then shards shared with the last pair,
    and nothing else (the Scheduler's rule before its finishing and freeing rules). ``evict``: "lru", least
    recently used out first; "scheduler", the rule the build's cache follows, written out here on its own:
    the shard (not of the running merge) with the fewest pairs still to merge with cached shards, then the
    fewest pairs still to merge, then the least recently used."""
    from collections import OrderedDict

    from bigknn.engine.pair_order import pending_pairs
    from bigknn.engine.scheduler import Scheduler

    todo = pending_pairs(shards, set()) if pairs is None else list(pairs)
    left = set(todo)
    lru = OrderedDict.fromkeys(range(shards - capacity, shards))  # the last GNND results are at hand
    sched = Scheduler(todo, ready=range(shards), held=lru.__contains__ if cache_aware else None)
    reads, last = 0, set()
    def held_first(free):
        return max(free, key=lambda p: ((p[0] in lru) + (p[1] in lru), (p[0] in last) + (p[1] in last)))

    def victim(running: tuple[int, int]) -> int:
        if evict == "lru":
            return next(iter(lru))
        def rank(s: int) -> tuple[int, int]:
            mine = [p for p in left if s in p]
            return sum((p[0] if p[1] == s else p[1]) in lru for p in mine), len(mine)
        others = [s for s in lru if s not in running]  # in least recently used order: min keeps the first
        return min(others, key=rank)

    while (task := sched.next_task(last, held_first if choose_held_first else None)) is not None:
        left.discard(task[1])
        for s in task[1]:  # the pair touched first, then its missing shards read
            if s in lru:
                lru.move_to_end(s)
        for s in task[1]:
            if s not in lru:
                reads += 1
                lru[s] = None
                while len(lru) > capacity:
                    del lru[victim(task[1])]
        sched.release(task[1])
        last = set(task[1])
    return reads
