"""CUDA GGM's seeded merges (an ingest's batch folded into old shards through the shards already merged with it)
and recall-targeted merges, each against the CPU reference.

Every test is marked ``gpu`` and skips cleanly where CuPy or a CUDA device is missing
(run them with ``pytest -m gpu tests/test_gpu_ggm_seeded.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

from bigknn.core.knn_graph import KnnGraph, ShardPart
from bigknn.core.params import GnndParams
from bigknn.core.synth import synth
from bigknn.core.metric import L2, metric as metric_of

from conftest import check_graph, exact_neighbours, fold_in, merged_shards, recall_at
from test_gpu_ggm import _check, _quantise_u8, shifted

pytestmark = pytest.mark.gpu


def _ingest_case(rows: int, nb: int, dim: int, params: GnndParams, dtype=np.float32):
    """Three merged old shards of ``rows`` (built on the CPU) and a batch of ``nb`` rows with its graph."""
    from bigknn.backends.cpu import CpuBackend

    x = synth(3 * rows + nb, dim, seed=int(np.random.default_rng().integers(1 << 30)))
    if dtype == np.uint8:
        x = _quantise_u8(x)
    cpu = CpuBackend(reference=True)
    old = merged_shards(cpu, x[:3 * rows], rows, params)
    batch = ShardPart(3 * rows, x[3 * rows:], shifted(cpu.gnnd(x[3 * rows:], L2, params, seed=9), 3 * rows))
    return x, old, batch


@pytest.mark.parametrize("dim,dtype", [(37, np.float32), (64, np.uint8)])
def test_seeded_setup_takes_the_cpu_seeds(cuda_backend, dim, dtype):
    """With no descent (merge_iters 0) a seeded merge's result is its set-up folded back: rows of a keep
    their lists exactly (no fill), and each row of b gains exactly the seeds the CPU reference picks
    (two hops through two vias, in the same order) wherever those fill the row's W/2 slots."""
    from bigknn.backends.cpu import CpuBackend
    from bigknn.algorithms.merge_setup import fill_count, seeds_through

    built = GnndParams(k=16, list_width=32)
    params = GnndParams(k=16, list_width=32, merge_iters=0)
    x, old, batch = _ingest_case(2501, 301, dim, built, dtype)
    a = old[1]
    # b has met old[0] and old[2] (as after an ingest's first merges)
    vias, b = [], batch
    for k, old_part in enumerate((old[0], old[2])):
        g_old, g_b = CpuBackend(reference=True).ggm(old_part, b, L2, built, seed=1 + k)
        vias.append(ShardPart(old_part.offset, old_part.vectors, g_old))
        b = ShardPart(b.offset, b.vectors, g_b)
    ga, gb = cuda_backend.ggm(a, b, L2, params, seed=2, vias=vias)
    assert cuda_backend.last_stats["seeded"] == 2
    np.testing.assert_array_equal(ga.dists, a.graph.dists)  # ids of equal keys may swap places
    np.testing.assert_array_equal(np.sort(ga.ids, axis=1), np.sort(a.graph.ids, axis=1))
    seeds = seeds_through(b, a, vias, fill_count(32))
    full = (seeds >= 0).all(axis=1)
    assert full.mean() > 0.5, "the case is meaningful: most rows of b find W/2 seeds"
    for r in np.nonzero(full)[0]:
        got = {int(i) for i in gb.ids[r] if a.offset <= i < a.offset + a.graph.rows}
        want = set((seeds[r] + a.offset).tolist())
        # the fold-back keeps the best W of old list + seeds: every kept a-entry is a seed, and every seed
        # closer than the row's W-th key is kept
        assert got <= want, f"row {r}: a-entries that are not seeds: {sorted(got - want)}"
        keys = dict(zip(gb.ids[r].tolist(), gb.dists[r].tolist()))
        kth = gb.dists[r, -1]
        xs = np.asarray(x, np.float64)
        for s in want - got:
            d = ((xs[b.offset + r] - xs[s]) ** 2).sum()
            assert d >= kth * (1 - 1e-4), f"row {r}: seed {s} at {d} dropped below the W-th key {kth}"
        assert all(np.isfinite(v) for v in keys.values())
    _check(gb.ids, gb.dists, x, "l2", first_id=b.offset, allow_empty=True)


