"""CPU GGM (paper 000 §5.1): merging two shard graphs reaches the quality of one graph of the union, keeps
global ids, and keeps entries that point into shards outside the pair."""

from __future__ import annotations

import numpy as np
import pytest

from bigknn.backends import ShardPart
from bigknn.backends.cpu import CpuBackend
from bigknn.graph import KnnGraph
from bigknn.params import GnndParams
from bigknn.synth import synth

from conftest import check_graph, exact_neighbours, recall_at


def shifted(g: KnnGraph, offset: int) -> KnnGraph:
    ids = np.where(g.ids >= 0, g.ids.astype(np.int64) + offset, -1).astype(np.int32)
    return KnnGraph(ids, g.dists.copy())


@pytest.fixture(scope="module")
def backend():
    return CpuBackend()


@pytest.mark.parametrize("k", [32])
def test_two_shard_merge_matches_one_shard_build(backend, k):
    n, half = 20_000, 10_000
    x = synth(n, 32, seed=100 + k)
    params = GnndParams(k=k)
    ga = backend.gnnd(x[:half], "l2", params, seed=1)
    gb = shifted(backend.gnnd(x[half:], "l2", params, seed=2), half)
    ma, mb = backend.ggm(ShardPart(0, x[:half], ga), ShardPart(half, x[half:], gb), "l2", params, seed=3)
    merged_ids = np.concatenate([ma.ids, mb.ids])
    merged_d = np.concatenate([ma.dists, mb.dists])
    assert merged_ids.shape == (n, ga.ids.shape[1])
    check_graph(merged_ids, merged_d, x, "l2")
    # a merge only ever improves a list: the j-th key never grows
    assert np.all(ma.dists <= ga.dists) and np.all(mb.dists <= gb.dists)
    # lists now reach into the other shard
    assert (ma.ids >= half).mean() > 0.3 and (mb.ids < half).mean() > 0.3

    whole = backend.gnnd(x, "l2", params, seed=4)
    rows = np.sort(np.random.default_rng(k).choice(n, 1000, replace=False))
    truth = exact_neighbours(x, rows, 10)
    r_merged = recall_at(merged_ids[rows], x, rows, 10, truth=truth)
    r_whole = recall_at(whole.ids[rows], x, rows, 10, truth=truth)
    assert r_merged >= r_whole - 0.01, f"merged recall@10 {r_merged:.4f} vs one-shard {r_whole:.4f} (k={k})"


def test_merge_keeps_entries_of_a_third_shard(backend):
    """a is merged with c first, so a's lists point into c; merging a with b must keep those c entries that
    are still among the top-k, with global ids throughout."""
    rows = 4000
    x = synth(3 * rows, 24, seed=7)
    offs = {"a": 0, "b": rows, "c": 2 * rows}
    xs = {s: x[o:o + rows] for s, o in offs.items()}
    params = GnndParams(k=16)
    g = {s: shifted(backend.gnnd(xs[s], "l2", params, seed=i), offs[s]) for i, s in enumerate("abc")}
    part = lambda s: ShardPart(offs[s], xs[s], g[s])  # noqa: E731

    a1, c1 = backend.ggm(part("a"), part("c"), "l2", params, seed=10)
    in_c = (a1.ids >= offs["c"])
    assert in_c.mean() > 0.2  # the setup is meaningful: a's lists do point into c
    g["a"], g["c"] = a1, c1
    a2, b2 = backend.ggm(part("a"), part("b"), "l2", params, seed=11)

    check_graph(a2.ids, a2.dists, x, "l2", first_id=0)
    check_graph(b2.ids, b2.dists, x, "l2", first_id=rows)
    assert np.all(a2.dists <= a1.dists)  # only improvements
    # b never met c: its ids lie in a or b
    assert b2.ids.max() < offs["c"]
    # every c entry of a1 whose key is below a2's last key must still be listed, with the same key
    kth = a2.dists[:, -1]
    for r in range(rows):
        keep = in_c[r] & (a1.dists[r] < kth[r])
        listed = dict(zip(a2.ids[r].tolist(), a2.dists[r].tolist()))
        for i, d in zip(a1.ids[r][keep].tolist(), a1.dists[r][keep].tolist()):
            assert i in listed, f"row {r}: neighbour {i} of shard c (key {d}) was dropped"
            assert listed[i] == d
    assert (a2.ids >= offs["c"]).mean() > 0.1  # c entries did survive in bulk

    # after a-c, a-b and b-c, every row holds its top-k over all three shards
    g["a"], g["b"] = a2, b2
    b3, c3 = backend.ggm(part("b"), part("c"), "l2", params, seed=12)
    ids = np.concatenate([a2.ids, b3.ids, c3.ids])
    sample = np.sort(np.random.default_rng(0).choice(3 * rows, 600, replace=False))
    r = recall_at(ids[sample], x, sample, 10)
    assert r >= 0.95, f"recall@10 after all three merges {r:.4f}"


def test_merge_ip_metric(backend):
    n, half = 8000, 3000  # unequal shards
    x = synth(n, 32, seed=9)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    params = GnndParams(k=16)
    ga = backend.gnnd(x[:half], "ip", params, seed=1)
    gb = shifted(backend.gnnd(x[half:], "ip", params, seed=2), half)
    ma, mb = backend.ggm(ShardPart(0, x[:half], ga), ShardPart(half, x[half:], gb), "ip", params, seed=3)
    ids, d = np.concatenate([ma.ids, mb.ids]), np.concatenate([ma.dists, mb.dists])
    check_graph(ids, d, x, "ip")
    rows = np.sort(np.random.default_rng(1).choice(n, 500, replace=False))
    r = recall_at(ids[rows], x, rows, 10, "ip")
    assert r >= 0.95, f"ip merged recall@10 {r:.4f}"
