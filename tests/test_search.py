"""``bigknn search``, ``bigknn truth`` and ``bigknn eval search`` on the CPU: recall of both procedures on both
search graphs, determinism across batch sizes, the command line end to end, and refusals of bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bigknn
from bigknn.formats import read_truth, write_truth, write_vectors
from bigknn.core.metric import metric as metric_of

from conftest import (assert_one_line_error, clustered, pruned_store, run_cli, run_json, search_set, stored_index,
                      tree_hashes)

ROWS, QUERIES, DIM, K = 4000, 150, 16, 32


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    """A clustered base set built and pruned both ways (a copy each), held-out queries and their truth."""
    d = search_set(tmp_path_factory.mktemp("search"), seed=0, clusters=25, spread=1.5, dim=DIM, rows=ROWS,
                   queries=QUERIES)
    stores = {method: pruned_store(d["dir"] / f"{method}.knn", d["x"], k=K, degree=24, shard_rows=1500,
                                   method=method) for method in ("tsdg", "rng")}
    return {**d, "stores": stores}


def _true_ids(x: np.ndarray, q: np.ndarray, k: int = 10) -> np.ndarray:
    keys = ((q[:, None, :] - x[None]) ** 2).sum(-1)
    return np.argsort(keys, axis=1, kind="stable")[:, :k]


def _recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found.tolist(), truth.tolist())]))


@pytest.mark.parametrize("method", ["tsdg", "rng"])
@pytest.mark.parametrize("procedure,budget,batch", [("large", 32, None), ("small", 16, 1)])
def test_search_recall_on_the_cpu(data, method, procedure, budget, batch):
    truth = _true_ids(data["x"], data["q"])
    with bigknn.open(data["stores"][method]) as g:
        found = g.search(data["q"], k=10, budget=budget, batch=batch, procedure=procedure, backend="cpu")
    assert found.ids.shape == (QUERIES, 10) and found.report.procedure == procedure
    assert _recall(found.ids, truth) >= 0.95
    want = np.sqrt(((data["q"][:, None, :] - data["x"][found.ids]) ** 2).sum(-1))
    np.testing.assert_allclose(found.distances, want, rtol=1e-4, atol=1e-4)
    assert (np.diff(found.distances, axis=1) >= 0).all()


def test_more_budget_finds_more_and_results_do_not_depend_on_the_batch(data, monkeypatch):
    import bigknn.algorithms.search_index as search_graph

    monkeypatch.setattr(search_graph, "ENTRY_SAMPLE", 4)  # 4 seeds: the budget, not the start, finds rows
    truth = _true_ids(data["x"], data["q"])
    with bigknn.open(data["stores"]["tsdg"]) as g:
        one = g.search(data["q"], budget=1, batch=1, procedure="small", backend="cpu")
        wide = g.search(data["q"], budget=8, batch=1, procedure="small", backend="cpu")
        together = g.search(data["q"], budget=8, batch=64, procedure="small", backend="cpu")
        short = g.search(data["q"], budget=10, procedure="large", backend="cpu")
        long = g.search(data["q"], budget=32, batch=50, procedure="large", backend="cpu")
    assert _recall(one.ids, truth) < _recall(wide.ids, truth)
    assert _recall(short.ids, truth) < _recall(long.ids, truth)
    np.testing.assert_array_equal(wide.ids, together.ids)


def test_cli_truth_search_and_sweep(data):
    d, store = data["dir"], data["stores"]["rng"]
    t = run_json("truth", store, "--queries", d / "q.fbin", "-o", d / "gt.ibin", "--backend", "cpu")
    gt, _ = read_truth(d / "gt.ibin")
    assert t["queries"] == QUERIES and gt.shape == (QUERIES, 10)
    np.testing.assert_array_equal(gt, _true_ids(data["x"], data["q"]))
    s = run_json("search", store, "--queries", d / "q.fbin", "-o", d / "found.ibin", "--backend", "cpu")
    found, dist = read_truth(d / "found.ibin")
    assert s["out"] == str(d / "found.ibin") and found.shape == (QUERIES, 10) and s["qps"] > 0
    assert _recall(found, gt) >= 0.95
    sweep = run_json("eval", "search", store, "--queries", d / "q.fbin", "--truth", d / "gt.ibin", "--budgets",
                     "10,32", "--backend", "cpu", "--plot", d / "curve.png")
    assert [p["budget"] for p in sweep["points"]] == [10, 32] and sweep["procedure"] == "large"
    assert sweep["points"][0]["recall"] <= sweep["points"][1]["recall"] and sweep["points"][1]["recall"] >= 0.95
    assert (d / "curve.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_input_is_refused_in_one_line_with_nothing_written(data, tmp_path):
    d, store = data["dir"], data["stores"]["tsdg"]
    write_vectors(tmp_path / "q8.fbin", np.zeros((3, 8), np.float32))
    before = {f: h for f, h in tree_hashes(store).items() if not f.startswith((".readers/", ".lock"))}
    out = tmp_path / "o.ibin"
    cases = [
        (["search", store, "--queries", tmp_path / "q8.fbin", "-o", out], ["q8.fbin", "dim 8"]),
        (["search", store, "--queries", d / "q.fbin", "-o", tmp_path / "o.txt"], ["o.txt", ".ibin"]),
        (["search", store, "--queries", d / "q.fbin", "-o", out, "--k", "40"], ["--k 40"]),
        (["search", store, "--queries", d / "q.fbin", "-o", out, "--procedure", "small", "--budget", "0.5"],
         ["--budget 0.5"]),
        (["truth", store, "--queries", tmp_path / "missing.fbin", "-o", out], ["missing.fbin"]),
        (["prune", store, "--degree", "500"], ["--degree 500"]),
        (["prune", store, "--alpha", "0.9"], ["--alpha 0.9"]),
        (["eval", "search", store, "--queries", d / "q.fbin", "--truth", tmp_path / "short.ibin"], ["short.ibin"]),
    ]
    write_truth(tmp_path / "short.ibin", np.zeros((QUERIES - 1, 10), np.int32), np.zeros((QUERIES - 1, 10), np.float32))
    for args, names in cases:
        assert_one_line_error(*run_cli(*args, "--backend", "cpu"), *names)
        assert not out.exists() and not (tmp_path / "o.txt").exists()
    assert {f: h for f, h in tree_hashes(store).items() if not f.startswith((".readers/", ".lock"))} == before


def test_search_before_prune_and_after_an_ingest_is_refused(tmp_path):
    rng = np.random.default_rng(5)
    path = tmp_path / "s.knn"
    x = rng.normal(size=(600, 6)).astype(np.float32)
    write_vectors(tmp_path / "q.fbin", x[:3])
    with bigknn.build(x, k=8, store=path, backend="cpu") as g:
        pass
    args = ["search", path, "--queries", tmp_path / "q.fbin", "-o", tmp_path / "o.ibin", "--backend", "cpu"]
    assert_one_line_error(*run_cli(*args), "s.knn", "bigknn prune")
    with bigknn.open(path) as g:
        g.prune(degree=8, backend="cpu")
        g.ingest(rng.normal(size=(100, 6)).astype(np.float32), backend="cpu")
    assert_one_line_error(*run_cli(*args), "s.knn", "bigknn prune")
    assert not (tmp_path / "o.ibin").exists()
    assert json.loads((path / "manifest.json").read_text())["search"]["rows"] == 600


def _search_separated_clusters(tmp_path, seed: int, queries: int):
    """3,000 rows in 30 clusters 8 sigma apart (no kNN edge between them), built, pruned (tsdg) and searched with
    list length 10 on the CPU: (rows, queries, centres, what the search found)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(30, 8)) * 8
    x, q = clustered(rng, centres, 3000), clustered(rng, centres, queries)
    with bigknn.open(pruned_store(tmp_path / "s.knn", x, k=16, degree=16)) as g:
        return x, q, centres, g.search(q, k=10, budget=10, procedure="large", backend="cpu")