def test_seeded_merges_match_cpu(cuda_backend):
    """An ingest's merges (batch against three old shards, the 2nd and 3rd seeded): new and old rows reach
    the CPU reference's recall, old lists only improve, and the seeded merges insert far fewer entries."""
    from bigknn.backends.cpu import CpuBackend

    params = GnndParams(k=32, list_width=48)
    x, old, batch = _ingest_case(6001, 700, 96, params)
    rng = np.random.default_rng(3)
    samples = {"old": np.sort(rng.choice(3 * 6001, 500, replace=False)), "new": np.arange(3 * 6001, 3 * 6001 + 700)}
    truth = {k: exact_neighbours(x, r, 10) for k, r in samples.items()}
    got = {}
    for name, be in (("cuda", cuda_backend), ("cpu", CpuBackend(reference=True))):
        parts, b, updates = fold_in(be, old, batch, params, seeded=True)
        ids = np.concatenate([p.graph.ids for p in parts] + [b.graph.ids])
        check_graph(ids, np.concatenate([p.graph.dists for p in parts] + [b.graph.dists]), x, "l2")
        for before, after in zip(old, parts):
            assert np.all(after.graph.dists <= before.graph.dists)
        got[name] = {k: recall_at(ids[r], x, r, 10, truth=truth[k]) for k, r in samples.items()}
        got[name]["work"] = [sum(u) for u in updates]
    print(f"GGMTEST seeded ingest: {got}")
    for k in samples:
        assert got["cuda"][k] >= got["cpu"][k] - 0.01 and got["cuda"][k] >= 0.95, (k, got)
    w = got["cuda"]["work"]
    assert max(w[1:]) < 0.5 * w[0], f"seeded merges inserted {w[1:]} entries, the first (paper) merge {w[0]}"


# ----------------------------------------------------------------------------- recall-targeted merges
@pytest.mark.parametrize("dim,metric", [(200, "l2"), (384, "ip"), (96, "l2")])
def test_targeted_merge_meets_target_and_matches_cpu(cuda_backend, dim, metric):
    """A merge with the default target (0.99) on fresh data: it stops on the target (wide float32 rows go
    through the half-precision descent, whose keys the fold-back makes exact), reaches the recall of a
    one-shard build, and the CPU reference with the same parameters reaches the same."""
    from bigknn.backends.cpu import CpuBackend
    from bigknn.backends.cuda import rows as cuda_module

    na, nb = 6007, 5003
    x = synth(na + nb, dim, seed=int(np.random.default_rng().integers(1 << 30)))
    if metric == "ip":
        x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    params = GnndParams(k=10)
    a = ShardPart(0, x[:na], cuda_backend.gnnd(x[:na], metric_of(metric), params, seed=1))
    b = ShardPart(na, x[na:], shifted(cuda_backend.gnnd(x[na:], metric_of(metric), params, seed=2), na))
    ma, mb = cuda_backend.ggm(a, b, metric_of(metric), params, seed=3)
    assert cuda_backend.last_stats["half"] == (dim >= cuda_module.HALF_MIN_DIM)
    # a merge of small 96-d shards can stall at the widest lists; it then returns the pair's exact lists
    assert ma.report["stop"].startswith("target met") or ma.report["stop"].startswith("exact graph"), ma.report
    ids, dists = np.concatenate([ma.ids, mb.ids]), np.concatenate([ma.dists, mb.dists])
    _check(ids, dists, x, metric)
    rows = np.sort(np.random.default_rng(7).choice(na + nb, 1000, replace=False))
    truth = exact_neighbours(x, rows, 10, metric)
    r_gpu = recall_at(ids[rows], x, rows, 10, metric, truth=truth)
    ca, cb = CpuBackend(reference=True).ggm(a, b, metric_of(metric), params, seed=3)
    r_cpu = recall_at(np.concatenate([ca.ids, cb.ids])[rows], x, rows, 10, metric, truth=truth)
    assert r_gpu >= 0.985 and abs(r_gpu - r_cpu) <= 0.01, (r_gpu, r_cpu, ma.report)


@pytest.mark.parametrize("dim, dtype", [(64, np.float32), (130, np.float32), (33, np.uint8)])
def test_merge_that_falls_short_gives_the_pairs_exact_lists(cuda_backend, dim, dtype):
    """iid rows, 2 merge iterations: the merge ends far below its target, and the CUDA cuda_backend (like the CPU
    one) returns each row's old list united with its exact neighbours in the other shard."""
    from bigknn.backends.cpu import CpuBackend

    rng = np.random.default_rng()
    x = rng.standard_normal((2 * 2203 + 1, dim)) * (40 if dtype == np.uint8 else 1)
    x = (np.clip(x + 128, 0, 255) if dtype == np.uint8 else x).astype(dtype)
    na = 2203
    cpu = CpuBackend(reference=True)
    parts = []
    for off, part in ((0, x[:na]), (na, x[na:])):
        g = cpu.exact_knn(part, 11, L2, [(off, part)])
        parts.append(ShardPart(off, part, KnnGraph(g.ids[:, 1:], g.dists[:, 1:])))
    params = GnndParams(k=10, recall=0.99, merge_iters=2)
    ga, gb = cuda_backend.ggm(parts[0], parts[1], L2, params, seed=4)
    assert ga.report["stop"].startswith("exact graph"), ga.report
    truth = cpu.exact_knn(x, 11, L2, [(0, x)])
    got = np.concatenate([ga.dists, gb.dists])  # lists of params.width(): the first 10 are the answer
    np.testing.assert_allclose(got[:, :10], truth.dists[:, 1:], rtol=1e-4, atol=1e-3)
