"""Graph products (issue 41) against brute-force NumPy / scipy references on small data: the symmetric and
mutual graphs with distances, UMAP's fuzzy strengths and 1s, streamed in memory and through disk buckets;
near-duplicate components; HDBSCAN's core distances and mutual reachability, with scikit-learn's HDBSCAN on
the raw rows. The CLI's outputs and the README's example: tests/test_products_cli.py."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse import csgraph
from sklearn.cluster import HDBSCAN
from sklearn.metrics import adjusted_rand_score

import bigknn
from bigknn.core.errors import BadInput

SMALL_BUDGET = 4096  # bytes: a few rows a block, so every product takes the on-disk path


def with_duplicates(rows: int, dim: int, seed: int) -> np.ndarray:
    """Gaussian rows, the first 20 repeated exactly twice more (ties at distance 0) and 10 repeated with jitter."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, dim)).astype(np.float32)
    jitter = x[20:30] + rng.normal(scale=1e-3, size=(10, dim)).astype(np.float32)
    return np.concatenate([x, x[:20], x[:20], jitter])


@pytest.fixture(scope="module", params=[1, 6])
def graph(request, tmp_path_factory):
    """An exact graph (under 2048 rows) of rows with duplicates, at k = 1 and k = 6, in a store of 3 shards."""
    x = with_duplicates(300, 5, seed=41)
    g = bigknn.build(x, k=request.param, backend="cpu", shard_rows=130,
                     store=tmp_path_factory.mktemp("p") / "g.knn")
    yield g, x
    g.close()


def dense_lists(g) -> np.ndarray:
    """The directed lists as a dense matrix: distance where row i lists j, NaN elsewhere."""
    ids, dist = g.neighbors()
    a = np.full((ids.shape[0],) * 2, np.nan, np.float32)
    a[np.repeat(np.arange(ids.shape[0]), ids.shape[1]), ids.ravel()] = dist.ravel()
    return a


def as_dense(m) -> np.ndarray:
    """A sparse matrix as dense with NaN where it holds no entry (its explicit zeros stay 0)."""
    coo = m.tocoo()
    out = np.full(m.shape, np.nan, np.float32)
    out[coo.row, coo.col] = coo.data
    return out


def reference(a: np.ndarray, mode: str) -> np.ndarray:
    """Union or mutual graph of the dense lists ``a`` with their distances."""
    both = np.fmin(a, a.T)
    present = (~np.isnan(a) | ~np.isnan(a.T)) if mode == "union" else (~np.isnan(a) & ~np.isnan(a.T))
    return np.where(present, both, np.nan)


@pytest.mark.parametrize("mode", ["union", "mutual"])
def test_symmetric_distances_and_ones_equal_the_dense_reference(graph, mode):
    g, _ = graph
    want = reference(dense_lists(g), mode)
    got = g.symmetric(mode)
    np.testing.assert_array_equal(as_dense(got), want)
    assert got.has_sorted_indices and (got != got.T).nnz == 0
    ones = as_dense(g.symmetric(mode, weights=None))
    np.testing.assert_array_equal(ones, np.where(np.isnan(want), np.nan, 1.0))


def test_union_keeps_zero_distances_of_duplicates_as_entries(graph):
    g, x = graph
    m = g.symmetric().tocoo()
    zero = m.data == 0
    assert zero.sum() >= 80  # each of the 20 triples of identical rows: two pairs at least, both ways
    assert (x[m.row[zero]] == x[m.col[zero]]).all()


def smooth_knn_dist_reference(d: np.ndarray, mean_all: float) -> tuple[np.ndarray, np.ndarray]:
    """umap-learn's smooth_knn_dist (local_connectivity 1, bandwidth 1), transcribed row by row, on lists
    that hold the row itself first at 0."""
    n_neighbors = d.shape[1]
    target = np.log2(n_neighbors)
    sigma, rho = np.zeros(len(d), np.float32), np.zeros(len(d), np.float32)
    for i, row in enumerate(d):
        positive = row[row > 0]
        rho[i] = positive[0] if len(positive) else 0.0
        lo, hi, mid = 0.0, np.inf, 1.0
        for _ in range(64):
            psum = sum(np.exp(-((row[j] - rho[i]) / mid)) if row[j] - rho[i] > 0 else 1.0
                       for j in range(1, n_neighbors))
            if abs(psum - target) < 1e-5:
                break
            if psum > target:
                hi = mid
                mid = (lo + hi) / 2
            else:
                lo = mid
                mid = mid * 2 if hi == np.inf else (lo + hi) / 2
        floor = 1e-3 * (row.mean() if rho[i] > 0 else mean_all)
        sigma[i] = max(mid, floor)
    return sigma, rho


