"""``bigknn prune``: the diversification rules against brute force (every kept edge satisfies its rule, every
dropped edge violates it), GGNN's path-back test against brute force, the search graph a prune commits, and
that a failed or killed prune leaves the store as it was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import bigknn
from bigknn.backends.cpu import CpuBackend
from bigknn.backends.cpu import diversify_kernels
from bigknn.backends.cpu.diversify import diversify, reach_back
from bigknn.core.errors import BadInput
from bigknn.core.knn_graph import EMPTY
from bigknn.core.metric import L2, metric as metric_of
from bigknn.operations.verify import repair, verify
from bigknn.algorithms.search_params import NO_LAMBDA, SYM_MIDPOINT, DiversifyRule
from bigknn.operations.search_arrays import load_index
from bigknn.shards import Store
from bigknn.shards.manifest import SEARCH_SINCE

from conftest import cli_env, ranked_candidates, read_manifest, stored_index, tree_hashes
from test_chunks import flip_byte


def _files(path: Path, skip: str = "search/") -> dict[str, str]:
    """Digests of the store's files, readers' leases (.readers/), the writer lock and ``skip`` left out, and
    zarr's in-flight temp files (``<name>.<uuid>.partial``: what a process killed inside one of zarr's atomic
    metadata writes leaves; never under a real name)."""
    return {f: h for f, h in tree_hashes(path).items()
            if not f.startswith((".readers/", ".lock", skip)) and not f.endswith(".partial")}


def _distance(a: np.ndarray, b: np.ndarray, metric: str) -> float:
    """The rules' distance, computed independently of the code under test."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.sqrt(((a - b) ** 2).sum())) if metric == "l2" else float(1.0 - a @ b)


def _candidate_lists(rng, metric: str, rows: int = 40, width: int = 14, n: int = 80, dim: int = 4):
    """A table, and for each of ``rows`` rows (the first table rows) its candidates ascending by distance,
    some lists EMPTY-padded at the end."""
    table = rng.normal(size=(n, dim)).astype(np.float32)
    if metric == "ip":
        table /= np.linalg.norm(table, axis=1, keepdims=True)
    cands = np.full((rows, width), EMPTY, np.int64)
    keys = np.full((rows, width), np.inf, np.float32)
    for r in range(rows):
        c = rng.choice(np.arange(rows, n), size=width - r % 4, replace=False)
        key = ((table[c] - table[r]) ** 2).sum(1) if metric == "l2" else -(table[c] @ table[r])
        order = np.argsort(key)
        cands[r, :len(c)], keys[r, :len(c)] = c[order], key[order]
    return table, cands, keys


def _occludes(table, row, i, j, metric, alpha, rule):
    d0i, d0j = _distance(table[row], table[i], metric), _distance(table[row], table[j], metric)
    dij = _distance(table[i], table[j], metric)
    if rule == "rng":
        return dij <= d0j
    return alpha * d0i < d0j and alpha * dij < d0j


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("rule", [DiversifyRule("rng"), DiversifyRule("gd", 1.0), DiversifyRule("gd", 1.2)])
def test_sequential_rules_keep_exactly_the_unoccluded(metric, rule):
    table, cands, keys = _candidate_lists(np.random.default_rng(1), metric)
    kept = diversify(cands, keys, table, metric_of(metric), rule).astype(bool)
    assert not kept[cands < 0].any()
    for r in range(len(cands)):
        for j in np.flatnonzero(cands[r] >= 0):
            blockers = [i for i in range(j) if kept[r, i]
                        and _occludes(table, r, cands[r, i], cands[r, j], metric, rule.alpha, rule.kind)]
            assert kept[r, j] == (not blockers), (r, j, blockers)
    valid = cands >= 0
    assert 0 < kept.sum() < valid.sum()  # the rule decided both ways
    assert kept[:, 0].all()  # the nearest is never occluded