def test_searches_start_in_the_query_cluster_of_a_disconnected_graph(tmp_path, monkeypatch):
    """Clusters 8 sigma apart: the kNN graph has no edge between them, so a search finds a query's neighbours
    only from an entry in its cluster (the paper's best of 32 random rows of 30 clusters misses it in
    (29/30)^32 = 34 % of queries)."""
    import bigknn.algorithms.search_index as search_graph

    monkeypatch.setattr(search_graph, "ENTRY_SAMPLE", 300)  # a sample, not every row
    x, q, _, found = _search_separated_clusters(tmp_path, 7, 60)
    assert _recall(found.ids, _true_ids(x, q)) >= 0.95


def test_a_cluster_the_entry_sample_misses_is_still_searched_from_inside(tmp_path, monkeypatch):
    """Clusters 8 sigma apart with an entry sample of 24 rows: about 13 of the 30 clusters hold no sample row,
    and their queries find their neighbours only because the rows the graph is reachable from (its roots) join
    the entry rows."""
    import bigknn.algorithms.search_index as search_graph

    monkeypatch.setattr(search_graph, "ENTRY_SAMPLE", 24)
    x, q, centres, found = _search_separated_clusters(tmp_path, 8, 90)
    cluster = np.argmin(((x[:, None] - centres[None]) ** 2).sum(-1), axis=1)
    sampled = set(cluster[search_graph.entry_sample(0, len(x))].tolist())
    assert len(sampled) <= 22  # the sample misses clusters: without the roots, their queries fail
    assert _recall(found.ids, _true_ids(x, q)) >= 0.95


