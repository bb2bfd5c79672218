"""CUDA batch graph search (search_keys.cu, search.cu) against the NumPy reference
(bigknn/backends/cpu/graph_search.py): the same procedures step for step, so the same rows found, up to float32
summation order on near-ties. Fresh random inputs of odd sizes, both procedures, both search graphs, k = 1 to
32, batch 1 and odd batches, duplicate rows, every element type and both kernel metrics. Run with
``pytest -m gpu tests/test_gpu_search.py``."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from bigknn.backends.cpu import CpuBackend
from bigknn.core.metric import metric as metric_of, prepare_rows
from bigknn.algorithms.search_params import PARENTS, SearchPlan

from conftest import pruned_store, stored_index

pytestmark = pytest.mark.gpu


def _index(tmp_path, rng, dtype, metric: str, method: str, n: int = 1999, d: int = 37):
    centres = rng.normal(size=(12, d)) * 2
    x = centres[rng.integers(0, 12, n)] + rng.normal(size=(n, d))
    x[n // 2: n // 2 + 40] = x[:40]  # duplicate rows: equal keys
    if dtype == np.uint8:
        x = np.clip(x * 20 + 128, 0, 255)
    x = x.astype(dtype)
    q = (centres[rng.integers(0, 12, 77)] + rng.normal(size=(77, d))).astype(np.float32)
    if dtype == np.uint8:
        q = np.clip(q * 20 + 128, 0, 255).astype(np.float32)
    path = tmp_path / f"{method}-{metric}.knn"
    index = stored_index(pruned_store(path, x, k=24, degree=24, shard_rows=800, method=method, metric=metric),
                         metric_of(metric))
    return index, prepare_rows(q, metric).astype(np.float32)


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    """index(dtype, metric, method, d): built and pruned once per module (on the CPU), with its queries."""
    made: dict = {}

    def index(dtype, metric: str, method: str, d: int = 37):
        key = (np.dtype(dtype).name, metric, method, str(d))
        if key not in made:
            rng = np.random.default_rng(zlib.crc32(" ".join(key).encode()))
            made[key] = _index(tmp_path_factory.mktemp("gpu-search"), rng, dtype, metric, method, d=d)
        return made[key]
    return index


CASES = [(np.float32, "l2", "tsdg"), (np.float32, "cosine", "rng"), (np.float16, "l2", "rng"),
         (np.uint8, "l2", "tsdg"), (np.float32, "ip", "tsdg")]


@pytest.mark.parametrize("dtype,metric,method", CASES)
@pytest.mark.parametrize("procedure,budget,k,batch", [("large", 10, 10, 77), ("large", 100, 32, 13),
                                                      ("large", 256, 1, 1), ("small", 1, 10, 1),
                                                      ("small", 8, 32, 30), ("small", 3, 1, 77)])
def test_gpu_search_finds_what_the_reference_finds(indexes, cuda_backend, dtype, metric, method, procedure,
                                                   budget, k, batch, monkeypatch):
    import bigknn.backends.cuda.graph_search as cuda_search

    rng = np.random.default_rng(zlib.crc32(f"{dtype.__name__} {metric} {method} {procedure} {k}".encode()))
    index, q = indexes(dtype, metric, method)
    plan = SearchPlan(procedure, budget, k, seed=int(rng.integers(1 << 30)))
    want = CpuBackend(reference=True).graph_search(index, q, plan, batch)
    runs = [cuda_backend.graph_search(index, q, plan, batch)]  # large: a block of warps a query (small batches)
    if procedure == "large":
        monkeypatch.setattr(cuda_search, "QUERY_WARPS_PER_SM", 0)  # a warp a query, as in big batches
        runs.append(cuda_backend.graph_search(index, q, plan, batch))
    for got in runs:
        assert got.ids.shape == want.ids.shape == (len(q), k)
        same_rows = (got.ids == want.ids).all(axis=1).mean()
        assert same_rows >= 0.95, same_rows  # near-ties in float32 may send a few searches elsewhere
        both = (got.ids == want.ids) & (want.ids >= 0)
        np.testing.assert_allclose(got.dists[both], want.dists[both], rtol=1e-4, atol=1e-4)
        found = got.ids >= 0
        keys = np.where(found, got.dists, np.inf)
        assert (keys[:, 1:] >= keys[:, :-1]).all()
        assert len(np.unique(got.ids[found])) > 0 and (got.ids[found] < index.rows).all()


def test_gpu_search_keeps_the_index_on_the_device_between_calls(indexes, cuda_backend):
    index, q = indexes(np.float32, "l2", "tsdg")
    plan = SearchPlan("large", 32, 10)
    first = cuda_backend.graph_search(index, q, plan, len(q))
    arrays = cuda_backend._search_index.arrays
    again = cuda_backend.graph_search(index, q, plan, 5)
    assert cuda_backend._search_index.arrays is arrays
    np.testing.assert_array_equal(first.ids, again.ids)  # results do not depend on the batch


def test_gpu_search_table_of_computed_rows_may_forget(indexes, cuda_backend, monkeypatch):
    """A table of the fewest slots a hop needs is cleared (R's rows put back) every hop or two: rows computed
    before are computed again, and the results stay the reference's (skipping a row computed before changes
    nothing)."""
    import bigknn.backends.cuda.graph_search as cuda_search

    index, q = indexes(np.float32, "l2", "tsdg")
    monkeypatch.setattr(cuda_search, "TABLE_SLOTS", 64)
    assert 1 << cuda_search.table_bits(32, index.ids.shape[1]) == 2 * (32 + PARENTS * 24)
    plan = SearchPlan("large", 32, 10, seed=3)
    want = CpuBackend(reference=True).graph_search(index, q, plan, len(q))
    got = cuda_backend.graph_search(index, q, plan, len(q))
    assert (got.ids == want.ids).all(axis=1).mean() >= 0.95


@pytest.mark.parametrize("d,metric", [(40, "l2"), (132, "cosine")])
def test_gpu_search_rows_held_in_registers(indexes, cuda_backend, d, metric, monkeypatch):
    """Rows of a multiple of 4 dims: each lane holds its float4 units of a row in registers (2 and 5 units, the
    last lanes' fifth past the row's end) and finds what the reference finds, in both launch shapes."""
    import bigknn.backends.cuda.graph_search as cuda_search

    assert cuda_search.units_per_lane(d) == -(-d // 32) > 0
    index, q = indexes(np.float32, metric, "tsdg", d)
    plan = SearchPlan("large", 48, 10, seed=d)
    want = CpuBackend(reference=True).graph_search(index, q, plan, len(q))
    block = cuda_backend.graph_search(index, q, plan, len(q))
    monkeypatch.setattr(cuda_search, "QUERY_WARPS_PER_SM", 0)
    warp = cuda_backend.graph_search(index, q, plan, len(q))
    for got in (block, warp):
        assert (got.ids == want.ids).all(axis=1).mean() >= 0.95
        both = (got.ids == want.ids) & (want.ids >= 0)
        np.testing.assert_allclose(got.dists[both], want.dists[both], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("d,metric,k,budget", [(264, "l2", 10, 48), (384, "cosine", 32, 24), (1040, "l2", 1, 8)])
def test_gpu_half_walk_finds_what_the_reference_finds(indexes, cuda_backend, d, metric, k, budget, monkeypatch):
    """Rows WALK_HALF_MIN_DIM wide or wider are walked as scaled halves (held in registers; 1,040 dims: the
    loop) and the list's first RERANK re-keyed in float32: the reference walks the same halves, so the same rows
    come back with exact float32 distances, ascending, in both launch shapes (budget 24 < RERANK too)."""
    import bigknn.backends.cuda.graph_search as cuda_search
    from bigknn.backends.cpu.graph_search import query_keys

    index, q = indexes(np.float32, metric, "tsdg", d)
    assert index.walk is not None and index.walk[0].dtype == np.float16
    plan = SearchPlan("large", budget, k, seed=d)
    want = CpuBackend(reference=True).graph_search(index, q, plan, len(q))
    block = cuda_backend.graph_search(index, q, plan, len(q))
    monkeypatch.setattr(cuda_search, "QUERY_WARPS_PER_SM", 0)
    warp = cuda_backend.graph_search(index, q, plan, len(q))
    for got in (block, warp):
        assert got.ids.shape == (len(q), k)
        assert (got.ids == want.ids).all(axis=1).mean() >= 0.95
        found = got.ids >= 0
        np.testing.assert_allclose(got.dists[found], query_keys(index, q, got.ids.astype(np.int64))[found],
                                   rtol=1e-4, atol=1e-4)
        keys = np.where(found, got.dists, np.inf)
        assert (keys[:, 1:] >= keys[:, :-1]).all()


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("sample_rows,queries", [(4096, 301), (4001, 1), (33, 64), (20, 7)])
def test_gpu_entry_points_match_the_reference(metric, sample_rows, queries):
    """The device keeps each query's nearest SEEDS sample rows in a warp (search_keys.cu entry_nearest); the reference
    sorts the whole row of keys. Small integer rows make every key exact on both, so ties (duplicate sample rows,
    repeated queries) must fall alike: nearest first, the lower sample position among equal keys."""
    import cupy as cp

    from bigknn.backends.cuda.graph_search import nearest_entries as device_entries
    from bigknn.algorithms.search_index import nearest_entries

    rng = np.random.default_rng(sample_rows + queries)
    rows = rng.integers(-3, 4, (sample_rows, 11)).astype(np.float32)
    rows[sample_rows // 2:sample_rows // 2 + 10] = rows[:10]  # equal keys
    ids = np.sort(rng.choice(10 * sample_rows, sample_rows, replace=False))  # ascending, as entry_sample's
    q = rng.integers(-3, 4, (queries, 11)).astype(np.float32)
    q[-1:] = rows[:1]
    want = nearest_entries(np, rows, ids, q, metric_of(metric))
    d_rows = cp.asarray(rows)
    sample = (cp.asarray(ids, dtype=cp.int32), d_rows, (d_rows * d_rows).sum(axis=1, dtype=cp.float32))
    got = device_entries(sample, cp.asarray(q), metric_of(metric)).get()
    assert got.shape == want.shape == (queries, min(32, sample_rows))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_gpu_entry_points_where_one_lane_holds_every_far_column(metric):
    """The device bounds the nearest words by the largest of its lanes' smallest; where every column a lane
    reads (c = 31 mod 32) is far, the bound keeps nearly all 4,096 columns, and the warp's buffer must fill and be
    merged many times over: the result is still the reference's."""
    import cupy as cp

    from bigknn.backends.cuda.graph_search import nearest_entries as device_entries
    from bigknn.algorithms.search_index import nearest_entries

    rng = np.random.default_rng(7)
    s = 4096
    rows = np.zeros((s, 5), np.float32)
    rows[:, 0] = rng.integers(-3, 4, s)
    rows[31::32, 0] = -100.0  # keys: |v|^2 - 2v (l2) or -v (ip) with q = e_0, far for these columns only
    ids = np.arange(s) * 3
    q = np.zeros((65, 5), np.float32)  # 65 warps: a last block of one
    q[:, 0] = 1.0
    want = nearest_entries(np, rows, ids, q, metric_of(metric))
    d_rows = cp.asarray(rows)
    sample = (cp.asarray(ids, dtype=cp.int32), d_rows, (d_rows * d_rows).sum(axis=1, dtype=cp.float32))
    got = device_entries(sample, cp.asarray(q), metric_of(metric)).get()
    assert not np.isin(want, ids[31::32]).any()
    np.testing.assert_array_equal(got, want)
