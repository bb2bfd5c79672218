"""CPU GNND and exact kNN: recall against plain NumPy brute force, and the graph invariants."""

from __future__ import annotations

import numpy as np
import pytest

import bigknn.backends.cpu.exact as exact_mod
from bigknn.backends.cpu import CpuBackend
from bigknn.core.params import GnndParams
from bigknn.core.synth import synth
from bigknn.core.metric import IP, L2, metric as metric_of

from conftest import check_graph, exact_keys, exact_neighbours, recall_at

N = 20_000
SAMPLE = 500


@pytest.fixture(scope="module")
def backend():
    return CpuBackend()


@pytest.fixture(scope="module")
def sample_rows():
    return np.sort(np.random.default_rng(123).choice(N, SAMPLE, replace=False))


def numpy_topk(q: np.ndarray, x: np.ndarray, ids: np.ndarray, k: int, metric: str):
    """Plain argsort reference over rows ``x`` whose global ids are ``ids``."""
    keys = exact_keys(q, x, metric)
    order = np.argsort(keys, axis=1, kind="stable")[:, :k]
    return ids[order], np.take_along_axis(keys, order, axis=1)


# ---- exact kNN --------------------------------------------------------------------------------
@pytest.mark.parametrize("reference", [False, True])  # the compiled tile step and the NumPy one
@pytest.mark.parametrize("small_tiles", [False, True])
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_exact_knn_matches_numpy_argsort(monkeypatch, metric, small_tiles, reference):
    backend = CpuBackend(reference=reference)
    if small_tiles:  # many query batches and key tiles per block: exercises the running top-k filter
        monkeypatch.setattr(exact_mod, "QUERY_ROWS", 8)
        monkeypatch.setattr(exact_mod, "TILE_COLS", 97)
    rng = np.random.default_rng(17)
    sizes, offsets = [1001, 7, 2503, 1], [0, 5000, 7000, 12345]  # odd sizes, gaps between global ids
    blocks = [(o, rng.standard_normal((s, 19)).astype(np.float32)) for o, s in zip(offsets, sizes)]
    all_x = np.concatenate([b for _, b in blocks])
    all_ids = np.concatenate([o + np.arange(len(b)) for o, b in blocks])
    # queries: some rows of the set (their own row is a neighbour at key ~0 for l2) and some new points
    q = np.concatenate([all_x[[3, 1001, 1005, 2000, 3511]], rng.standard_normal((32, 19)).astype(np.float32)])
    k = 15
    g = backend.exact_knn(q, k, metric_of(metric), iter(blocks))
    want_ids, want_keys = numpy_topk(q, all_x, all_ids, k, metric)
    assert g.ids.shape == (len(q), k) and g.dists.shape == (len(q), k)
    assert g.ids.dtype == np.int32 and g.dists.dtype == np.float32
    np.testing.assert_array_equal(g.ids, want_ids)
    np.testing.assert_allclose(g.dists, want_keys, rtol=1e-4, atol=1e-3)


def test_exact_knn_pads_when_fewer_rows_than_k(backend):
    rng = np.random.default_rng(2)
    blocks = [(10, rng.standard_normal((3, 8)).astype(np.float32)),
              (40, rng.standard_normal((2, 8)).astype(np.float32))]
    q = rng.standard_normal((4, 8)).astype(np.float32)
    g = backend.exact_knn(q, 8, L2, blocks)
    all_x = np.concatenate([b for _, b in blocks])
    want_ids, want_keys = numpy_topk(q, all_x, np.array([10, 11, 12, 40, 41]), 5, "l2")
    np.testing.assert_array_equal(g.ids[:, :5], want_ids)
    np.testing.assert_allclose(g.dists[:, :5], want_keys, rtol=1e-4, atol=1e-4)
    assert np.all(g.ids[:, 5:] == -1) and np.all(np.isinf(g.dists[:, 5:]))


