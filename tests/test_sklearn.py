"""KNNGraphTransformer against scikit-learn's own KNeighborsTransformer, in Pipelines before the estimators
that take precomputed sparse graphs, and Graph.umap_knn() in UMAP (when umap-learn is installed)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.cluster import DBSCAN, HDBSCAN
from sklearn.manifold import TSNE, Isomap, trustworthiness
from sklearn.neighbors import KNeighborsTransformer, NearestNeighbors
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer

import bigknn
from bigknn import KNNGraphTransformer
from bigknn.core.synth import synth


def row_lists(m) -> np.ndarray:
    """The column indices of a CSR graph with the same number of entries in every row, row by row."""
    counts = np.diff(m.indptr)
    assert np.all(counts == counts[0])
    return m.indices.reshape(m.shape[0], counts[0])


def test_fit_transform_is_sklearns_graph_up_to_recall():
    x = synth(3000, 16, seed=12)  # one shard past the exact-graph size: NN-descent, an approximate graph
    ours = KNNGraphTransformer(n_neighbors=10, backend="cpu").fit_transform(x)
    ref = KNeighborsTransformer(mode="distance", n_neighbors=10).fit_transform(x)
    assert ours.format == ref.format == "csr" and ours.shape == ref.shape == (3000, 3000)
    assert np.all(np.diff(ours.indptr) == 11) and np.all(np.diff(ref.indptr) == 11), "self + n_neighbors per row"
    assert np.all(ours.diagonal() == 0) and np.all(row_lists(ours)[:, 0] == np.arange(3000)), "self first, stored"
    data = ours.data.reshape(3000, 11)
    assert np.all(np.diff(data, axis=1) >= 0), "rows not nearest first (sklearn's precomputed-graph checks)"
    a, b = row_lists(ours), row_lists(ref)
    recall = np.mean([len(np.intersect1d(a[i], b[i])) / 11 for i in range(3000)])
    assert recall >= 0.99, recall
    rows = np.repeat(np.arange(3000), 11)
    true = np.linalg.norm(x[rows] - x[ours.indices], axis=1)
    np.testing.assert_allclose(ours.data, true, rtol=1e-4, atol=1e-4)


def test_transform_of_new_rows_is_sklearns_exactly():
    x, q = synth(1000, 8, seed=13), synth(100, 8, seed=14)
    ours = KNNGraphTransformer(n_neighbors=6, backend="cpu").fit(x).transform(q)
    ref = KNeighborsTransformer(mode="distance", n_neighbors=6).fit(x).transform(q)
    assert ours.shape == ref.shape == (100, 1000)
    np.testing.assert_array_equal(row_lists(ours), row_lists(ref))
    np.testing.assert_allclose(ours.data, ref.data, rtol=1e-4, atol=1e-5)


def test_parameters_follow_the_estimator_contract():
    t = clone(KNNGraphTransformer(n_neighbors=7, metric="cosine"))
    assert t.get_params()["n_neighbors"] == 7 and t.get_params()["metric"] == "cosine"
    with pytest.raises(ValueError, match="mode"):
        KNNGraphTransformer(mode="connectivity").fit(synth(100, 4))


def symmetric(g):
    """HDBSCAN wants a symmetric distance matrix; a k-NN graph is not (sklearn's own transformer's either)."""
    return g.maximum(g.T)


def blobs(rows: int, seed: int) -> np.ndarray:
    """Three overlapping 3-d Gaussian blobs: density clusterings find them, and the k-NN graph is connected
    (Isomap and HDBSCAN refuse a graph of several components)."""
    rng = np.random.default_rng(seed)
    centres = np.zeros((3, 3))
    centres[:, 0] = [0.0, 5.0, 10.0]
    return (centres[rng.integers(0, 3, rows)] + rng.normal(size=(rows, 3))).astype(np.float32)


# an exact-size input (under 2048 rows bigknn's graph is exact), so the downstream results must be sklearn's
PIPELINES = {
    "isomap": [Isomap(n_neighbors=15, n_components=2, metric="precomputed", eigen_solver="dense")],
    "dbscan": [DBSCAN(metric="precomputed", eps=0.7, min_samples=5)],
    "hdbscan": [FunctionTransformer(symmetric, accept_sparse=True), HDBSCAN(metric="precomputed", min_samples=5,
                                                                             copy=True)],
}


@pytest.mark.parametrize("name", PIPELINES)
def test_pipeline_gives_what_it_gives_with_sklearns_transformer(name):
    x = blobs(600, seed=15)
    ours = make_pipeline(KNNGraphTransformer(n_neighbors=15, backend="cpu"), *map(clone, PIPELINES[name]))
    ref = make_pipeline(KNeighborsTransformer(mode="distance", n_neighbors=15), *map(clone, PIPELINES[name]))
    if name == "isomap":
        np.testing.assert_allclose(ours.fit_transform(x), ref.fit_transform(x), atol=1e-4)
    else:
        labels = ours.fit_predict(x)
        assert len(set(labels) - {-1}) >= 3, "the blobs are not found: the comparison would prove little"
        np.testing.assert_array_equal(labels, ref.fit_predict(x))


def test_tsne_pipeline_keeps_neighbourhoods():
    x = blobs(400, seed=16)
    pipe = make_pipeline(KNNGraphTransformer(n_neighbors=13, backend="cpu"),
                         TSNE(metric="precomputed", perplexity=4, init="random", random_state=0, max_iter=250))
    assert trustworthiness(x, pipe.fit_transform(x), n_neighbors=10) >= 0.9


def test_umap_on_umap_knn_is_as_trustworthy_as_on_exact_neighbours():
    """UMAP computes exact neighbours itself below 4096 rows, one Python distance call per pair (over a
    minute here); the same exact lists come from scikit-learn, and UMAP is given them the same way."""
    umap = pytest.importorskip("umap", reason="umap-learn is not installed (pip install 'bigknn[umap]')")
    x = synth(3000, 16, seed=1)
    with bigknn.build(x, k=15, backend="cpu", shard_rows=1000) as g:  # merged shards: approximate lists
        knn = g.umap_knn(n_neighbors=15)
    exact = NearestNeighbors(n_neighbors=15).fit(x).kneighbors(x)[::-1]  # (ids, distances), self first
    assert np.mean(knn.ids != exact[0]) > 0, "the graph is exact: the comparison would prove nothing"
    scores = {}
    for name, precomputed in (("bigknn", tuple(knn)), ("exact", exact)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no NNDescent index with the lists: UMAP.transform unavailable
            emb = umap.UMAP(n_neighbors=15, n_epochs=100, random_state=0, precomputed_knn=precomputed).fit_transform(x)
        scores[name] = trustworthiness(x, emb, n_neighbors=10)
    print("UMAP trustworthiness@10:", scores)
    assert scores["bigknn"] >= scores["exact"] - 0.005 and scores["bigknn"] >= 0.95, scores
