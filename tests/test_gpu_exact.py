"""CUDA exact k-NN against float64 NumPy brute force: ``exact_knn`` over host and device blocks, and the fused
tensor-core kernel (exact_fused.cu knn_fused).

The fused kernel serves large query sets only (FUSED_MIN_QUERIES); these tests lower that bound, and the
chunk size, so that small odd-sized inputs exercise every path: several host blocks, several chunks per
block, partial tiles, queries not a multiple of 16, k = 1 and k = 128 (no margin left), duplicates, and
every element type. Run with ``pytest -m gpu tests/test_gpu_exact.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from bigknn.core.metric import L2, metric as metric_of
from bigknn.core.synth import synth

from test_gpu_gnnd import _exact_top, _recall

pytestmark = pytest.mark.gpu


@pytest.fixture
def fused(monkeypatch):
    """Every exact k-NN call takes the fused kernel, in chunks of 96-ish rows; counts its launches."""
    from bigknn.backends.cuda import exact

    monkeypatch.setattr(exact, "FUSED_MIN_QUERIES", 1)
    monkeypatch.setattr(exact, "FUSED_CHUNK_BYTES", 96 * 32 * 2)
    calls = []
    add = exact._Fused.add
    monkeypatch.setattr(exact._Fused, "add", lambda self, *a: (calls.append(1), add(self, *a))[1])
    return calls


def _data(rng, n: int, d: int, dtype) -> np.ndarray:
    """Random rows; float rows at a random scale around a random offset (far from the origin: l2 keys must
    not lose the neighbours' differences to the halves' rounding of the offset)."""
    if dtype == np.uint8:
        return rng.integers(0, 256, size=(n, d)).astype(np.uint8)
    if dtype == np.int8:
        return rng.integers(-128, 128, size=(n, d)).astype(np.int8)
    scale = rng.uniform(0.1, 100)
    return ((rng.normal(size=(n, d)) + rng.normal(size=d) * 20) * scale).astype(dtype)


def _keys64(a: np.ndarray, b: np.ndarray, metric: str) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    dots = a @ b.T
    if metric == "ip":
        return -dots
    return np.maximum((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * dots, 0.0)


def _check_exact(g, keys: np.ndarray, k: int) -> float:
    """Every returned key is the true key of its id (float32 accuracy), ids are distinct, and the keys are the
    k smallest; returns the share of entries whose key is within rounding of the true k-th list's."""
    scale = np.abs(keys).max()
    true = np.take_along_axis(keys, g.ids.astype(np.int64), 1)
    np.testing.assert_allclose(g.dists, true, rtol=1e-4, atol=1e-6 * scale)
    s = np.sort(g.ids, axis=1)
    assert not (s[:, 1:] == s[:, :-1]).any()
    ref = np.sort(keys, axis=1)[:, :k]
    return float((np.abs(g.dists - ref) <= 1e-4 * np.abs(ref) + 1e-6 * scale).mean())


CASES = [  # d, k, dtype, metric
    (16, 5, np.float32, "l2"),
    (17, 1, np.float32, "l2"),
    (64, 49, np.float32, "l2"),
    (100, 10, np.float32, "ip"),
    (128, 33, np.uint8, "l2"),
    (200, 61, np.float16, "l2"),
    (256, 7, np.float16, "ip"),
    (37, 20, np.int8, "l2"),
]


@pytest.mark.parametrize("d,k,dtype,metric", CASES)
def test_fused_exact_knn_matches_numpy(cuda_backend, fused, d, k, dtype, metric):
    """Fresh random rows of odd sizes over three host blocks: the fused kernel's lists (after the exact re-key)
    are the exact top k, on every element type and both metrics."""
    rng = np.random.default_rng([d, k])
    sizes = [1000, 17, 2311]
    data = _data(rng, sum(sizes), d, dtype)
    offs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    queries = data[rng.choice(len(data), 333, replace=False)]
    g = cuda_backend.exact_knn(queries, k, metric_of(metric), [(int(o), data[o:o + s]) for o, s in zip(offs, sizes)])
    assert len(fused) == 3  # one add per block: the fused path ran
    assert g.ids.shape == (333, k) and g.ids.dtype == np.int32 and g.dists.dtype == np.float32
    assert _check_exact(g, _keys64(queries, data, metric), k) == 1.0


def test_fused_widest_lists_without_margin(cuda_backend, fused):
    """k = 128 leaves the fused lists no margin over k: the halves' rounding may swap only near-equal keys."""
    rng = np.random.default_rng(128)
    data = rng.normal(size=(3000, 96)).astype(np.float32)
    g = cuda_backend.exact_knn(data[:500], 128, L2, [(0, data)])
    assert _check_exact(g, _keys64(data[:500], data, "l2"), 128) > 0.999