def test_exact_knn_of_uint8_blocks(backend):
    rng = np.random.default_rng(4)
    x = rng.integers(0, 256, size=(3000, 24), dtype=np.uint8)
    q = x[:50]
    g = backend.exact_knn(q, 10, L2, [(0, x[:1234]), (1234, x[1234:])])
    want = exact_keys(q, x)
    np.testing.assert_allclose(g.dists, np.sort(want, axis=1)[:, :10], rtol=1e-5)
    np.testing.assert_allclose(g.dists, np.take_along_axis(want, g.ids.astype(np.int64), axis=1), rtol=1e-5)
    assert np.all(g.ids[:, 0] == np.arange(50)) and np.all(g.dists[:, 0] == 0)


# ---- GNND -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim,k", [(32, 32), (96, 16)])
def test_gnnd_l2_recall_and_invariants(backend, sample_rows, dim, k):
    x = synth(N, dim, seed=dim)
    g = backend.gnnd(x, L2, GnndParams(k=k), seed=1)
    assert g.ids.shape[0] == N and g.ids.shape[1] >= k
    check_graph(g.ids, g.dists, x, "l2")
    r = recall_at(g.ids[sample_rows], x, sample_rows, 10, "l2")
    assert r >= 0.95, f"recall@10 {r:.4f} on {N} x {dim}, k={k}"


def test_gnnd_is_deterministic_given_the_seed(backend):
    x = synth(3000, 16, seed=8)
    a = backend.gnnd(x, L2, GnndParams(k=16), seed=5)
    b = backend.gnnd(x, L2, GnndParams(k=16), seed=5)
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.dists, b.dists)


def test_gnnd_ip_on_rows_of_similar_norm(backend, sample_rows):
    """Inner product where MIPS and nearest neighbours roughly agree: the descent must reach high recall."""
    x = synth(N, 32, seed=21)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    x = (x * np.random.default_rng(3).uniform(0.9, 1.1, size=(N, 1))).astype(np.float32)
    g = backend.gnnd(x, IP, GnndParams(k=32), seed=2)
    check_graph(g.ids, g.dists, x, "ip")
    assert np.all(g.dists[:, 0] < 0)  # keys are -dot: the nearest rows have a large positive dot
    r = recall_at(g.ids[sample_rows], x, sample_rows, 10, "ip")
    assert r >= 0.93, f"ip recall@10 {r:.4f}"


def test_gnnd_ip_on_raw_clustered_rows(backend, sample_rows):
    """Raw synth rows (norms vary a lot): MIPS is harder for NN-descent; a floor far above chance, and keys
    that are -dot (an l2 ordering would fail both)."""
    x = synth(N, 64, seed=22)
    g = backend.gnnd(x, IP, GnndParams(k=32), seed=3)
    check_graph(g.ids, g.dists, x, "ip")
    r = recall_at(g.ids[sample_rows], x, sample_rows, 10, "ip")
    assert r >= 0.85, f"ip recall@10 {r:.4f}"


def test_gnnd_k1_finds_the_nearest_row(backend, sample_rows):
    x = synth(N, 32, seed=31)
    g = backend.gnnd(x, L2, GnndParams(k=1), seed=4)
    assert g.ids.shape[0] == N and g.ids.shape[1] >= 1
    check_graph(g.ids, g.dists, x, "l2")
    r = recall_at(g.ids[sample_rows], x, sample_rows, 1, "l2")
    assert r >= 0.95, f"recall@1 {r:.4f} with k=1"


def test_gnnd_with_repeated_rows(backend):
    """Each row present 3 times (shuffled): its 2 twins are at key 0; no self, no id twice, ties count."""
    base = synth(5000, 32, seed=41)
    perm = np.random.default_rng(5).permutation(15000)
    x = np.repeat(base, 3, axis=0)[perm]
    origin = np.repeat(np.arange(5000), 3)[perm]
    g = backend.gnnd(x, L2, GnndParams(k=16), seed=6)
    check_graph(g.ids, g.dists, x, "l2")
    rows = np.sort(np.random.default_rng(6).choice(15000, SAMPLE, replace=False))
    r = recall_at(g.ids[rows], x, rows, 10, "l2")
    assert r >= 0.95, f"recall@10 {r:.4f} with duplicated rows"
    # both twins come first for almost every row
    first2 = g.ids[:, :2].astype(np.int64)
    twins_first = (origin[first2] == origin[:, None]).all(axis=1)
    assert twins_first.mean() >= 0.97, f"only {twins_first.mean():.3f} of rows list both twins first"


