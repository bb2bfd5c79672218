"""One behavioural suite for every backend present (as zarr's StoreTests for its stores): the NumPy reference,
the compiled CPU backend, and on a GPU machine the CUDA backend (marked ``gpu``: ``pytest -m gpu
tests/test_backend_conformance.py``). Each capability of the Backend contract (bigknn/backends/base.py) is
checked against plain NumPy, on odd sizes, k = 1 and duplicate rows: exact k-NN, nearest centroids, GNND
recall, the GGM merge of two shards, the TSDG prune's invariants, and search recall. A new backend registers
itself (bigknn/backends/registry.py) and joins BACKENDS below."""

from __future__ import annotations

import numpy as np
import pytest

from bigknn.backends.cpu import CpuBackend
from bigknn.core.knn_graph import EMPTY, KnnGraph, ShardPart
from bigknn.core.params import EXACT_ROWS, GnndParams
from bigknn.algorithms.search_index import SearchIndex
from bigknn.algorithms.search_params import NO_LAMBDA, PruneParams, SearchPlan
from bigknn.core.synth import synth
from bigknn.core.metric import L2, metric as metric_of
from bigknn.core.errors import BadInput

from conftest import check_graph, exact_keys, exact_neighbours, recall_at


def _cuda():
    from bigknn.backends.cuda import CudaBackend, cuda_available

    if not cuda_available():
        pytest.skip("CuPy or a CUDA device is not available")
    return CudaBackend()


BACKENDS = [pytest.param(lambda: CpuBackend(reference=True), id="cpu-reference"),
            pytest.param(lambda: CpuBackend(), id="cpu-numba"),
            pytest.param(_cuda, id="cuda", marks=pytest.mark.gpu)]
ODD_ROWS = EXACT_ROWS + 953  # above EXACT_ROWS, so GNND and GGM descend rather than answer exactly
DIM = 19


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    return request.param()