def test_every_row_is_reachable_from_the_roots():
    """reach.roots against scipy's breadth-first search: every row reached from the roots over the edges a
    search visits, and no root reached from the roots before it (each is needed when it is taken)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import breadth_first_order

    from bigknn.algorithms.reach import roots

    rng = np.random.default_rng(12)
    n, deg = 700, 3
    ids = np.where(rng.random((n, deg)) < 0.7, rng.integers(0, n, (n, deg)), -1).astype(np.int32)
    ids[::7] = -1  # rows no edge leaves
    lambdas = rng.integers(0, 8, (n, deg)).astype(np.uint8)
    got = roots(ids, lambdas, 5)
    edge = (ids >= 0) & (lambdas < 5)
    graph = csr_matrix((np.ones(edge.sum()), (np.nonzero(edge)[0], ids[edge])), shape=(n, n))
    reached = np.zeros(n, bool)
    for r in got:
        assert not reached[r]
        reached[breadth_first_order(graph, r, return_predecessors=False)] = True
    assert reached.all() and 1 < len(got) < n and got[0] == 0 and (np.diff(got) > 0).all()
    ring = np.roll(np.arange(n, dtype=np.int32), -1)[:, None]
    np.testing.assert_array_equal(roots(ring, np.zeros((n, 1), np.uint8), 5), [0])  # a cycle: row 0 alone
    np.testing.assert_array_equal(roots(ring, np.full((n, 1), 5, np.uint8), 5), np.arange(n))  # none visited


def test_entry_points_are_the_sample_rows_nearest_each_query():
    from bigknn.algorithms.search_index import entry_sample, nearest_entries

    rng = np.random.default_rng(9)
    x, q = rng.normal(size=(9000, 6)).astype(np.float32), rng.normal(size=(20, 6)).astype(np.float32)
    sample = entry_sample(3, len(x))
    assert len(sample) > 3000 and (np.diff(sample) > 0).all() and sample[-1] < len(x)
    assert not np.array_equal(sample, entry_sample(4, len(x)))  # the seed draws the sample
    for metric, keys in (("l2", ((q[:, None] - x[sample][None]) ** 2).sum(-1)), ("ip", -(q @ x[sample].T))):
        got = nearest_entries(np, x[sample], sample, q, metric_of(metric))
        np.testing.assert_array_equal(got, sample[np.argsort(keys, axis=1)[:, :32]])


def test_wide_rows_are_walked_as_halves_and_reranked_in_float32(tmp_path, monkeypatch):
    """Rows WALK_HALF_MIN_DIM wide are walked as scaled halves (half the bytes a key reads); the list's first
    RERANK are re-keyed in float32: the distances returned are the exact float32 ones, ascending, and recall is
    that of the float32 walk."""
    import bigknn.algorithms.search_index as search_graph
    from bigknn.backends.cpu.graph_search import query_keys, search
    from bigknn.core.metric import pairwise_keys
    from bigknn.algorithms.search_index import SearchIndex
    from bigknn.algorithms.search_params import SearchPlan

    rng = np.random.default_rng(11)
    centres = rng.normal(size=(20, 264)) * 2
    x, q = clustered(rng, centres, 4000) * 1000, clustered(rng, centres, 200) * 1000  # scaled
    index = stored_index(pruned_store(tmp_path / "s.knn", x, k=20, degree=20))
    truth = np.argsort(pairwise_keys(q, x, "l2"), axis=1)[:, :10]
    plan = SearchPlan("large", 24, 10, seed=1)
    recall = {}
    for half in (True, False):
        monkeypatch.setattr(search_graph, "WALK_HALF_MIN_DIM", 256 if half else 10 ** 9)
        idx = SearchIndex(index.vectors, index.ids, index.lambdas, index.metric)
        assert (idx.walk is not None) == half
        found = search(idx, q, plan)
        np.testing.assert_allclose(found.dists, query_keys(idx, q, found.ids.astype(np.int64)), rtol=1e-6)
        assert (np.diff(found.dists, axis=1) >= 0).all()
        recall[half] = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found.ids, truth)])
    assert recall[True] >= recall[False] - 0.01, recall
    assert recall[False] > 0.9