def test_fused_duplicates_and_self(cuda_backend, fused):
    """Duplicated rows come back at key 0 (exact keys), self included, ids distinct; device blocks work."""
    import cupy as cp

    rng = np.random.default_rng(5)
    base = rng.normal(size=(700, 48)).astype(np.float32)
    data = np.concatenate([base, base[:300], base[:50]])  # rows 0..49 thrice, 50..299 twice
    g = cuda_backend.exact_knn(data[:100], 4, L2, [(0, cp.asarray(data[:1000])), (1000, cp.asarray(data[1000:]))])
    assert (g.dists[:50, :3] == 0).all() and (g.dists[50:, :2] == 0).all()
    assert {0, 700, 1000} <= set(g.ids[0, :3].tolist())
    assert _check_exact(g, _keys64(data[:100], data, "l2"), 4) == 1.0


def test_exact_graph_takes_the_fused_kernel_for_large_sets(cuda_backend):
    """Without lowered bounds a self-join of FUSED_MIN_QUERIES rows takes the fused kernel, and the graph is
    exact (checked on sampled rows)."""
    from bigknn.backends.cuda import exact

    n = exact.FUSED_MIN_QUERIES + 1001
    assert exact.uses_fused(n, 64) and not exact.uses_fused(n, 272) and not exact.uses_fused(1000, 64)
    assert not exact.uses_fused(n, 15)  # too few dims to average the halves' rounding out
    rng = np.random.default_rng(11)
    x = rng.normal(size=(n, 64)).astype(np.float32)
    with cuda_backend.gpu.context():
        g = exact.exact_graph(cuda_backend.gpu, x, 32, L2)
    rows = rng.choice(n, 200, replace=False)
    keys = _keys64(x[rows], x, "l2")
    keys[np.arange(200), rows] = np.inf
    ref = np.sort(keys, axis=1)[:, :32]
    got = np.take_along_axis(keys, g.ids[rows].astype(np.int64), 1)
    np.testing.assert_allclose(np.sort(got, axis=1), ref, rtol=1e-4)


@pytest.mark.parametrize("n", [129, 301, 2501])
def test_exact_graph_fills_lists_max_k_wide(cuda_backend, n):
    """k = MAX_K: every list full (n - 1 > k), self excluded, ids distinct, and the keys the k smallest
    (a descent that falls short at that width takes this graph: CI of 2026-11-26 saw 127 columns). Rows
    5..9 repeat rows 0..4, so duplicates must neither be dropped nor mistaken for self."""
    from bigknn.backends.cuda import exact
    from bigknn.backends.cuda.compile import MAX_K

    rng = np.random.default_rng(n)
    x = _data(rng, n, 24, np.float32)
    x[5:10] = x[0:5]
    with cuda_backend.gpu.context():
        g = exact.exact_graph(cuda_backend.gpu, x, MAX_K, L2)
    assert g.ids.shape == (n, MAX_K) and (g.ids >= 0).all() and (g.ids < n).all()
    assert not (g.ids == np.arange(n)[:, None]).any()
    assert (g.ids[0:5] == np.arange(5, 10)[:, None]).any(axis=1).all()  # each row's duplicate is a neighbour
    keys = _keys64(x, x, "l2")
    keys[np.arange(n), np.arange(n)] = np.inf
    assert _check_exact(g, keys, MAX_K) >= 0.999


