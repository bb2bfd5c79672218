"""The near-duplicate threshold compared in key space (``Metric.key_at_most``) selects exactly the entries the
distance comparison selects, float rounding and cosine's clip at 0 included; and the streamed components equal
a straightforward reference (the lists' distances thresholded, scipy's components) at thresholds that are
distances the graph holds, where rounding decides."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse import csgraph

import bigknn
from bigknn.core.metric import METRICS, metric


def keys_around(bound: np.float32, steps: int = 3000) -> np.ndarray:
    """Float32 keys ``steps`` ulps either side of ``bound`` (where it is finite), plus a spread of keys of
    every magnitude and sign, and the infinities."""
    rng = np.random.default_rng(0)
    spread = (rng.choice([-1.0, 1.0], 4000) * 10.0 ** rng.uniform(-40, 38, 4000)).astype(np.float32)
    fixed = np.array([-np.inf, -2.0, -1.0, -0.5, -0.0, 0.0, 1e-30, 0.5, 1.0, 2.0, np.inf], np.float32)
    parts = [spread, fixed]
    if np.isfinite(bound):
        near = np.full(steps, bound, np.float32)
        up, down = near.copy(), near.copy()
        for i in range(1, steps):
            up[i] = np.nextafter(up[i - 1], np.float32(np.inf))
            down[i] = np.nextafter(down[i - 1], np.float32(-np.inf))
        parts += [up, down]
    return np.concatenate(parts)


@pytest.mark.parametrize("name", METRICS)
@pytest.mark.parametrize("max_distance", [0.0, 1e-30, 1e-7, 1e-4, 0.01, 0.1, 1 / 3, 0.5, 1.0, 1.5, 2.0, 7.25, 1e20,
                                          3.5e38, 1e300, -0.25, -1.0, -1e-30])
def test_key_bound_selects_what_the_distance_selects(name, max_distance):
    m = metric(name)
    with np.errstate(over="ignore"):
        bound = m.key_at_most(max_distance)
        keys = keys_around(bound)
        by_distance = m.distance(keys) <= max_distance
    assert bound.dtype == np.float32
    np.testing.assert_array_equal(keys <= bound, by_distance)
    if np.isfinite(bound):  # the bound itself is in, the next key out: it is the largest that qualifies
        assert m.distance(np.array([bound]))[0] <= max_distance
        with np.errstate(over="ignore"):  # the largest finite key's next is infinity
            above = np.nextafter(bound, np.float32(np.inf))
            assert not m.distance(np.array([above]))[0] <= max_distance


@pytest.mark.parametrize("name", METRICS)
def test_key_bound_edge_cases(name):
    m = metric(name)
    assert np.isnan(m.key_at_most(float("nan")))  # nothing is within NaN
    at_zero = m.key_at_most(0.0)
    if m.dot_keys:  # 1 + key <= 0: every key at or under -1 (cosine clips those to 0, ip leaves them negative)
        assert at_zero == np.float32(-1.0)
    else:  # sqrt(max(key, 0)) <= 0: keys at or under 0, the negatives float rounding makes included
        assert at_zero == np.float32(0.0)
    if name == "ip":  # ip's distances go negative on rows longer than 1
        assert m.key_at_most(-0.5) == np.float32(-1.5)
    else:  # Euclidean and clipped cosine distances never do
        assert np.isnan(m.key_at_most(-0.5))
    assert m.key_at_most(1e300) == np.float32(np.inf)  # beyond float32: every key but NaN


def reference_labels(g, max_distance: float, k: int | None) -> np.ndarray:
    """Components of the list entries whose distance (``Graph.neighbors``) is <= max_distance, each labelled
    by its lowest row: the plain definition, over the whole graph in memory."""
    ids, dists = g.neighbors(k=k)
    rows = np.repeat(np.arange(len(ids)), ids.shape[1])
    near = ((dists <= max_distance) & (ids >= 0)).ravel()
    n = len(ids)
    adj = sp.csr_matrix((np.ones(near.sum()), (rows[near], ids.ravel()[near])), shape=(n, n))
    _, labels = csgraph.connected_components(adj, directed=False)
    lowest = np.full(labels.max() + 1, n)
    np.minimum.at(lowest, labels, np.arange(n))
    return lowest[labels]


def rows_with_ties(name: str, seed: int) -> np.ndarray:
    """Random rows with exact duplicates (distance 0, or cosine's rounding of it), scaled copies (the same
    direction: cosine distance about 0, another l2 and ip distance) and copies at one offset (several pairs
    at one distance)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(600, 6)).astype(np.float32)
    if name == "ip":
        x /= 2.0 * np.linalg.norm(x, axis=1, keepdims=True)  # short rows: ip distances 1 - x.y stay >= 0
    step = np.zeros(6, np.float32)
    step[0] = 0.0625
    return np.concatenate([x, x[:30], 3.0 * x[30:60], x[60:90] + step, x[60:90] + 2 * step])


