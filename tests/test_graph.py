"""merge_lists, the per-row dedup + sort + cut that every stage shares, against a plain Python reference."""

from __future__ import annotations

import numpy as np
import pytest

from bigknn.core.knn_graph import EMPTY, merge_lists, sortable_float_bits


def reference_merge(ids: np.ndarray, dists: np.ndarray, k: int, extra: np.ndarray | None = None):
    """Row by row: drop EMPTY, keep each id's smallest key (and that copy's flag), sort ascending, cut, pad."""
    rows = ids.shape[0]
    out_ids = np.full((rows, k), EMPTY, dtype=np.int32)
    out_d = np.full((rows, k), np.inf, dtype=np.float32)
    out_e = np.zeros((rows, k), dtype=bool)
    for r in range(rows):
        best: dict[int, tuple[float, bool]] = {}
        for j in range(ids.shape[1]):
            i, d = int(ids[r, j]), float(dists[r, j])
            if i == EMPTY:
                continue
            e = bool(extra[r, j]) if extra is not None else False
            if i not in best or d < best[i][0]:
                best[i] = (d, e)
        kept = sorted(best.items(), key=lambda item: item[1][0])[:k]
        for j, (i, (d, e)) in enumerate(kept):
            out_ids[r, j], out_d[r, j], out_e[r, j] = i, d, e
    return out_ids, out_d, out_e


def random_lists(rng, rows: int, m: int, id_range: int, empty_frac: float, negative: bool):
    """Lists with many repeated ids, some EMPTY slots, and keys that are distinct within each row (so the
    sorted order is unique); a repeated id always gets a different key per copy."""
    ids = rng.integers(0, id_range, size=(rows, m)).astype(np.int32)
    ids[rng.random((rows, m)) < empty_frac] = EMPTY
    # distinct keys per row: a random permutation of a grid, scaled, optionally shifted negative (ip keys)
    keys = np.stack([rng.permutation(m) for _ in range(rows)]).astype(np.float32) * 0.25 + 0.125
    if negative:
        keys -= m * 0.125
    # EMPTY slots may carry garbage keys: the merge must ignore them
    keys[ids == EMPTY] = rng.uniform(-5, 5, size=int((ids == EMPTY).sum()))
    return ids, keys


@pytest.mark.parametrize("m,k,id_range,empty_frac,negative", [
    (40, 16, 12, 0.1, False),   # many duplicates: fewer unique ids than k in most rows -> padding
    (40, 16, 60, 0.2, True),    # negative keys (ip ordering keys are -dot)
    (64, 32, 1000, 0.0, False),  # few duplicates, no empties
    (12, 12, 5, 0.3, True),     # m == k
    (7, 7, 3, 0.5, False),      # almost everything duplicate or empty
    (33, 1, 8, 0.2, True),      # k = 1
])
def test_merge_lists_matches_reference(m, k, id_range, empty_frac, negative):
    rng = np.random.default_rng(m * 1000 + k)
    ids, keys = random_lists(rng, 300, m, id_range, empty_frac, negative)
    flags = rng.random(ids.shape) < 0.5
    got_ids, got_d, got_e = merge_lists(ids, keys, k, extra=flags)
    want_ids, want_d, want_e = reference_merge(ids, keys, k, flags)
    assert got_ids.shape == (300, k) and got_d.shape == (300, k) and got_e.shape == (300, k)
    assert got_ids.dtype == np.int32 and got_d.dtype == np.float32
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_array_equal(got_d, want_d)
    # flags are defined on kept entries only (an EMPTY slot's flag carries no meaning)
    kept = want_ids != EMPTY
    np.testing.assert_array_equal(got_e[kept], want_e[kept])
    # and without ``extra`` the same lists come back
    ids2, d2 = merge_lists(ids, keys, k)
    np.testing.assert_array_equal(ids2, want_ids)
    np.testing.assert_array_equal(d2, want_d)


def test_duplicate_keeps_the_smaller_key_wherever_it_sits():
    ids = np.array([[5, 3, 5, 3, 9], [7, 7, 7, 7, 7]], dtype=np.int32)
    d = np.array([[4.0, 2.0, 1.0, 3.0, 0.5], [3.0, 1.0, 2.0, 0.25, 5.0]], dtype=np.float32)
    flag = np.array([[1, 0, 0, 1, 1], [0, 0, 0, 1, 0]], dtype=bool)
    out_ids, out_d, out_f = merge_lists(ids, d, 3, extra=flag)
    np.testing.assert_array_equal(out_ids, [[9, 5, 3], [7, EMPTY, EMPTY]])
    np.testing.assert_array_equal(out_d, np.array([[0.5, 1.0, 2.0], [0.25, np.inf, np.inf]], np.float32))
    # the flag travels with the copy that won (the smaller key)
    np.testing.assert_array_equal(out_f[0], [True, False, False])
    assert out_f[1, 0]


def test_empty_slots_dropped_and_rows_padded():
    ids = np.array([[EMPTY, 4, EMPTY, 2], [EMPTY] * 4, [1, 1, 1, 1]], dtype=np.int32)
    d = np.array([[-9.0, 3.0, -8.0, 1.0], [0.0, 1.0, 2.0, 3.0], [2.0, 2.0, 2.0, 2.0]], dtype=np.float32)
    out_ids, out_d = merge_lists(ids, d, 6)  # k larger than the number of columns: padded
    assert out_ids.shape == (3, 6)
    np.testing.assert_array_equal(out_ids[0], [2, 4, EMPTY, EMPTY, EMPTY, EMPTY])
    np.testing.assert_array_equal(out_d[0, :2], [1.0, 3.0])
    assert np.all(np.isinf(out_d[0, 2:]))
    assert np.all(out_ids[1] == EMPTY) and np.all(np.isinf(out_d[1]))
    np.testing.assert_array_equal(out_ids[2], [1] + [EMPTY] * 5)
    assert out_d[2, 0] == 2.0 and np.all(np.isinf(out_d[2, 1:]))


def test_output_ascending_and_unique_on_large_random_input():
    rng = np.random.default_rng(7)
    ids = rng.integers(-1, 50, size=(2000, 96)).astype(np.int32)
    keys = rng.standard_normal((2000, 96)).astype(np.float32)
    out_ids, out_d = merge_lists(ids, keys, 32)
    assert np.all(np.diff(out_d, axis=1) >= 0)
    s = np.sort(out_ids, axis=1)
    assert not np.any((s[:, 1:] == s[:, :-1]) & (s[:, 1:] != EMPTY))
    assert np.all((out_ids == EMPTY) == np.isinf(out_d))
    # every kept key is the smallest key of its id in the row
    for r in range(0, 2000, 97):
        for i, d in zip(out_ids[r], out_d[r]):
            if i != EMPTY:
                assert d == keys[r][ids[r] == i].min()


def test_sortable_float_bits_orders_like_floats():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(5000).astype(np.float32) * 1e3,
                        np.array([0.0, -0.0, np.inf, -np.inf, 1e-38, -1e-38, 3.4e38, -3.4e38], np.float32)])
    codes = sortable_float_bits(x)
    assert codes.dtype == np.uint32
    order = np.argsort(codes, kind="stable")
    assert np.all(np.diff(x[order]) >= 0)