def test_identical_rows_have_key_zero(backend):
    """Deduplication users threshold on distance 0: the stored key of an exact copy must be 0, not the
    float32 rounding residue of |a|^2 + |b|^2 - 2ab."""
    base = synth(3000, 32, seed=42)
    x = np.repeat(base, 2, axis=0)  # rows 2i and 2i+1 are identical
    g = backend.gnnd(x, L2, GnndParams(k=16), seed=6)
    twin = np.arange(len(x)) ^ 1
    assert np.all(g.ids[:, 0] == twin)
    bad = g.dists[:, 0] != 0
    assert not bad.any(), (f"{int(bad.sum())} of {len(x)} rows store a nonzero key for their exact copy "
                           f"(max {g.dists[bad, 0].max():.3g})")


def test_gnnd_uint8_input(backend, sample_rows):
    xf = synth(N, 48, seed=51)
    x = np.clip(np.rint(xf * 10 + 128), 0, 255).astype(np.uint8)
    g = backend.gnnd(x, L2, GnndParams(k=32), seed=7)
    check_graph(g.ids, g.dists, x.astype(np.float32), "l2")
    r = recall_at(g.ids[sample_rows], x.astype(np.float32), sample_rows, 10, "l2")
    assert r >= 0.95, f"uint8 recall@10 {r:.4f}"


def test_reference_helpers_agree_with_exact_knn(backend, sample_rows):
    """The NumPy reference used above and CpuBackend.exact_knn give the same neighbours."""
    x = synth(N, 32, seed=61)
    ids, keys = exact_neighbours(x, sample_rows, 10)
    g = backend.exact_knn(x[sample_rows], 11, L2, [(0, x[:7777]), (7777, x[7777:])])
    assert np.all(g.ids[:, 0] == sample_rows)
    np.testing.assert_allclose(g.dists[:, 1:], keys, rtol=1e-3, atol=1e-3)
    assert (g.ids[:, 1:] == ids).mean() > 0.999


def test_rows_descended_in_locality_order_come_back_in_the_input_order():
    """The compiled GNND descends over the rows in an RP tree's leaf order (cpu.rptree.locality_order): a graph of
    ``x[order]`` maps back to ``x``'s rows and ids (empty slots kept), and a caller's probe is renumbered to the
    new positions with its empty truth slots kept."""
    from bigknn.algorithms.recall_target import Probe
    from bigknn.backends.cpu import from_order, in_order
    from bigknn.backends.cpu.rptree import locality_order, split_rows
    from bigknn.core.knn_graph import KnnGraph

    x = synth(3000, 16, seed=4)
    order = locality_order(split_rows(x), 16, seed=1)
    assert np.array_equal(np.sort(order), np.arange(len(x))) and not np.array_equal(order, np.arange(len(x)))
    at = np.empty(len(x), np.int64)
    at[order] = np.arange(len(x))
    ids = np.array([[1, 2, -1], [0, 2, -1], [0, 1, -1]], np.int32)  # positions in the order, rows 0-2 of it
    n = 3
    small = np.argsort(np.random.default_rng(0).random(n)).astype(np.int32)
    g = from_order(KnnGraph(ids, np.arange(9, dtype=np.float32).reshape(3, 3), None), small)
    for p in range(n):  # row small[p] of the input lists the input rows small[ids[p]]
        assert g.ids[small[p]].tolist() == [int(small[v]) if v >= 0 else -1 for v in ids[p]]
        assert g.dists[small[p]].tolist() == [3 * p, 3 * p + 1, 3 * p + 2]
    probe = Probe(rows=np.array([5, 7]), truth_ids=np.array([[7, 9, -1], [5, 11, 13]]), kth_key=np.ones(2))
    moved = in_order(probe, order)
    assert moved.rows.tolist() == [at[5], at[7]] and moved.truth_ids[0, 2] == -1
    assert moved.truth_ids[1].tolist() == [at[5], at[11], at[13]] and moved.truth_ids.dtype == probe.truth_ids.dtype