@pytest.mark.parametrize("impl", [diversify, diversify_kernels.diversify], ids=["reference", "compiled"])
@pytest.mark.parametrize("rule", [DiversifyRule("rng"), DiversifyRule("gd", 1.0), DiversifyRule("occlusion")])
def test_a_twin_of_the_row_occludes_nothing(rule, impl):
    """l2: a twin (key 0) ties exactly with every later candidate (d(twin, j) = d(row, j)); it must not stand in for
    the row's other edges, or a row with a duplicate keeps only its duplicate."""
    table, cands, keys = _candidate_lists(np.random.default_rng(4), "l2")
    table[cands[:, 0]] = table[:len(cands)]  # each row's nearest candidate becomes its twin
    keys[:, 0] = 0.0
    with_twin = impl(cands, keys, table, L2, rule)
    without = impl(cands[:, 1:], keys[:, 1:], table, L2, rule)
    if rule.sequential:
        assert with_twin[:, 0].all()
    np.testing.assert_array_equal(with_twin[:, 1:], without)


def _integer_lists(rng, metric: str, rows: int, width: int, n: int = 600, dim: int = 33):
    """Integer-valued rows (uint8, as SIFT) and each row's candidates ascending by key, EMPTY-padded at the end:
    every key and pair key is an exact integer in float32 and float64 alike."""
    table = rng.integers(0, 16, size=(n, dim)).astype(np.uint8)
    cands, keys, _ = ranked_candidates(rng, table, metric, rows, width)
    return table, cands, keys


