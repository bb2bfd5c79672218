"""The lists a prune builds from edges (bigknn/algorithms/edge_lists.py) against a per-row brute force: distinct ids,
a repeated id with its smaller key, ascending, cut to the width, EMPTY / inf padded."""

from __future__ import annotations

import numpy as np

from bigknn.core.knn_graph import EMPTY
from bigknn.algorithms.edge_lists import nearest_lists, row_chunks


def _edges_and_lists(rng, rows: int = 60, m: int = 7):
    row = rng.integers(0, rows - 5, 400)  # the last rows get no edge
    ids = rng.integers(0, 40, 400)
    _, first = np.unique(row * 1000 + ids, return_index=True)  # edges are distinct (row, id) pairs
    row, ids = row[first], ids[first]
    keys = rng.normal(size=len(row)).astype(np.float32)  # negative keys too (ip)
    l_ids = np.where(rng.random((rows, m)) < 0.8, rng.integers(0, 40, (rows, m)), EMPTY)
    l_keys = np.where(l_ids >= 0, rng.normal(size=(rows, m)), np.inf).astype(np.float32)
    return row, ids, keys, l_ids, l_keys


def _brute(rows, width, row, ids, keys, l_ids, l_keys):
    out_i, out_k = np.full((rows, width), EMPTY), np.full((rows, width), np.inf, np.float32)
    for r in range(rows):
        best: dict[int, float] = {}
        pairs = list(zip(ids[row == r], keys[row == r])) + [(i, k) for i, k in zip(l_ids[r], l_keys[r]) if i >= 0]
        for i, k in pairs:
            best[int(i)] = min(best.get(int(i), np.inf), float(k))
        got = sorted(best.items(), key=lambda e: e[1])[:width]
        out_i[r, :len(got)] = [i for i, _ in got]
        out_k[r, :len(got)] = [k for _, k in got]
    return out_i, out_k


def test_nearest_lists_keep_each_rows_nearest_distinct_ids():
    rng = np.random.default_rng(5)
    row, ids, keys, l_ids, l_keys = _edges_and_lists(rng)
    for width in (3, 12, 30):
        got = nearest_lists(np, 60, width, row, ids, keys, (l_ids, l_keys))
        want = _brute(60, width, row, ids, keys, l_ids, l_keys)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        edges_only = nearest_lists(np, 60, width, row, ids, keys)
        want = _brute(60, width, row, ids, keys, np.full_like(l_ids, EMPTY), l_keys)
        np.testing.assert_array_equal(edges_only[0], want[0])


def test_lists_sorted_in_parts_are_the_lists_sorted_at_once():
    """A capped GPU sorts a range of rows' edges at a time and merges blocks of rows: the same lists."""
    rng = np.random.default_rng(6)
    row, ids, keys, l_ids, l_keys = _edges_and_lists(rng)
    heavy = np.flatnonzero(row == 3)  # a row with more edges than a part holds gets a part of its own
    whole = nearest_lists(np, 60, 12, row, ids, keys, (l_ids, l_keys))
    for max_edges, merge in ((1, 1), (len(heavy) - 1, 7), (50, None), (len(row), 60)):
        parts = nearest_lists(np, 60, 12, row, ids, keys, (l_ids, l_keys), max_edges, merge)
        np.testing.assert_array_equal(parts[0], whole[0])
        np.testing.assert_array_equal(parts[1], whole[1])
        chunks = [(r0, r1, np.arange(len(row))[at]) for r0, r1, at in row_chunks(60, row, max_edges)]
        seen = np.concatenate([at for _, _, at in chunks])
        assert sorted(seen.tolist()) == list(range(len(row)))  # each edge in exactly one part
        for r0, r1, at in chunks:
            assert ((row[at] >= r0) & (row[at] < r1)).all()
            assert len(at) <= max_edges or r1 == r0 + 1
        assert [c[0] for c in chunks[1:]] == [c[1] for c in chunks[:-1]] and chunks[-1][1] == 60


def test_kept_columns_are_taken_row_by_row():
    from bigknn.algorithms.columns import take_columns

    rng = np.random.default_rng(7)
    cols = np.sort(rng.integers(-1, 9, (50, 6)).astype(np.int32), axis=1)[:, ::-1]  # -1 padding at the end
    for values, empty in ((rng.integers(0, 1000, (50, 9)), EMPTY), (rng.random((50, 9)).astype(np.float32), np.inf)):
        got = take_columns(values, cols, empty)
        want = np.where(cols >= 0, np.take_along_axis(values, np.maximum(cols, 0), axis=1), empty)
        assert got.dtype == values.dtype
        np.testing.assert_array_equal(got, want)
