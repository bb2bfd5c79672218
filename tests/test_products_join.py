"""The join of a mutual-reachability graph's components (bigknn/products/join.py): the same graph as a
brute-force reference (the union graph's reachability plus the minimum spanning tree of the components, each
edge the cheapest pair between two components) on small stores, and, on many separated clusters, a scan that
measures a small fraction of the row pairs the full scan did (work counted, not timed)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse import csgraph

import bigknn
from bigknn.products import join


def separated(rows: int, clusters: int, dim: int, seed: int, spread: float = 60.0) -> np.ndarray:
    """Unit-variance blobs with centres uniform in a cube of side 2 * ``spread``: a k-NN graph of many components."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-spread, spread, size=(clusters, dim))
    return (centres[rng.integers(0, clusters, rows)] + rng.normal(size=(rows, dim))).astype(np.float32)


def brute_force_joined(x: np.ndarray, plain: sp.csr_matrix, core: np.ndarray, metric: str) -> sp.csr_matrix:
    """The union graph weighted max(core_a, core_b, d), plus for each edge of the minimum spanning tree of the
    components (weighted by their cheapest cross pair, every pair measured) that cheapest pair."""
    x = x.astype(np.float64)
    if metric == "cosine":
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        d = np.maximum(1.0 - x @ x.T, 0.0)
    else:
        d = np.sqrt(np.maximum(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1), 0.0))
    reach = np.maximum(np.maximum(core[:, None], core[None, :]), d)
    graph = plain.tocoo()
    graph = sp.csr_matrix((np.maximum(np.maximum(core[graph.row], core[graph.col]), graph.data),
                           (graph.row, graph.col)), shape=plain.shape)
    count, labels = csgraph.connected_components(plain, directed=False)
    between = np.zeros((count, count))
    pair = {}
    for i in range(count):
        for j in range(i + 1, count):
            a, b = np.nonzero(labels == i)[0], np.nonzero(labels == j)[0]
            block = reach[np.ix_(a, b)]
            r, c = np.unravel_index(np.argmin(block), block.shape)
            between[i, j], pair[i, j] = block[r, c], (a[r], b[c])
    tree = csgraph.minimum_spanning_tree(between).tocoo()
    ends = np.array([pair[min(i, j), max(i, j)] for i, j in zip(tree.row, tree.col)]).reshape(-1, 2)
    w = reach[ends[:, 0], ends[:, 1]]
    links = sp.csr_matrix((np.concatenate([w, w]), (np.concatenate([ends[:, 0], ends[:, 1]]),
                                                    np.concatenate([ends[:, 1], ends[:, 0]]))), shape=plain.shape)
    out = (graph + links).tocsr()
    out.sort_indices()
    return out


@pytest.mark.parametrize("metric, partition, clusters, leaf_rows", [
    ("l2", "contiguous", 40, join.LEAF_ROWS),    # a leaf per component
    ("l2", "contiguous", 12, 16),                # components split into many leaves
    ("cosine", "contiguous", 30, 24),            # the inner-product bound
    ("l2", "kmeans", 30, 32),            # shards of scattered input rows
])
def test_joined_graph_equals_the_brute_force_reference(tmp_path, monkeypatch, metric, partition, clusters, leaf_rows):
    monkeypatch.setattr(join, "LEAF_ROWS", leaf_rows)
    x = separated(2400, clusters, 6, seed=clusters)
    with bigknn.build(x, k=5, metric=metric, backend="cpu", shard_rows=900, partition=partition,
                      store=tmp_path / "j.knn") as g:
        plain, core = g.symmetric(), g.core_distances(4)
        got = g.mutual_reachability(4)
    assert csgraph.connected_components(plain, directed=False)[0] >= 5  # the join has work to do
    want = brute_force_joined(x, plain, core.astype(np.float64), metric)
    assert csgraph.connected_components(got, directed=False)[0] == 1
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_allclose(got.data, want.data, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_many_separated_clusters_are_joined_measuring_a_small_fraction_of_the_pairs(monkeypatch):
    """1,000 clusters in 40,000 rows: every row lies outside the largest component, so the full scan measured
    about rows^2 pairs a round (minutes here); the bounded scan measures a few neighbouring leaves per leaf."""
    measured = []
    keys = join.pairwise_keys
    monkeypatch.setattr(join, "pairwise_keys", lambda a, b, name: measured.append(len(a) * len(b)) or keys(a, b, name))
    rows = 40_000
    x = separated(rows, 1000, 8, seed=7, spread=100.0)
    with bigknn.build(x, k=8, backend="cpu") as g:
        count, labels = csgraph.connected_components(g.symmetric(), directed=False)
        got = g.mutual_reachability(5)
    assert count >= 900
    assert csgraph.connected_components(got, directed=False)[0] == 1
    assert csgraph.minimum_spanning_tree(got).nnz == rows - 1
    full_first_round = (rows - np.bincount(labels).max()) * rows  # rows outside the largest x rows
    assert sum(measured) < full_first_round / 50