RULES = [DiversifyRule("rng"), DiversifyRule("gd", 1.0), DiversifyRule("gd", 1.2), DiversifyRule("occlusion")]


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.kind}-{r.alpha}")
@pytest.mark.parametrize("rows,width", [(1, 1), (257, 33), (61, 97)])
def test_compiled_diversify_is_the_reference_on_integer_rows(metric, rule, rows, width):
    """Exact keys on both sides (uint8 rows): the compiled verdicts are the reference's, slot for slot, and so
    are the CPU backend's lists."""
    table, cands, keys = _integer_lists(np.random.default_rng(rows + width), metric, rows, width)
    want = diversify(cands, keys, table, metric_of(metric), rule)
    got = diversify_kernels.diversify(cands, keys, table, metric_of(metric), rule)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert 0 < (got > 0).sum() < (cands >= 0).sum() or rows == 1  # decided both ways
    cut = max(1, width // 2)
    for a, b in zip(CpuBackend().diversify_lists(cands, keys, table, metric_of(metric), rule, cut),
                    CpuBackend(reference=True).diversify_lists(cands, keys, table, metric_of(metric), rule, cut)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.kind}-{r.alpha}")
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_compiled_diversify_agrees_with_the_reference_on_float_rows(metric, rule, dtype):
    """float rows: float32 pair keys may decide a near-tie the other way than the reference's float64, nothing
    else (as the GPU's kernels)."""
    table, cands, keys = _candidate_lists(np.random.default_rng(9), metric, rows=300, width=40, n=900, dim=24)
    table = table.astype(dtype)
    want = diversify(cands, keys, table, metric_of(metric), rule)
    got = diversify_kernels.diversify(cands, keys, table, metric_of(metric), rule)
    assert got.dtype == want.dtype and not got[cands < 0].any()
    assert (got == want).all(axis=1).mean() >= 0.98


@pytest.mark.parametrize("rule", [DiversifyRule("rng"), DiversifyRule("gd", 1.2), DiversifyRule("occlusion")])
@pytest.mark.parametrize("width", [1, 7, 40])
def test_diversified_lists_are_the_verdicts_columns_in_rank_order(rule, width):
    """The backend's lists: under a sequential rule the kept columns in order; under occlusion every valid
    column by (factor capped at NO_LAMBDA - 1, column); cut to width, -1 / NO_LAMBDA padded (width 40 > the
    lists' 14 columns pads)."""
    table, cands, keys = _candidate_lists(np.random.default_rng(5), "l2")
    verdict = diversify(cands, keys, table, L2, rule)
    cols, ranks = CpuBackend().diversify_lists(cands, keys, table, L2, rule, width)
    assert cols.shape == ranks.shape == (len(cands), width) and cols.dtype == np.int32 and ranks.dtype == np.uint8
    for r in range(len(cands)):
        valid = np.flatnonzero(cands[r] >= 0)
        if rule.sequential:
            want = [(0, j) for j in valid if verdict[r, j]]
        else:
            want = sorted((min(int(verdict[r, j]), NO_LAMBDA - 1), j) for j in valid)
        want = want[:width]
        assert cols[r, :len(want)].tolist() == [j for _, j in want], r
        assert ranks[r, :len(want)].tolist() == [f for f, _ in want], r
        assert (cols[r, len(want):] == -1).all() and (ranks[r, len(want):] == NO_LAMBDA).all()


def test_verdict_columns_cap_the_factors_and_skip_empty_slots():
    from bigknn.algorithms.edge_lists import verdict_columns

    verdict = np.array([[300, 0, 2, 0], [1, 1, 0, 7]], np.int32)
    valid = np.array([[True, True, True, False], [True, True, True, True]])
    cols, ranks = verdict_columns(np, verdict, valid, False, 4, NO_LAMBDA)
    assert cols.tolist() == [[1, 2, 0, -1], [2, 0, 1, 3]]
    assert ranks.tolist() == [[0, 2, NO_LAMBDA - 1, NO_LAMBDA], [0, 1, 1, 7]]


def test_a_larger_alpha_keeps_more():
    table, cands, keys = _candidate_lists(np.random.default_rng(2), "l2")
    kept = [diversify(cands, keys, table, L2, DiversifyRule("gd", a)).sum() for a in (1.0, 1.2, 1.5)]
    assert kept[0] < kept[1] < kept[2]


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_occlusion_factors_count_every_closer_occluder(metric):
    table, cands, keys = _candidate_lists(np.random.default_rng(3), metric)
    lam = diversify(cands, keys, table, metric_of(metric), DiversifyRule("occlusion"))
    for r in range(len(cands)):
        valid = np.flatnonzero(cands[r] >= 0)
        for j in valid:
            want = sum(_occludes(table, r, cands[r, i], cands[r, j], metric, 1.0, "gd") for i in valid if i != j)
            assert lam[r, j] == want, (r, j)
    assert lam.max() > 1


@pytest.mark.parametrize("impl", [reach_back, diversify_kernels.reach_back], ids=["reference", "compiled"])
def test_reach_back_finds_exactly_the_two_hop_paths_inside_the_sphere(impl):
    rng = np.random.default_rng(4)
    n, w = 60, 5
    table = rng.normal(size=(n, 3)).astype(np.float32)
    lists = np.stack([rng.choice(n, size=w, replace=False) for _ in range(n)]).astype(np.int64)
    lists[::7, -2:] = EMPTY
    list_index = lists.copy()  # the table holds every row at its global id
    x = rng.integers(0, n, 400)
    z = rng.integers(0, n, 400)
    got = impl(table, lists, list_index, x, z, z)
    for t in range(len(x)):
        xv, zv = table[x[t]].astype(np.float64), table[z[t]].astype(np.float64)
        qm = zv + SYM_MIDPOINT * (xv - zv)
        radius = ((xv - qm) ** 2).sum()
        want = z[t] in lists[x[t]] or any(
            a >= 0 and ((table[a] - qm) ** 2).sum() < radius and z[t] in lists[a] for a in lists[x[t]])
        assert got[t] == want, t
    assert 0 < got.sum() < len(got)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.float16])
def test_compiled_reach_back_is_the_reference_where_the_table_holds_some_rows(dtype):
    """Table rows are not global ids: lists hold global ids, list_index the table row of each entry (EMPTY where
    the table lacks it), z_ids the requests' global ids; odd sizes, EMPTY tails."""
    rng = np.random.default_rng(11)
    n, m, w, dim = 500, 301, 9, 13
    table = (rng.integers(0, 40, size=(m, dim)) if dtype == np.uint8 else rng.normal(size=(m, dim))).astype(dtype)
    glob = rng.permutation(n)[:m]  # the global id of each table row
    row_of = np.full(n, EMPTY, np.int64)
    row_of[glob] = np.arange(m)
    lists = np.stack([rng.choice(n, size=w, replace=False) for _ in range(m)]).astype(np.int64)
    lists[::5, -3:] = EMPTY
    list_index = np.where(lists >= 0, row_of[np.maximum(lists, 0)], EMPTY)
    x, z = rng.integers(0, m, 3001), rng.integers(0, m, 3001)
    want = reach_back(table, lists, list_index, x, z, glob[z])
    got = diversify_kernels.reach_back(table, lists, list_index, x, z, glob[z])
    np.testing.assert_array_equal(got, want)
    assert 0 < got.sum() < len(got)