@pytest.mark.parametrize("name", METRICS)
@pytest.mark.parametrize("k", [1, 5])
def test_components_equal_the_reference_at_distances_the_graph_holds(tmp_path, name, k):
    x = rows_with_ties(name, seed=5 + k)
    with bigknn.build(x, k=k, metric=name, backend="cpu", shard_rows=250, store=tmp_path / "g.knn") as g:
        _, dists = g.neighbors()
        held = np.unique(dists[dists >= 0])
        picks = [0.0, *held[:: max(1, len(held) // 12)], held[-1]]
        thresholds = {float(t) for p in picks for t in
                      (p, np.nextafter(np.float32(p), np.float32(-1)), np.nextafter(np.float32(p), np.float32(9)))
                      if t >= 0}
        for max_distance in sorted(thresholds):
            for kk in {None, 1}:
                want = reference_labels(g, max_distance, kk)
                np.testing.assert_array_equal(g.components(max_distance, k=kk).labels, want,
                                              err_msg=f"{name} k={k} first {kk} at {max_distance!r}")
        assert (g.components(0.0).counts >= 2).any()  # the duplicates: a threshold of 0 has work to do


def test_unions_from_many_threads_give_the_lowest_row_of_each_component():
    """Blocks of random near entries united on 8 threads at once (the lock-free links racing on shared roots)
    give scipy's components, each labelled by its lowest row, as one thread does."""
    from concurrent.futures import ThreadPoolExecutor

    from bigknn.products.unionfind import flatten, unite_near

    rng = np.random.default_rng(3)
    n, k = 20_000, 4
    ids = rng.integers(-1, n, size=(n, k)).astype(np.int32)  # -1: EMPTY, skipped
    keys = rng.uniform(0, 1, size=(n, k)).astype(np.float32)
    keys[rng.random((n, k)) < 0.1] = 0.3  # entries exactly at the bound are in
    keys.sort(axis=1)  # ascending along each list, as stores hold them
    bound = np.float32(0.3)
    near = (keys <= bound) & (ids >= 0)
    rows = np.repeat(np.arange(n), k).reshape(n, k)
    _, scipy_labels = csgraph.connected_components(
        sp.csr_matrix((np.ones(near.sum()), (rows[near], ids[near])), shape=(n, n)), directed=False)
    lowest = np.full(n, n)
    np.minimum.at(lowest, scipy_labels, np.arange(n))
    for threads, block in ((1, n), (8, 97)):
        parent = np.arange(n, dtype=np.int64)
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda lo: unite_near(parent, ids[lo:lo + block], keys[lo:lo + block], k, bound, lo),
                          range(0, n, block)))
        flatten(parent)
        np.testing.assert_array_equal(parent, lowest[scipy_labels], err_msg=f"{threads} threads")


def test_a_damaged_graph_chunk_stops_the_groups(tmp_path):
    """A chunk that fails its checksum, read on one of the threads, is raised as damage naming its file."""
    from bigknn.core.errors import Damaged

    x = rows_with_ties("l2", seed=1)
    path = tmp_path / "g.knn"
    bigknn.build(x, k=4, backend="cpu", shard_rows=250, store=path).close()
    chunk = sorted(path.glob("shards/1/graph/*/dists/c/0/0"))[-1]
    data = bytearray(chunk.read_bytes())
    data[0] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with bigknn.open(path) as g, pytest.raises(Damaged, match="checksum"):
        g.components(0.5)
