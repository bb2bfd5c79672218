"""The lists a prune builds from edges (bigknn/search/lists.py) against a per-row brute force: distinct ids,
a repeated id with its smaller key, ascending, cut to the width, EMPTY / inf padded."""

from __future__ import annotations

import numpy as np

from bigknn.graph import EMPTY
from bigknn.search.lists import nearest_lists


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