# ---- a pruned store --------------------------------------------------------------------------
ROWS, DIM, K = 3000, 12, 24


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(20, DIM))[rng.integers(0, 20, ROWS)] * 1.5 + rng.normal(size=(ROWS, DIM))).astype(np.float32)
    path = tmp_path_factory.mktemp("prune") / "s.knn"
    bigknn.build(x, k=K, store=path, backend="cpu", shard_rows=1000).close()
    return path, x


@pytest.mark.parametrize("method", ["tsdg", "rng"])
def test_prune_commits_a_search_graph_and_keeps_the_knn_graph(store, method):
    path, x = store
    knn = _files(path)
    with bigknn.open(path) as g:
        r = g.prune(method, degree=16, backend="cpu")
        ids, _ = g.neighbors()
    assert {f: h for f, h in _files(path).items() if f != "manifest.json" and f != "zarr.json"} == \
        {f: h for f, h in knn.items() if f != "manifest.json" and f != "zarr.json"}
    m = read_manifest(path)
    assert m["format"] >= SEARCH_SINCE and m["search"]["version"] == r.version and m["search"]["method"] == method
    with bigknn.open(path) as g:
        assert g.info.search == m["search"] and g.info.format == m["format"]
    st = Store.open(path)
    index, entry = load_index(st, L2)
    st.close()
    assert index.ids.shape == (ROWS, 16) and entry.degree == 16
    valid = index.ids >= 0
    assert r.edges == int(valid.sum()) and 0 < r.mean_degree <= 16
    assert (valid[:, :-1] | ~valid[:, 1:]).all()  # EMPTY only at the end
    assert not (index.ids == np.arange(ROWS)[:, None]).any()  # no self-loops
    srt = np.sort(np.where(valid, index.ids, -np.arange(1, 17)), axis=1)
    assert not (srt[:, 1:] == srt[:, :-1]).any()  # no repeats
    assert (index.lambdas[~valid] == NO_LAMBDA).all()
    if method == "tsdg":
        lam = index.lambdas.astype(int)
        assert (lam[valid] <= 9).all() and (np.diff(np.where(valid, lam, 99), axis=1) >= 0).all()
    else:
        assert (index.lambdas[valid] == 0).all() and r.symmetric_links > 0
        # every forward edge left is one the RNG rule keeps in the row's kNN list
        keys = ((x[:, None, :] - x[ids]) ** 2).sum(-1)
        kept = diversify(ids.astype(np.int64), keys, x, L2, DiversifyRule("rng")).astype(bool)
        forward = np.zeros((ROWS, ROWS), bool)
        forward[np.repeat(np.arange(ROWS), K)[kept.ravel()], ids[kept]] = True
        in_knn = np.zeros((ROWS, ROWS), bool)
        in_knn[np.repeat(np.arange(ROWS), K), ids.ravel()] = True
        rows = np.repeat(np.arange(ROWS), 16)[valid.ravel()]
        edges = index.ids[valid]
        # an edge is a forward edge the rule kept, or a symmetric link (its reverse is a kept forward edge)
        assert (forward[rows, edges] | forward[edges, rows]).all()
        assert not (in_knn[rows, edges] & ~forward[rows, edges] & ~forward[edges, rows]).any()