def umap_reference(g, mode: str) -> np.ndarray:
    ids, d = g.umap_knn()
    sigma, rho = smooth_knn_dist_reference(d, float(d.mean()))
    n = len(ids)
    a = np.zeros((n, n))
    for i in range(n):
        for j in range(1, ids.shape[1]):
            shifted = d[i, j] - rho[i]
            a[i, ids[i, j]] = 1.0 if shifted <= 0 or sigma[i] == 0 else np.exp(-(shifted / sigma[i]))
    return a + a.T - a * a.T if mode == "union" else a * a.T


@pytest.mark.parametrize("mode", ["union", "mutual"])
def test_umap_weights_equal_umaps_formula(graph, mode):
    g, _ = graph
    want = umap_reference(g, mode)
    got = g.symmetric(mode, weights="umap")
    # rtol: the bisection stops within 1e-5 of its target, after a step that rounding can shift by one
    np.testing.assert_allclose(np.nan_to_num(as_dense(got), nan=0.0), want, rtol=1e-4, atol=1e-6)
    assert (got.data > 0).all() and (got != got.T).nnz == 0


def test_umap_weights_equal_umap_learns_fuzzy_simplicial_set(graph):
    umap_ = pytest.importorskip("umap.umap_", reason="umap-learn is not installed (pip install 'bigknn[umap]'): the "
                                                     "fuzzy weights are not checked against umap-learn's")
    g, x = graph
    ids, d = g.umap_knn()
    want, _, _ = umap_.fuzzy_simplicial_set(x, ids.shape[1], 0, "euclidean", knn_indices=ids, knn_dists=d)
    np.testing.assert_allclose(g.symmetric(weights="umap").toarray(), want.toarray(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("weights", ["distance", "umap", None])
def test_out_of_core_path_equals_in_memory(graph, weights, tmp_path):
    g, _ = graph
    whole = g.symmetric("union", weights)
    blocks = g.symmetric("union", weights, host_mem=SMALL_BUDGET)
    assert (whole != blocks).nnz == 0 and whole.nnz == blocks.nnz
    np.testing.assert_array_equal(whole.indices, blocks.indices)
    np.testing.assert_array_equal(whole.data, blocks.data)
    out = tmp_path / "sym.npz"
    report = g.export_symmetric(out, "union", weights, host_mem=SMALL_BUDGET)
    assert report["entries"] == whole.nnz
    written = sp.load_npz(out)
    np.testing.assert_array_equal(written.indptr, whole.indptr)
    np.testing.assert_array_equal(written.indices, whole.indices)
    np.testing.assert_array_equal(written.data, whole.data)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sym.npz"]  # the temporary buckets are gone


def test_parquet_edges_equal_the_csr(graph, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    g, _ = graph
    out = tmp_path / "mutual.parquet"
    g.export_symmetric(out, "mutual", host_mem=SMALL_BUDGET)
    t = pq.read_table(out).to_pydict()
    m = g.symmetric("mutual").tocoo()
    assert list(zip(t["row"], t["col"])) == list(zip(m.row.tolist(), m.col.tolist()))
    np.testing.assert_array_equal(np.array(t["weight"], np.float32), m.data)


def test_bucketing_drives_the_disk_path():
    """The small budget really splits the rows into blocks on disk (else the out-of-core test proves nothing)."""
    from bigknn.products.edges import Buckets, block_rows

    block = block_rows(430, 6, SMALL_BUDGET)
    with Buckets(430, block, None) as b:
        assert b.on_disk and b.count > 10


def test_union_graph_is_what_sklearn_and_umap_take_as_precomputed(graph):
    from sklearn.manifold import Isomap
    from sklearn.neighbors import NearestNeighbors

    g, x = graph
    if g.info.k < 6:
        pytest.skip("k = 1 leaves the union graph in many components, which Isomap refuses")
    m = g.symmetric()
    nn = NearestNeighbors(metric="precomputed").fit(m)
    d, _ = nn.kneighbors(m, n_neighbors=1)
    assert d.shape == (len(x), 1)
    assert Isomap(n_neighbors=5, metric="precomputed").fit_transform(m).shape == (len(x), 2)


# ---- components -------------------------------------------------------------------------------
def exact_groups(x: np.ndarray, max_distance: float) -> np.ndarray:
    """Connected components of all pairs within ``max_distance``, labelled by their lowest row."""
    d = np.sqrt(np.maximum(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1), 0))
    _, labels = csgraph.connected_components(sp.csr_matrix(d <= max_distance), directed=False)
    lowest = np.full(labels.max() + 1, len(x))
    np.minimum.at(lowest, labels, np.arange(len(x)))
    return lowest[labels]


def test_components_equal_scipys_of_the_thresholded_lists(graph):
    g, _ = graph
    a = dense_lists(g)
    for max_distance in (0.0, 0.01, 0.5):
        near = sp.csr_matrix(np.nan_to_num(a, nan=np.inf) <= max_distance)
        _, labels = csgraph.connected_components(near, directed=False)
        lowest = np.full(labels.max() + 1, len(a))
        np.minimum.at(lowest, labels, np.arange(len(a)))
        c = g.components(max_distance)
        np.testing.assert_array_equal(c.labels, lowest[labels])
        assert c.summary()["rows_removed"] == len(a) - len(np.unique(labels))


def planted_groups(seed: int, unrelated: int = 1500) -> tuple[np.ndarray, float]:
    """Groups of 2 to 50 near duplicates (jitter far under the threshold) among unrelated rows."""
    rng = np.random.default_rng(seed)
    sizes = [2, 3, 5, 8, 13, 21, 34, 50]
    centres = rng.normal(scale=10, size=(len(sizes), 16))
    groups = [c + rng.normal(scale=0.002, size=(s, 16)) for c, s in zip(centres, sizes)]
    x = np.concatenate([rng.normal(scale=10, size=(unrelated, 16)), *groups]).astype(np.float32)
    return x[rng.permutation(len(x))], 0.05


def test_dedup_of_planted_groups_equals_the_exact_components(tmp_path):
    x, max_distance = planted_groups(seed=7)
    with bigknn.build(x, k=8, backend="cpu", shard_rows=700) as g:  # k far under the largest group
        c = g.components(max_distance)
        out = tmp_path / "groups.csv"
        summary = c.write(out, keep=tmp_path / "keep.ids")
    want = exact_groups(x, max_distance)
    np.testing.assert_array_equal(c.labels, want)
    assert summary["groups"] == 8 and summary["largest_group"] == 50
    table = np.loadtxt(out, delimiter=",", skiprows=1, dtype=np.int64)
    rows, group, kept, size = table.T
    assert (group == want[rows]).all() and ((kept == 1) == (rows == group)).all()
    assert (size == np.bincount(want)[group]).all() and len(rows) == summary["rows_in_groups"]
    keep = np.loadtxt(tmp_path / "keep.ids", dtype=np.int64)
    np.testing.assert_array_equal(keep, np.unique(want))


def test_groups_parquet_and_npy_hold_the_same_rows(graph, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    g, _ = graph
    c = g.components(0.01)
    c.write(tmp_path / "g.parquet", keep=tmp_path / "keep.npy")
    c.write(tmp_path / "g.npy")
    t = pq.read_table(tmp_path / "g.parquet").to_pydict()
    n = np.load(tmp_path / "g.npy")
    for name in ("row", "group", "kept", "group_size"):
        np.testing.assert_array_equal(np.asarray(t[name]), n[name])
    assert set(n["row"]) >= set(range(20)) | set(range(300, 340))  # the exact duplicates
    np.testing.assert_array_equal(np.load(tmp_path / "keep.npy"), np.nonzero(c.kept)[0])


def test_components_refuse_a_negative_distance(graph):
    with pytest.raises(BadInput, match="max_distance"):
        graph[0].components(-1.0)


# ---- HDBSCAN ----------------------------------------------------------------------------------
def pairwise(x: np.ndarray) -> np.ndarray:
    return np.sqrt(np.maximum(((x[:, None, :].astype(np.float64) - x[None, :, :]) ** 2).sum(-1), 0))


def test_core_distances_are_the_lists_and_on_an_exact_graph_the_brute_force_ones(graph):
    g, x = graph
    k = g.info.k
    _, lists = g.neighbors()
    exact = np.sort(pairwise(x), axis=1)  # column 0: the row itself (or a duplicate), at 0
    with bigknn.build(x, k=k, backend="cpu") as one_shard:  # one shard under 2048 rows: the exact graph
        for min_samples in range(1, k + 2):
            want = lists[:, min_samples - 2] if min_samples > 1 else np.zeros(len(x))
            np.testing.assert_array_equal(g.core_distances(min_samples), want)
            np.testing.assert_allclose(one_shard.core_distances(min_samples), exact[:, min_samples - 1], atol=1e-5)
    with pytest.raises(BadInput, match=f"min_samples = {k + 2}.*k = {k}"):
        g.core_distances(k + 2)


def test_mutual_reachability_of_the_complete_graph_is_hdbscans(tmp_path):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(0, 1, (60, 3)), rng.normal(6, 1, (60, 3))]).astype(np.float32)
    min_samples = 5
    with bigknn.build(x, k=len(x) - 1, backend="cpu") as g:
        mr = g.mutual_reachability(min_samples, host_mem=SMALL_BUDGET)
    d = pairwise(x)
    core = np.sort(d, axis=1)[:, min_samples - 1]
    want = np.maximum(np.maximum(core[:, None], core[None, :]), d)
    got = as_dense(mr)
    np.fill_diagonal(want, np.nan)
    np.testing.assert_allclose(got, want, rtol=1e-5, equal_nan=True)
    ours = HDBSCAN(metric="precomputed", min_samples=1, copy=True).fit_predict(mr)
    exact = HDBSCAN(min_samples=min_samples, copy=True).fit_predict(x)
    assert len(set(exact) - {-1}) == 2
    np.testing.assert_array_equal(ours, exact)


def blobs_with_noise(rows: int, seed: int) -> np.ndarray:
    """Blobs in 8-d plus 10 % uniform background noise (the issue's acceptance set)."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-10, 10, size=(8, 8))
    clustered = centres[rng.integers(0, len(centres), int(rows * 0.9))] + rng.normal(size=(int(rows * 0.9), 8))
    noise = rng.uniform(-13, 13, size=(rows - len(clustered), 8))
    return np.concatenate([clustered, noise]).astype(np.float32)


def test_hdbscan_on_the_k32_reachability_agrees_with_hdbscan_on_the_rows():
    x = blobs_with_noise(8000, seed=5)
    with bigknn.build(x, k=32, backend="cpu") as g:
        mr = g.mutual_reachability(min_samples=10)
    assert csgraph.connected_components(mr, directed=False)[0] == 1
    ours = HDBSCAN(metric="precomputed", min_samples=1, min_cluster_size=20, copy=True).fit_predict(mr)
    exact = HDBSCAN(min_samples=10, min_cluster_size=20, copy=True).fit_predict(x)
    assert len(set(exact) - {-1}) >= 5
    assert adjusted_rand_score(exact, ours) >= 0.95


def test_disconnected_reachability_is_joined_by_the_cheapest_exact_edges_or_refused(tmp_path):
    rng = np.random.default_rng(9)
    parts = [rng.normal(c, 0.5, (80, 2)) for c in (0, 20, 45)]
    x = np.concatenate(parts).astype(np.float32)
    with bigknn.build(x, k=5, backend="cpu", store=tmp_path / "d.knn") as g:
        with pytest.raises(BadInput, match="has 3 components"):
            g.mutual_reachability(4, join=False)
        mr = g.mutual_reachability(4)
        core = g.core_distances(4)
        plain = g.symmetric()
    assert csgraph.connected_components(mr, directed=False)[0] == 1
    added = (mr - plain.maximum(0)).tocoo()
    links = {(min(r, c), max(r, c)) for r, c in zip(added.row, added.col) if plain[r, c] == 0 and r != c
             and (r // 80) != (c // 80)}
    assert len(links) == 2  # a spanning tree of the three blobs
    d = pairwise(x)
    mrd = np.maximum(np.maximum(core[:, None], core[None, :]), d)
    for a, b in links:  # each is the cheapest pair between its two blobs
        pa, pb = slice(a // 80 * 80, a // 80 * 80 + 80), slice(b // 80 * 80, b // 80 * 80 + 80)
        np.testing.assert_allclose(mr[a, b], mrd[pa, pb].min(), rtol=1e-5)
    assert csgraph.minimum_spanning_tree(mr).nnz == len(x) - 1


def test_umap_runs_on_the_union_graph_as_precomputed(graph):
    umap = pytest.importorskip("umap", reason="umap-learn is not installed (pip install 'bigknn[umap]'): UMAP on the "
                                               "union graph is not checked")
    g, x = graph
    if g.info.k < 6:
        pytest.skip("k = 1: UMAP needs n_neighbors >= 2 entries a row")
    embedding = umap.UMAP(metric="precomputed", n_neighbors=6, random_state=0).fit_transform(g.symmetric())
    assert embedding.shape == (len(x), 2) and np.isfinite(embedding).all()


@pytest.mark.slow
def test_dedup_at_100k_rows_equals_the_exact_threshold_components():
    """The issue's acceptance: planted groups of 2 to 50 among 100K rows; the groups equal the exact
    components of all pairs within the distance, so every pair within it is found (recall 1) and every
    pair in a group lies within it (precision 1), checked on a sample of rows."""
    from sklearn.neighbors import NearestNeighbors

    rng = np.random.default_rng(11)
    sizes = rng.integers(2, 51, size=400)
    centres = rng.normal(scale=10, size=(len(sizes), 16))
    groups = [c + rng.normal(scale=0.002, size=(s, 16)) for c, s in zip(centres, sizes)]
    x = np.concatenate([rng.normal(scale=10, size=(100_000 - sizes.sum(), 16)), *groups]).astype(np.float32)
    x = x[rng.permutation(len(x))]
    max_distance = 0.05
    with bigknn.build(x, k=10, backend="cpu") as g:
        labels = g.components(max_distance).labels
    near = NearestNeighbors(radius=max_distance).fit(x).radius_neighbors_graph(x, mode="connectivity")
    _, exact = csgraph.connected_components(near, directed=False)
    lowest = np.full(exact.max() + 1, len(x))
    np.minimum.at(lowest, exact, np.arange(len(x)))
    np.testing.assert_array_equal(labels, lowest[exact])
    sample = rng.choice(len(x), 2000, replace=False)
    within = pairwise(x[sample]) <= max_distance
    same = labels[sample][:, None] == labels[sample][None, :]
    assert (within <= same).all() and (same <= within).all()  # recall 1 and precision 1 on the sample
    assert (np.bincount(labels) >= 2).sum() == len(sizes)


@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_products_of_a_partitioned_store_are_those_of_its_lists(tmp_path, metric):
    """A k-means partitioned store yields shards of scattered input rows: the products still index input rows."""
    x = with_duplicates(2500, 8, seed=43)  # past one shard, so the partition is learnt
    with bigknn.build(x, k=5, metric=metric, backend="cpu", shard_rows=900, partition="kmeans") as g:
        assert g.info.partition == "kmeans"
        a = dense_lists(g)
        np.testing.assert_array_equal(as_dense(g.symmetric("mutual", host_mem=SMALL_BUDGET)), reference(a, "mutual"))
        _, labels = csgraph.connected_components(sp.csr_matrix(np.nan_to_num(a, nan=np.inf) <= 1e-4),
                                                 directed=False)
        lowest = np.full(labels.max() + 1, len(x))
        np.minimum.at(lowest, labels, np.arange(len(x)))
        np.testing.assert_array_equal(g.components(1e-4).labels, lowest[labels])
        np.testing.assert_array_equal(g.core_distances(4), g.neighbors()[1][:, 2])
