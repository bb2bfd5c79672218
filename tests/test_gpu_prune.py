"""CUDA diversification (prune.cu) against the NumPy reference (bigknn/backends/cpu/diversify.py): the same kept
columns and occlusion order up to float32 near-ties, on fresh random lists of odd widths (1 to 129, EMPTY
tails), duplicate candidates' rows, both metrics, every rule; and a whole prune on the GPU against the same
prune on the CPU. Run with ``pytest -m gpu tests/test_gpu_prune.py``."""

from __future__ import annotations

import numpy as np
import pytest

import bigknn
from bigknn.backends.cpu import CpuBackend
from bigknn.core.knn_graph import EMPTY
from bigknn.algorithms.search_params import DiversifyRule
from bigknn.operations.search_arrays import load_index
from bigknn.shards import Store
from bigknn.core.metric import L2, metric as metric_of

from conftest import ranked_candidates

pytestmark = pytest.mark.gpu

RULES = [DiversifyRule("rng"), DiversifyRule("gd", 1.0), DiversifyRule("gd", 1.2), DiversifyRule("occlusion")]


def _lists(rng, metric: str, rows: int, width: int, n: int = 3001, dim: int = 29):
    table = rng.normal(size=(n, dim)).astype(np.float32)
    table[n // 2:n // 2 + 50] = table[:50]  # duplicate rows: zero pair keys
    if metric == "ip":
        table /= np.linalg.norm(table, axis=1, keepdims=True)
    cands, keys, at = ranked_candidates(rng, table, metric, rows, width)
    twin = ((table[np.where(cands >= 0, cands, 0)] == table[at][:, None, :]).all(axis=2) & (cands >= 0)).any(axis=1)
    return table, cands, keys, twin


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.kind}-{r.alpha}")
@pytest.mark.parametrize("rows,width", [(1, 1), (257, 33), (1001, 64), (99, 129)])
def test_gpu_diversify_matches_the_reference(cuda_backend, metric, rule, rows, width):
    rng = np.random.default_rng(rows * 1000 + width)
    table, cands, keys, twin = _lists(rng, metric, rows, width)
    cut = max(1, width // 2)  # lists cut short of the candidates: the device's sort must rank before it cuts
    want = CpuBackend(reference=True).diversify_lists(cands, keys, table, metric_of(metric), rule, cut)
    got = cuda_backend.diversify_lists(cands, keys, table, metric_of(metric), rule, cut)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
    cols = got[0]
    assert (np.take_along_axis(cands, np.maximum(cols, 0), axis=1)[cols >= 0] >= 0).all()  # no EMPTY kept
    # ip has no twin rule: a row's twin ties exactly with every later candidate, which rounding decides
    judged = ~twin if metric == "ip" else np.ones(rows, bool)
    same = ((got[0] == want[0]) & (got[1] == want[1])).all(axis=1)[judged].mean()
    assert same >= 0.98, same  # float32 pair keys may decide a near-tie the other way
    # and the table stays on the device for the next call with the same table
    arrays = cuda_backend._prune_table.arrays
    cuda_backend.diversify_lists(cands[:1], keys[:1], table, metric_of(metric), rule, cut)
    assert cuda_backend._prune_table.arrays is arrays


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.kind}-{r.alpha}")
def test_a_capped_gpu_diversifies_alike_with_the_rows_each_block_names(cuda_backend, monkeypatch, rule):
    from bigknn.backends.cuda import diversify as prune

    table, cands, keys, _ = _lists(np.random.default_rng(11), "l2", 700, 48)
    whole = cuda_backend.diversify_lists(cands, keys, table, L2, rule, 40)
    monkeypatch.setattr(prune, "BLOCK_BYTES", 48 * (12 + 4 * 29) * 100)  # blocks of 100 rows
    monkeypatch.setattr(cuda_backend.gpu, "budget", lambda: 4 * table.size)  # half of it holds half the table
    capped = cuda_backend.diversify_lists(cands, keys, table.copy(), L2, rule, 40)  # a table the device lacks
    for c, w in zip(capped, whole):
        np.testing.assert_array_equal(c, w)


@pytest.mark.parametrize("method", ["tsdg", "rng"])
def test_gpu_prune_matches_the_cpu_prune(tmp_path, cuda_backend, method):
    """Both ways the GPU prunes (tsdg: the whole graph on the device, algorithms/tsdg_whole.py; shard by shard where the
    host budget holds no whole copy of the rows) against the CPU's."""
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(15, 24))[rng.integers(0, 15, 2500)] * 2 + rng.normal(size=(2500, 24))).astype(np.float32)
    graphs = {}
    for backend, host_mem in (("cpu", None), ("cuda", None), ("cuda", 1)):
        path = tmp_path / f"{backend}-{host_mem}.knn"
        with bigknn.build(x, k=20, store=path, backend="cpu", shard_rows=900, seed=1) as g:
            g.prune(method, degree=20, backend=backend, host_mem=host_mem)
        st = Store.open(path)
        graphs[backend, host_mem] = load_index(st, L2)[0]
        st.close()
    for way in (("cuda", None), ("cuda", 1)):
        same = (graphs["cpu", None].ids == graphs[way].ids).all(axis=1).mean()
        assert same >= 0.98, (way, same)


def test_gpu_nearest_lists_match_the_reference(cuda_backend, monkeypatch):
    from bigknn.backends.cpu.search_calls import SearchReference
    from bigknn.backends.cuda import diversify as prune

    rng = np.random.default_rng(12)
    rows, m, edges = 5000, 40, 150_000
    row, ids = rng.integers(0, rows, edges), rng.integers(0, rows, edges)
    _, first = np.unique(row * rows + ids, return_index=True)
    row, ids = row[first], ids[first]
    keys = rng.random(len(row)).astype(np.float32)
    l_ids = np.where(rng.random((rows, m)) < 0.9, rng.integers(0, rows, (rows, m)), EMPTY)
    l_keys = np.where(l_ids >= 0, rng.random((rows, m)), np.inf).astype(np.float32)
    for lists in ((l_ids, l_keys), None):
        want = SearchReference().nearest_lists(rows, 48, row, ids, keys, lists)
        got = cuda_backend.nearest_lists(rows, 48, row, ids, keys, lists)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    # a capped GPU sorts the edges of consecutive rows in parts (about 12 here)
    monkeypatch.setattr(cuda_backend.gpu, "budget", lambda: 2 * prune.EDGE_BYTES * len(row) // 12)
    for lists in ((l_ids, l_keys), None):
        want = SearchReference().nearest_lists(rows, 48, row, ids, keys, lists)
        got = cuda_backend.nearest_lists(rows, 48, row, ids, keys, lists)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_gpu_reach_back_matches_the_reference(cuda_backend):
    from bigknn.backends.cpu.diversify import reach_back

    rng = np.random.default_rng(13)
    n, w = 4000, 16
    table = rng.normal(size=(n, 7)).astype(np.float32)
    lists = np.stack([rng.choice(n, size=w, replace=False) for _ in range(n)]).astype(np.int64)
    lists[::5, -3:] = EMPTY
    x, z = rng.integers(0, n, 50_000), rng.integers(0, n, 50_000)
    x[:20_000] = lists[z[:20_000], 0]  # requests with paths back
    want = reach_back(table, lists, lists, x, z, z)
    np.testing.assert_array_equal(cuda_backend.reach_back(table, lists, lists, x, z, z), want)
    assert 0 < want.sum() < len(want)