@pytest.mark.parametrize("method", ["tsdg", "rng"])
def test_out_of_core_prune_gives_the_same_graph(store, method):
    """With host memory for no whole copy of the rows, each step reads the rows it names from the store, shard
    by shard; with enough, tsdg runs both stages on the whole graph at once (algorithms/tsdg_whole.py): the same graph."""
    path, _ = store
    graphs = []
    for host_mem in (None, 1):
        with bigknn.open(path) as g:
            g.prune(method, degree=16, backend="cpu", host_mem=host_mem)
        graphs.append(stored_index(path))
    np.testing.assert_array_equal(graphs[0].ids, graphs[1].ids)
    np.testing.assert_array_equal(graphs[0].lambdas, graphs[1].lambdas)


def test_verify_checks_the_search_graph_and_repair_drops_a_damaged_one(tmp_path):
    path = tmp_path / "v.knn"
    x = np.random.default_rng(8).normal(size=(700, 5)).astype(np.float32)
    with bigknn.build(x, k=8, store=path, backend="cpu") as g:
        r = g.prune(degree=8, backend="cpu")
    st = Store.open(path)
    clean = verify(st)
    st.close()
    assert clean["ok"] and clean["arrays"] == 5  # vectors, graph ids and dists, and the search graph's two
    chunk = next((path / "search" / str(r.version) / "shards" / "0" / "lambdas").rglob("c/*/*"))
    flip_byte(chunk)
    st = Store.open(path)
    damaged = verify(st)
    st.close()
    assert not damaged["ok"] and "search graph" in damaged["damaged"][0]["what"]
    assert damaged["repair"][-1] == f"bigknn prune {path}"
    repaired = repair(path)
    assert repaired["repaired"] == [f"dropped search graph version {r.version}"]
    assert read_manifest(path)["search"] is None
    with bigknn.open(path) as g:
        with pytest.raises(BadInput, match="bigknn prune"):
            g.search(x[:2], backend="cpu")
        g.prune(degree=8, backend="cpu")
        assert g.search(x[:2], k=1, backend="cpu").ids[:, 0].tolist() == [0, 1]


def test_a_failed_prune_leaves_the_store_as_it_was(store, monkeypatch):
    path, _ = store
    with bigknn.open(path) as g:
        g.prune("tsdg", degree=16, backend="cpu")
    before = _files(path, skip="-")
    calls = []
    real = Store.write_search

    def fail_late(self, *args):  # after the first shard's arrays are written
        calls.append(1)
        if len(calls) > 2:
            raise RuntimeError("device lost")
        return real(self, *args)

    monkeypatch.setattr(Store, "write_search", fail_late)
    with bigknn.open(path) as g, pytest.raises(RuntimeError, match="device lost"):
        g.prune("tsdg", degree=12, backend="cpu")
    assert _files(path, skip="-") == before
    with bigknn.open(path) as g:  # the committed search graph still serves
        assert g.search(np.zeros((1, DIM), np.float32), backend="cpu").ids.shape == (1, 10)


def test_a_killed_prune_leaves_the_last_commit_and_its_leftovers_are_dropped(store):
    path, _ = store
    with bigknn.open(path) as g:
        g.prune("rng", degree=16, backend="cpu")
    knn = _files(path)
    committed = read_manifest(path)["search"]
    proc = subprocess.Popen([sys.executable, "-m", "bigknn", "prune", str(path), "--degree", "20", "--backend", "cpu",
                             "--json"], env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    version_dir = path / "search" / str(committed["version"] + 1)
    while not version_dir.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _files(path) == knn or \
        read_manifest(path)["search"]["version"] == committed["version"] + 1  # killed after its commit
    m = read_manifest(path)
    st = Store.open(path)
    index, entry = load_index(st, L2)  # whichever commit stands, it reads whole
    st.close()
    assert entry.version == m["search"]["version"] and index.ids.shape[0] == ROWS
    with bigknn.open(path) as g:  # the next prune takes a fresh version and drops what the killed one left
        r = g.prune("rng", degree=16, backend="cpu")
    assert r.version > committed["version"] + 1
    on_disk = {int(p.name) for p in (path / "search").iterdir() if p.name.isdigit()}
    assert on_disk == {m["search"]["version"], r.version}