def _with_twins(x: np.ndarray, count: int = 40) -> np.ndarray:
    """``x`` with its first ``count`` rows repeated in its middle: duplicate rows, zero keys, ties."""
    x = x.copy()
    x[len(x) // 2:len(x) // 2 + count] = x[:count]
    return x


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    return _with_twins(synth(ODD_ROWS, DIM, seed=34))


def _true_kth(q: np.ndarray, x: np.ndarray, k: int, metric: str) -> np.ndarray:
    return np.sort(exact_keys(q, x, metric), axis=1)[:, k - 1]


# ---- exact k-NN and nearest centroids --------------------------------------------------------------
@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("queries,k", [(1, 1), (37, 1), (129, 10), (5, 33)])
def test_exact_knn_matches_numpy_over_streamed_blocks(backend, rows, metric, queries, k):
    rng = np.random.default_rng(queries * 100 + k)
    q = rng.normal(size=(queries, DIM)).astype(np.float32)
    q[-1] = q[0]  # a repeated query
    x = rows[:1001].copy()
    x[500] = q[0]  # a row equal to a query: key 0 (l2)
    cuts = [0, 333, 334, 1001]  # blocks of odd sizes, one of a single row, at their global offsets
    g = backend.exact_knn(q, k, metric_of(metric), [(lo, x[lo:hi]) for lo, hi in zip(cuts, cuts[1:])])
    assert g.ids.shape == g.dists.shape == (queries, k)
    truth = exact_keys(q, x, metric)
    got = np.take_along_axis(truth, g.ids.astype(np.int64), axis=1)
    slack = 1e-4 * np.maximum(1.0, np.abs(got))
    np.testing.assert_allclose(g.dists, got, rtol=1e-4, atol=1e-3)  # the keys are the ids' keys
    assert (np.diff(g.dists, axis=1) >= 0).all()
    assert (got[:, -1] <= _true_kth(q, x, k, metric) + slack[:, -1]).all()  # none closer was left out
    assert all(len(set(r)) == k for r in g.ids.tolist())


@pytest.mark.parametrize("count", [1, 3, 16])
def test_nearest_centroids_are_the_numpy_nearest(backend, rows, count):
    centroids = rows[::173][:16]
    ids, d2 = backend.nearest_centroids(rows[:777], count, centroids)
    assert ids.shape == d2.shape == (777, count) and ids.dtype == np.int64 and d2.dtype == np.float32
    truth = exact_keys(rows[:777], centroids)
    np.testing.assert_allclose(d2, np.take_along_axis(truth, ids, axis=1), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(d2[:, -1], np.sort(truth, axis=1)[:, count - 1], rtol=1e-3, atol=1e-3)


def test_nearest_centroids_of_uint8_rows_are_those_of_the_same_rows_as_float32(backend, rows):
    """The labelling pass hands uint8 rows over as they are; the answer is that of their float32 values."""
    x8 = np.clip(rows[:501] * 20 + 128, 0, 255).astype(np.uint8)
    centroids = x8[::37][:12].astype(np.float32)
    ids, d2 = backend.nearest_centroids(x8, 3, centroids)
    want_ids, want_d2 = backend.nearest_centroids(x8.astype(np.float32), 3, centroids)
    np.testing.assert_allclose(d2, want_d2, rtol=1e-5, atol=1e-3)
    truth = exact_keys(x8.astype(np.float32), centroids)
    np.testing.assert_allclose(d2, np.take_along_axis(truth, ids, axis=1), rtol=1e-4, atol=1e-2)


# ---- GNND and GGM ------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 10])
def test_gnnd_reaches_its_recall_target(backend, rows, k):
    g = backend.gnnd(rows, L2, GnndParams(k=k), seed=1)
    check_graph(g.ids, g.dists, rows)
    assert g.ids.shape == (len(rows), GnndParams(k=k).width())
    sample = np.random.default_rng(k).choice(len(rows), 300, replace=False)
    assert recall_at(g.ids[sample], rows, sample, k) >= 0.95


def test_gnnd_of_fewer_rows_than_k_pads_with_empty_slots(backend, rows):
    g = backend.gnnd(rows[:7], L2, GnndParams(k=10), seed=1)
    listed = g.ids[:, :6]
    assert (np.sort(listed, axis=1) == [[c for c in range(7) if c != r] for r in range(7)]).all()
    assert (g.ids[:, 6:] == EMPTY).all() and np.isinf(g.dists[:, 6:]).all()  # every other row, nothing more
    np.testing.assert_allclose(g.dists[:, :6], np.take_along_axis(exact_keys(rows[:7], rows[:7]), listed, axis=1),
                               rtol=1e-4, atol=1e-4)


def test_ggm_merges_two_shards_into_the_graph_of_their_union(backend, rows):
    k, cut = 10, 1501  # shards of odd, unequal sizes, both above EXACT_ROWS / 2
    params = GnndParams(k=k)
    a, b = rows[:cut], rows[cut:]
    ga = backend.gnnd(a, L2, params, seed=2)
    gb = backend.gnnd(b, L2, params, seed=3)
    gb = KnnGraph(np.where(gb.ids >= 0, gb.ids + cut, gb.ids), gb.dists)
    ma, mb = backend.ggm(ShardPart(0, a, ga), ShardPart(cut, b, gb), L2, params, seed=4)
    ids = np.concatenate([ma.ids, mb.ids])
    check_graph(ids, np.concatenate([ma.dists, mb.dists]), rows)
    sample = np.random.default_rng(5).choice(len(rows), 300, replace=False)
    assert recall_at(ids[sample], rows, sample, k) >= 0.95
    crossing = ((ma.ids >= cut).any(axis=1).mean(), ((mb.ids >= 0) & (mb.ids < cut)).any(axis=1).mean())
    assert min(crossing) > 0.1, crossing  # the synth's clusters straddle the cut: lists take the other shard


# ---- prune and search ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def knn(rows) -> tuple[np.ndarray, np.ndarray]:
    """The exact 24-NN graph of ``rows``, what every backend's prune starts from."""
    ids, keys = exact_neighbours(rows, np.arange(len(rows)), 24)
    return ids, keys.astype(np.float32)


@pytest.fixture(scope="module")
def reference_prune(rows, knn):
    """The NumPy reference's TSDG prune of ``knn`` to a degree, made once per degree."""
    made: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}

    def prune(degree: int) -> tuple[np.ndarray, np.ndarray, int]:
        if degree not in made:
            made[degree] = CpuBackend(reference=True).prune_tsdg(*knn, rows, L2, PruneParams("tsdg", degree))
        return made[degree]
    return prune


@pytest.mark.parametrize("degree", [2, 17])
def test_tsdg_prune_keeps_its_invariants(backend, rows, knn, reference_prune, degree):
    params = PruneParams("tsdg", degree)
    ids, lambdas, forward = backend.prune_tsdg(*knn, rows, L2, params)
    assert ids.shape == lambdas.shape == (len(rows), degree)
    assert ids.dtype == np.int32 and lambdas.dtype == np.uint8
    kept = ids >= 0
    assert kept[:, 0].all(), "a row lost every edge"
    assert not (kept[:, 1:] & ~kept[:, :-1]).any(), "an edge after an empty slot"
    assert (lambdas[~kept] == NO_LAMBDA).all() and (lambdas[kept] <= params.lambda0).all()
    assert not (ids == np.arange(len(rows))[:, None]).any() and ids.max() < len(rows)
    ordered = np.where(kept, lambdas, NO_LAMBDA).astype(int)
    assert (np.diff(ordered, axis=1) >= 0).all(), "edges are not ordered by occlusion factor"
    assert all(len(set(r[r >= 0])) == (r >= 0).sum() for r in ids)
    assert len(rows) <= forward <= knn[0].size  # the first stage keeps each row's nearest, at most k a row
    same = (ids == reference_prune(degree)[0]).all(axis=1).mean()
    assert same >= 0.98, same  # float32 near-ties may be decided the other way


@pytest.mark.parametrize("procedure,budget,k,batch", [("large", 64, 10, 50), ("large", 32, 1, 1),
                                                      ("small", 8, 10, 17)])
def test_search_finds_the_nearest_rows(backend, rows, reference_prune, procedure, budget, k, batch):
    ids, lambdas, _ = reference_prune(24)
    index = SearchIndex(rows, ids, lambdas, L2)
    q = synth(101, DIM, seed=35)
    found = backend.graph_search(index, q, SearchPlan(procedure, budget, k), batch)
    assert found.ids.shape == found.dists.shape == (len(q), k)
    assert (np.diff(found.dists, axis=1) >= 0).all() and (found.ids < len(rows)).all()
    keys = exact_keys(q, rows)
    got = np.take_along_axis(keys, np.maximum(found.ids, 0).astype(np.int64), axis=1)
    hits = (found.ids >= 0) & (got <= _true_kth(q, rows, k, "l2")[:, None] * (1 + 1e-4) + 1e-4)
    assert hits.mean() >= 0.9, hits.mean()


# ---- queries checked and prepared where they are searched -------------------------------------------
QUERY_ROWS = 301  # above the batch the CUDA backend prepares on the host (graph_search.py DEVICE_QUERY_ROWS)


@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_searched_queries_are_the_rows_as_the_host_prepares_them(backend, metric):
    q = synth(QUERY_ROWS, DIM, seed=36) * 3.0
    q[5] = 0.0  # a zero row stays zero under cosine
    got = np.asarray(_on_host(backend.searched_queries(q, metric_of(metric), "queries", 0)))
    want = metric_of(metric).prepare(q)
    assert got.shape == q.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert not got[5].any()
    if metric == "cosine":
        norms = np.linalg.norm(np.delete(got, 5, axis=0), axis=1)
        np.testing.assert_allclose(norms, 1.0, rtol=1e-6)
    assert q[0, 0] == np.float32(synth(QUERY_ROWS, DIM, seed=36)[0, 0] * 3.0), "the caller's rows were changed"


@pytest.mark.parametrize("value,problem", [(np.nan, "NaN or Inf"), (np.inf, "NaN or Inf"), (-np.inf, "NaN or Inf"),
                                           (1e-30, "underflow"), (3e19, "overflow")])
@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_searched_queries_name_the_first_bad_row(backend, metric, value, problem):
    q = synth(QUERY_ROWS, DIM, seed=37)
    for row in (261, 280):  # the first of two bad rows is named
        if value == 1e-30:
            q[row] = value  # every value tiny
        else:
            q[row, 3] = value
    bad = 261
    with pytest.raises(BadInput, match=f"^q.fbin: row {1000 + bad}\\b.*{problem}"):
        backend.searched_queries(q, metric_of(metric), "q.fbin", 1000)


def test_searched_queries_judge_other_dtypes_as_given(backend):
    q = synth(QUERY_ROWS, DIM, seed=38).astype(np.float64)
    q[7, 0] = 1e39  # finite in float64, inf in float32: named as the overflow it is
    with pytest.raises(BadInput, match=r"row 7 has squared norm"):
        backend.searched_queries(q, L2, "queries", 0)
    u8 = (np.arange(DIM * QUERY_ROWS) % 200).astype(np.uint8).reshape(QUERY_ROWS, DIM)
    got = np.asarray(_on_host(backend.searched_queries(u8, L2, "queries", 0)))
    np.testing.assert_array_equal(got, u8.astype(np.float32))


def _on_host(a):
    """A backend's device array copied to the host (host arrays as they are)."""
    return a.get() if hasattr(a, "get") else a
