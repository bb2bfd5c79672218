"""Leiden (leidenalg on igraph) on bigknn's mutual kNN graph, checked against leidenalg's own result on the
exact mutual graph built without bigknn: the same edges give the same partition, and its communities never
mix the planted blobs. Runs where the optional extra is installed (pip install 'bigknn[leiden]'); skipped, saying so, where not."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import bigknn

WHY = "leidenalg and igraph are not installed (pip install 'bigknn[leiden]'): Leiden on the mutual graph is not checked"
leidenalg = pytest.importorskip("leidenalg", reason=WHY)
igraph = pytest.importorskip("igraph", reason=WHY)


def blobs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Four blobs of 200 rows in 8-d, apart but for a few rows, and their labels."""
    rng = np.random.default_rng(seed)
    truth = np.repeat(np.arange(4), 200)
    centres = rng.normal(scale=6.0, size=(4, 8))
    return (centres[truth] + rng.normal(size=(len(truth), 8))).astype(np.float32), truth


def exact_mutual(x: np.ndarray, k: int) -> sp.csr_matrix:
    """The mutual k-NN graph with Euclidean distances, by brute force in float64."""
    d = np.sqrt(((x[:, None, :].astype(np.float64) - x[None, :, :]) ** 2).sum(-1))
    np.fill_diagonal(d, np.inf)
    listed = np.zeros(d.shape, bool)
    listed[np.repeat(np.arange(len(x)), k), np.argsort(d, axis=1)[:, :k].ravel()] = True
    both = listed & listed.T
    return sp.csr_matrix(np.where(both, d, 0.0))


def purity(truth: np.ndarray, membership: np.ndarray) -> float:
    """The share of rows whose community's most common planted label is theirs (1.0: no community mixes blobs)."""
    return sum(np.bincount(truth[membership == c]).max() for c in np.unique(membership)) / len(truth)


def leiden(graph: sp.csr_matrix, weighted: bool) -> np.ndarray:
    """leidenalg's modularity partition (seed 0) of the symmetric ``graph``'s upper triangle."""
    upper = sp.triu(graph, k=1).tocoo()
    g = igraph.Graph(n=graph.shape[0], edges=list(zip(upper.row.tolist(), upper.col.tolist())))
    weights = upper.data.tolist() if weighted else None
    return np.array(leidenalg.find_partition(g, leidenalg.ModularityVertexPartition, weights=weights,
                                             seed=0).membership)


def test_leiden_on_the_mutual_graph_is_leidens_result_on_the_exact_mutual_graph():
    x, truth = blobs(seed=2)
    with bigknn.build(x, k=10, backend="cpu") as g:  # under 2048 rows: one shard, the exact graph
        ours = g.symmetric("mutual")
        connectivities = g.symmetric("mutual", weights="umap")
    want = exact_mutual(x, 10)
    np.testing.assert_array_equal(ours.indptr, want.indptr)
    np.testing.assert_array_equal(ours.indices, want.indices)
    np.testing.assert_allclose(ours.data, want.data, rtol=1e-5)
    membership = leiden(ours, weighted=False)
    np.testing.assert_array_equal(membership, leiden(want, weighted=False))
    assert purity(truth, membership) == 1.0
    assert np.sort(np.bincount(membership))[-4:].sum() >= 0.9 * len(x)  # the blobs, less the mutual graph's isolated rows
    assert purity(truth, leiden(connectivities, weighted=True)) == 1.0  # UMAP's weights: blobs split finer, never mixed