@pytest.mark.parametrize("dtype,metric", [(np.float32, "l2"), (np.float16, "ip"), (np.uint8, "l2")])
def test_rows_on_the_device_are_searched_in_parts_with_the_same_result(cuda_backend, monkeypatch, dtype, metric):
    """A whole shard on the device is searched in parts (exact.DEVICE_BLOCK_BYTES; CuPy compiles its kernels
    anew past 2^31 elements): parts of 37 rows and odd offsets give the brute-force top-k, self first."""
    import cupy as cp
    from bigknn.backends.cuda import exact

    rng = np.random.default_rng(11)
    x = _data(rng, 1001, 40, dtype)
    x[500] = x[7]  # a duplicate row
    monkeypatch.setattr(exact, "DEVICE_BLOCK_BYTES", 37 * 40 * 4)
    parts = []
    add = exact._Tiled.add
    monkeypatch.setattr(exact._Tiled, "add", lambda self, off, *a: (parts.append(off), add(self, off, *a))[1])
    q = x[::9]
    g = cuda_backend.exact_knn(q, 12, metric_of(metric), [(3, cp.asarray(x))])
    assert len(parts) == -(-1001 // 37) and parts[:2] == [3, 40]
    keys = _keys64(q, x, metric)
    g.ids -= 3
    assert _check_exact(g, keys, 12) == 1.0


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_half_rows_in_blocks_equal_the_whole_array_at_once(monkeypatch, dtype, cuda_backend):
    """half_rows and kernel_rows work in blocks (rows.BLOCK_BYTES): blocks of 13 rows give the scale and the
    copy that one pass over the whole array does."""
    import cupy as cp
    from bigknn.backends.cuda import rows
    from bigknn.core.metric import half_scale

    x = _data(np.random.default_rng(5), 1000, 24, dtype)
    x[613, 5] = -3 * np.abs(x).max()  # the peak magnitude, negative, in one late block
    monkeypatch.setattr(rows, "BLOCK_BYTES", 13 * 24 * 4)
    with cuda_backend.gpu.context():
        xd = cp.asarray(x.astype(np.float32))
        half, scale = rows.half_rows(xd, width=32)
        assert scale == half_scale(float(np.abs(x.astype(np.float32)).max()))
        expect = np.zeros((1000, 32), np.float16)
        expect[:, :24] = (x.astype(np.float32) * np.float32(scale)).astype(np.float16)
        np.testing.assert_array_equal(half.view(cp.float16).get(), expect)
        padded = rows.kernel_rows(xd, 32).get()
        np.testing.assert_array_equal(padded[:, :24], x.astype(np.float32))
        assert not padded[:, 24:].any()


EXACT_CASES = [
    # d, k, dtype, metric
    (100, 7, np.float32, "l2"),
    (37, 13, np.float32, "ip"),
    (96, 128, np.uint8, "l2"),
    (130, 5, np.float16, "ip"),
    (100, 10, np.int8, "l2"),
]


@pytest.mark.parametrize("d,k,dtype,metric", EXACT_CASES)
def test_exact_knn_matches_numpy(cuda_backend, d, k, dtype, metric):
    rng = np.random.default_rng(d * 1000 + k)
    sizes = [1000, 2500, 17, 4099, 9000]
    if dtype == np.uint8:
        data = rng.integers(0, 256, size=(sum(sizes), d)).astype(np.uint8)
    elif dtype == np.int8:
        data = rng.integers(-128, 128, size=(sum(sizes), d)).astype(np.int8)
    else:
        data = rng.normal(size=(sum(sizes), d)).astype(dtype)
    offs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    qrows = rng.choice(len(data), 333, replace=False)
    queries = data[qrows]
    blocks = [(int(o), data[o:o + s]) for o, s in zip(offs, sizes)]
    g = cuda_backend.exact_knn(queries, k, metric_of(metric), blocks)
    assert g.ids.shape == (333, k) and g.ids.dtype == np.int32 and g.dists.dtype == np.float32
    keys = _keys64(queries, data, metric)
    ref = np.sort(keys, axis=1)[:, :k]
    scale = np.abs(keys).max(axis=1, keepdims=True)
    np.testing.assert_allclose(g.dists, ref, rtol=1e-4, atol=1e-6 * scale.max())
    true = np.take_along_axis(keys, g.ids.astype(np.int64), 1)
    np.testing.assert_allclose(g.dists, true, rtol=1e-4, atol=1e-6 * scale.max())
    s = np.sort(g.ids, axis=1)
    assert not (s[:, 1:] == s[:, :-1]).any()
    # ids equal NumPy's where the key is not tied with a neighbour in the sorted order
    order = np.argsort(keys, axis=1, kind="stable")[:, : k + 1]
    sk = np.take_along_axis(keys, order, 1)
    gap = np.minimum(np.diff(sk, axis=1, prepend=-np.inf)[:, :k], np.diff(sk, axis=1)[:, :k])
    untied = gap > 1e-4 * np.maximum(np.abs(sk[:, :k]), 1e-3 * scale)
    assert (g.ids[untied] == order[:, :k][untied]).all()


def test_exact_knn_more_k_than_rows(cuda_backend):
    rng = np.random.default_rng(3)
    data = rng.normal(size=(20, 24)).astype(np.float32)
    g = cuda_backend.exact_knn(data[:5], 30, L2, [(100, data[:12]), (112, data[12:])])
    assert (g.ids[:, 20:] == -1).all() and np.isinf(g.dists[:, 20:]).all()
    assert (g.ids[:, 0] == 100 + np.arange(5)).all()  # self first (key 0), global ids
    assert sorted(g.ids[0, :20]) == list(range(100, 120))


def test_exact_knn_device_blocks_and_self(cuda_backend):
    import cupy as cp

    x = synth(5000, 64, seed=8)
    g = cuda_backend.exact_knn(x[:100], 11, L2, [(0, cp.asarray(x[:2048])), (2048, cp.asarray(x[2048:]))])
    assert (g.ids[:, 0] == np.arange(100)).all()
    exact = _exact_top(x, np.arange(100), 10, "l2")
    assert _recall(g.ids[:, 1:], exact, 10) == 1.0
