"""The CPU exact kNN's subspace bounds (bigknn/backends/cpu/bounds.py): the same neighbours as a brute force,
most keys ruled out on data of low intrinsic dimension, and the full product kept where the bounds do not pay."""

from __future__ import annotations

import numpy as np
import pytest

import bigknn.backends.cpu.bounds as bounds_mod
import bigknn.backends.cpu.exact as exact_mod
from bigknn.backends.cpu import CpuBackend
from bigknn.core.metric import metric as metric_of

from conftest import exact_keys

DIM = 48


@pytest.fixture
def counted(monkeypatch):
    """Bounds from 40 of 48 dimensions up (8 directions), small tiles and batches, and a count of the keys the
    bounded merges computed in full in vain against the row-column pairs they saw."""
    monkeypatch.setattr(bounds_mod, "BOUND_DIMS", 8)
    monkeypatch.setattr(bounds_mod, "MIN_DIM", 40)
    monkeypatch.setattr(bounds_mod, "FILL_COLS", 200)
    monkeypatch.setattr(bounds_mod, "PILOT_ROWS", 5)
    monkeypatch.setattr(exact_mod, "TILE_COLS", 301)
    monkeypatch.setattr(exact_mod, "QUERY_ROWS", 23)
    seen = {"wasted": 0, "pairs": 0, "calls": 0}
    merge = bounds_mod.bounded_merge

    def counting(bound_dots, *args):
        wasted = merge(bound_dots, *args)
        seen["wasted"] += int(wasted)
        seen["pairs"] += bound_dots.size
        seen["calls"] += 1
        return wasted

    monkeypatch.setattr(bounds_mod, "bounded_merge", counting)
    return seen


def _low_rank(rows: int, seed: int) -> np.ndarray:
    """Rows near a 5-dimensional subspace of DIM dimensions, away from the origin, with exact duplicates."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 5)) @ rng.standard_normal((5, DIM)) + 0.01 * rng.standard_normal((rows, DIM))
    x = (x + 3.0).astype(np.float32)
    x[rows // 2:rows // 2 + 4] = x[7]  # duplicates: equal keys, listed in column order
    return x


def _assert_exact(g, q: np.ndarray, x: np.ndarray, ids: np.ndarray, k: int, metric: str) -> None:
    """``g`` holds each query's k nearest of ``x`` (global ``ids``, ascending): its keys are the k smallest, and
    each listed id's own key is among them. Rows at equal keys (the duplicates) may come in any order: a key
    computed alone and one from a BLAS product differ in their last bits."""
    keys = exact_keys(q, x, metric)
    want = np.sort(keys, axis=1)[:, :k]
    np.testing.assert_allclose(g.dists, want, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(np.take_along_axis(keys, np.searchsorted(ids, g.ids), axis=1), want,
                               rtol=1e-4, atol=1e-3)
    assert all(len(set(row)) == k for row in g.ids.tolist())


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("k", [1, 11])
def test_bounded_exact_knn_matches_brute_force_and_skips_most_keys(counted, metric, k):
    x = _low_rank(2000, seed=3)
    sizes, offsets = [1013, 7, 979, 1], [0, 5000, 7000, 12345]  # odd sizes, gaps between global ids
    cuts = np.cumsum([0] + sizes)
    blocks = [(o, x[a:b]) for o, a, b in zip(offsets, cuts, cuts[1:])]
    ids = np.concatenate([o + np.arange(len(b)) for o, b in blocks])
    q = np.concatenate([x[[3, 7, 1000, 1500]], _low_rank(60, seed=4)])  # rows of the set and new points
    g = CpuBackend().exact_knn(q, k, metric_of(metric), iter(blocks))
    _assert_exact(g, q, x, ids, k, metric)
    assert counted["calls"] > 4 and counted["wasted"] < 0.02 * counted["pairs"], counted  # the bounds did the work


def test_bounds_that_do_not_pay_hand_the_rest_to_the_full_product(counted):
    """Independent Gaussian rows: 8 of 48 directions bound nothing, so after the pilot's 5 queries every other
    key comes from the full product, and the answer is the same."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1500, DIM)).astype(np.float32)
    q = rng.standard_normal((70, DIM)).astype(np.float32)
    g = CpuBackend().exact_knn(q, 9, metric_of("l2"), [(0, x)])
    _assert_exact(g, q, x, np.arange(len(x)), 9, "l2")
    assert counted["calls"] == 1 and counted["pairs"] == 5 * 301, counted  # the pilot only


def test_subspace_bounds_never_exceed_the_keys():
    """Every bound of a random pair is at most its key, for l2 about the mean and inner products about the
    origin (the inequality the skipping rests on), rows far from the origin included."""
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((500, 300)) * rng.uniform(0.1, 5, 300) + 40).astype(np.float32)
    for metric in ("l2", "ip"):
        is_l2 = metric == "l2"
        sub = bounds_mod.Subspace.fit(x, is_l2)
        p = sub.project(x, np.einsum("ij,ij->i", x, x))
        dots = p.coords @ p.coords.T
        if is_l2:
            bound = p.norm2[:, None] + p.norm2[None, :] - 2 * dots
        else:
            bound = -dots - p.slack[:, None] - p.slack[None, :]
        keys = exact_keys(x, x, metric)
        assert np.all(bound <= keys), float(np.max(bound - keys))
