"""The near-duplicate groups' columns and counts, computed on every core (bigknn/products/components.py), against
a plain NumPy reference: by group, then row; the kept row first in each group; the same for any number of
parts (cores) and for groups of every size, a row in no group, and no rows at all."""

from __future__ import annotations

import numpy as np
import pytest

from bigknn.products import components as C
from bigknn.products import unionfind


def lowest_labels(rng: np.random.Generator, n: int, unions: int) -> np.ndarray:
    """Each row's group as its lowest row, from random unions (what components() produces)."""
    parent = np.arange(n)

    def root(a: int) -> int:
        while parent[a] != a:
            a = parent[a]
        return a

    for a, b in rng.integers(0, n, size=(unions, 2)) if n else []:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return np.array([root(i) for i in range(n)], np.int64)


def reference(labels: np.ndarray) -> tuple[np.ndarray, ...]:
    counts = np.bincount(labels, minlength=len(labels))
    rows = np.flatnonzero(counts[labels] >= 2)
    rows = rows[np.lexsort((rows, labels[rows]))]
    return rows, labels[rows], labels[rows] == rows, counts[labels[rows]]


@pytest.mark.parametrize("n,unions", [(0, 0), (1, 0), (2, 1), (9, 3), (1000, 300), (1000, 2000), (5000, 2600)])
@pytest.mark.parametrize("parts", [1, 2, 3, 8])
def test_group_columns_match_the_reference_for_any_number_of_parts(n, unions, parts, monkeypatch):
    monkeypatch.setattr(C, "WRITE_ROWS", 97)  # several slices, the last one short
    labels = lowest_labels(np.random.default_rng(n + unions), n, unions)
    counts = C._group_counts(labels)
    np.testing.assert_array_equal(counts, np.bincount(labels, minlength=n))
    rows = C._counting_sort(labels, counts, parts)
    slices = list(C._column_slices(rows, labels, counts))
    assert all(len(s[0]) <= C.WRITE_ROWS for s in slices)
    for g, want in zip(zip(*slices), reference(labels)):
        np.testing.assert_array_equal(np.concatenate(g), want)


def test_the_summary_counts_groups_rows_and_the_largest():
    labels = lowest_labels(np.random.default_rng(4), 3000, 1400)
    s = C.Components(labels, 0.5).summary()
    counts = np.bincount(labels, minlength=len(labels))
    assert s["groups"] == int((counts >= 2).sum()) > 0
    assert s["rows_in_groups"] == int(counts[counts >= 2].sum())
    assert s["largest_group"] == int(counts.max()) >= 3
    assert s["rows_kept"] == int(np.count_nonzero(counts)) == 3000 - s["rows_removed"]


@pytest.mark.parametrize("n", [0, 1, 7, 100_003])
def test_singletons_are_each_rows_own_root(n):
    np.testing.assert_array_equal(unionfind.singletons(n), np.arange(n))
