"""Recall-targeted builds on the CPU (bigknn/algorithms/recall_target.py, bigknn/engine/recall_sample.py): the
descent meeting its target or taking the exact graph, merges that fall short, and the estimate a build records
against `bigknn eval recall`. The estimate and the stop rules themselves: tests/test_recall.py."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from bigknn.backends.cpu import CpuBackend
from bigknn.core.knn_graph import KnnGraph, ShardPart
from bigknn.core.params import GnndParams
from bigknn.algorithms import recall_target as recall
from bigknn.algorithms.recall_target import ESTIMATE_ROWS, PROBE_ROWS, make_merge_probe
from bigknn.core.synth import synth
from bigknn.core.metric import L2
from conftest import exact_neighbours, recall_at, run_json, write_synth


# ---- the CPU descent ---------------------------------------------------------------------------
def test_cpu_gnnd_meets_its_target_where_fixed_rules_fall_short():
    # iid rows: the RP trees' start leaves two fixed iterations short (on clustered synth they need none)
    x = np.random.default_rng(int(np.random.default_rng().integers(1 << 30))).normal(size=(6007, 48)).astype(np.float32)
    rows = np.sort(np.random.default_rng(2).choice(len(x), 500, replace=False))
    truth = exact_neighbours(x, rows, 10)
    fixed = CpuBackend().gnnd(x, L2, GnndParams(k=10, recall=0, iters=2), seed=1)
    g = CpuBackend().gnnd(x, L2, GnndParams(k=10, recall=0.99), seed=1)
    r_fixed = recall_at(fixed.ids[rows], x, rows, 10, truth=truth)
    r = recall_at(g.ids[rows], x, rows, 10, truth=truth)
    assert fixed.report is None and g.report["stop"].startswith("target met")
    assert r >= 0.985 > r_fixed, (r, r_fixed, g.report)
    assert abs(r - g.report["estimate"]["recall"]) <= 0.015
    assert g.ids.shape == (len(x), GnndParams(k=10).width())


def test_cpu_gnnd_falls_back_to_the_exact_graph_where_descent_stalls():
    x = np.random.default_rng().standard_normal((3001, 96)).astype(np.float32)  # iid: no structure to descend
    params = GnndParams(k=5, recall=0.999, iters=200)
    g = CpuBackend().gnnd(x, L2, params, seed=3)
    rows = np.arange(300)
    truth = exact_neighbours(x, rows, 10)
    assert g.ids.shape == (len(x), params.width())
    assert g.report["stop"].startswith("target met") or g.report["stop"].startswith("exact graph"), g.report
    assert recall_at(g.ids[rows], x, rows, 10, truth=truth) >= 0.995


def test_cpu_gnnd_keeps_its_lists_where_the_exact_graph_is_dear(monkeypatch):
    """The CPU prices the exact graph by its probe's own exact search, scaled from the probe's rows to all
    rows: where that costs more than EXACT_AFFORD times the descent (here a search slowed by 0.3 s a call), a
    descent that fell short keeps its lists -- a stalled 1M-row shard must not compute its exact graph for
    hours -- and the report says what the exact graph would have cost."""
    import bigknn.backends.cpu as cpu

    search = cpu.exact_knn

    def slowed(*args):
        time.sleep(0.3)
        return search(*args)

    monkeypatch.setattr(cpu, "exact_knn", slowed)
    # affording a tenth of the descent, not EXACT_AFFORD times it: two iterations on a loaded machine (CI beside
    # other jobs) took long enough to afford the slowed search
    monkeypatch.setattr(recall, "EXACT_AFFORD", 0.1)
    x = np.random.default_rng(7).standard_normal((4001, 32)).astype(np.float32)
    g = CpuBackend().gnnd(x, L2, GnndParams(k=10, recall=0.999, iters=2), seed=3)
    rep = g.report
    assert rep["stop"] == "iteration cap" and rep["estimate"]["high"] < 0.999, rep  # fell short, lists kept
    assert rep["exact_s"] >= 0.3 * len(x) / PROBE_ROWS and rep["exact_s"] > 0.1 * rep["spent_s"] > 0, rep


def test_cpu_merge_that_falls_short_gives_the_pairs_exact_lists():
    """iid rows, a merge capped at 2 iterations: far below its target, so the merge's lists become each row's
    old list united with its exact neighbours in the other shard -- the exact graph of both shards."""
    x = np.random.default_rng().standard_normal((2 * 2101, 64)).astype(np.float32)
    na = 2101
    exact = CpuBackend().exact_knn
    halves = []
    for off, part in ((0, x[:na]), (na, x[na:])):
        g = exact(part, 11, L2, [(off, part)])  # each shard's exact graph (self first, dropped)
        halves.append(ShardPart(off, part, KnnGraph(g.ids[:, 1:], g.dists[:, 1:])))
    params = GnndParams(k=10, recall=0.99, merge_iters=2)
    ga, gb = CpuBackend().ggm(halves[0], halves[1], L2, params, seed=4)
    assert ga.report["stop"].startswith("exact graph: the descent ran out of iterations"), ga.report
    truth = exact(x, 11, L2, [(0, x)])
    got = np.concatenate([ga.dists, gb.dists])
    np.testing.assert_allclose(got, truth.dists[:, 1:], rtol=1e-5, atol=1e-4)  # keys: ties may swap ids
    assert (np.concatenate([ga.ids, gb.ids]) == truth.ids[:, 1:]).mean() > 0.999


def test_merge_probe_draws_half_from_each_shard_so_a_small_batch_is_measured():
    """A batch of 60 rows merged into a shard of 3000: every batch row is in the probe (in proportion to the
    sizes it would hold about 20, and the converged old rows would end the merge: new-row recall 0.957)."""
    rng = np.random.default_rng(0)
    parts = []
    for off, n in ((0, 3000), (3000, 60)):
        x = rng.standard_normal((n, 8)).astype(np.float32)
        g = CpuBackend().exact_knn(x, 6, L2, [(off, x)])
        parts.append(ShardPart(off, x, KnnGraph(g.ids[:, 1:], g.dists[:, 1:])))

    def probe(a, b):
        def exact(rows, m, other_is_b):
            g = CpuBackend().exact_knn(np.concatenate([a.vectors, b.vectors])[rows], m, L2,
                                       [((b if other_is_b else a).offset, (b if other_is_b else a).vectors)])
            return g.ids, g.dists
        return make_merge_probe(a, b, 5, exact, np.random.default_rng(1))

    small = probe(*parts)
    assert len(small.rows) == PROBE_ROWS and (small.rows >= 3000).sum() == 60
    even = probe(parts[0], ShardPart(3000, parts[0].vectors, parts[0].graph))
    assert (even.rows < 3000).sum() == PROBE_ROWS // 2 and len(np.unique(even.rows)) == PROBE_ROWS


# ---- the build's recorded estimate --------------------------------------------------------------
@pytest.mark.slow
def test_build_records_an_estimate_that_eval_confirms(tmp_path):
    src = tmp_path / "d.fbin"
    write_synth(src, 12000, 32, seed=5)
    out = run_json("build", src, "-o", tmp_path / "s.knn", "--k", 10, "--shard-rows", 4000, "--backend", "cpu")
    est = out["recall_estimate"]
    assert est["target"] == 0.99 and est["rows"] == 2000 and est["graph_rows"] == 12000
    assert est["low"] <= est["recall"] <= est["high"]
    info = run_json("info", tmp_path / "s.knn")
    assert info["recall_estimate"] == est
    measured = run_json("eval", "recall", tmp_path / "s.knn", "--backend", "cpu")["recall"]
    assert measured >= 0.985 and abs(measured - est["recall"]) <= 0.005, (measured, est)
    manifest = json.loads((tmp_path / "s.knn" / "manifest.json").read_text())
    assert manifest["estimate"] == est


@pytest.mark.parametrize("partition", ["contiguous", "kmeans"])
def test_a_builds_estimate_takes_its_rows_lists_as_written_not_read_back(tmp_path, monkeypatch, partition):
    """The recorded estimate measures the sample rows' final lists as the build wrote them (a few thousand rows
    spread over a large store's graph touch most of its chunks): the graph is not read back for it, and the
    estimate is the one measured on the store afterwards by a sample drawn again from it."""
    from bigknn.backends.cpu import CpuBackend
    from bigknn.engine.recall_sample import SampleTruth
    from bigknn.operations.build import BuildRequest, build
    from bigknn.core.progress import Reporter
    from bigknn.shards import Store

    src = tmp_path / "d.fbin"
    write_synth(src, 9000, 16, seed=6)
    reads = []
    real = Store.read_graph_rows
    monkeypatch.setattr(Store, "read_graph_rows", lambda self, sid, rows: reads.append(sid) or real(self, sid, rows))
    out = build(BuildRequest(input=src, store=tmp_path / "s.knn", shard_rows=2500, params=GnndParams(k=10),
                             partition=partition), [CpuBackend()], Reporter())
    assert out["shards"] >= 4 and out["partition"] == partition and reads == []
    store = Store.open(tmp_path / "s.knn")
    again = SampleTruth.from_store(store)
    again.complete(store, CpuBackend())
    measured = again.measure(store).to_dict()
    assert measured == {key: out["recall_estimate"][key] for key in measured}
    assert sorted(reads) == list(range(out["shards"]))  # read back here: every shard holds sample rows


def _sample_truth(x: np.ndarray, positional: bool = True, k: int = 10):
    from bigknn.engine.recall_sample import SampleTruth, sample_rows

    rows = sample_rows(len(x), 3)
    return SampleTruth(rows, x[rows], "l2", k, 3, positional=positional)


def test_a_shards_sample_rows_are_its_gnnds_probe_with_their_exact_neighbours():
    """The stopping part of the build's recall sample is the probe of a one-shard build's GNND: its rows, their
    exact top-10 among the shard's rows (self left out), the search's pace. The held-out part, what the build
    reports on, is never in it; a shard holding only part of the stopping rows gets no probe from the sample."""
    x = synth(6000, 24, seed=8)
    sample = _sample_truth(x)
    g = sample.add(CpuBackend(), 0, 0, x)
    probe = sample.probe(0, len(x), g, 48, seconds=2.0)
    inside = sample.rows[~sample.held_out]
    assert sample.held_out.sum() == ESTIMATE_ROWS and len(inside) == PROBE_ROWS
    assert np.array_equal(probe.rows, inside) and not np.isin(probe.rows, sample.rows[sample.held_out]).any()
    assert sample.probe(0, 3000, g, 48, seconds=1.0) is None  # half the stopping rows: a shard of two
    ids, keys = exact_neighbours(x, inside, 10)
    assert not (probe.truth_ids == inside[:, None]).any(), "self left out"
    got = np.sort(((x[probe.truth_ids] - x[inside][:, None, :]) ** 2).sum(axis=2), axis=1)  # local ids' keys
    np.testing.assert_allclose(got, keys, rtol=1e-4, atol=1e-4)  # the exact top-10 (ties in any order)
    assert (probe.truth_ids == ids).all(axis=1).mean() > 0.95
    np.testing.assert_allclose(probe.kth_key, keys[:, -1], rtol=1e-4, atol=1e-4)
    assert probe.exact_pace == pytest.approx(2.0 / (len(sample.rows) * len(x)))


def test_no_probe_from_the_sample_where_it_would_measure_less_or_other_rows():
    x = synth(3000, 16, seed=10)
    few = _sample_truth(np.concatenate([x, x[:1] + 1, synth(20000, 16, seed=11)]))
    assert few.probe(0, len(x), few.add(CpuBackend(), 0, 0, x), 48, 1.0) is None  # ~130 stopping rows inside
    y = synth(5000, 16, seed=12)
    for sample in (_sample_truth(y, positional=False), _sample_truth(y, k=5)):  # k-means store; m 5, not 10
        assert sample.probe(0, len(y), sample.add(CpuBackend(), 0, 0, y), 48, 1.0) is None


def test_a_one_shard_build_descends_on_its_recall_sample(tmp_path, monkeypatch):
    """The one shard's GNND measures its recall on the build's 1,000 stopping rows (no exact search of its own),
    and the build records its estimate on the 2,000 others."""
    probes = []
    gnnd = CpuBackend.gnnd

    def recorded(self, *args, probe=None, **kwargs):
        probes.append(probe)
        return gnnd(self, *args, probe=probe, **kwargs)

    monkeypatch.setattr(CpuBackend, "gnnd", recorded)
    x = synth(9000, 24, seed=13)
    import bigknn

    with bigknn.build(x, k=10, backend="cpu") as g:
        assert g.report.descents["gnnd"]["count"] == 1
        assert g.info.recall_estimate.rows == ESTIMATE_ROWS
    assert len(probes) == 1 and probes[0] is not None and len(probes[0].rows) == PROBE_ROWS


def test_recall_zero_keeps_the_fixed_rules(tmp_path):
    src = tmp_path / "d.fbin"
    write_synth(src, 3000, 16, seed=6)
    out = run_json("build", src, "-o", tmp_path / "s.knn", "--k", 5, "--shard-rows", 1500, "--backend", "cpu",
                   "--recall", 0, "--iters", 3, "--merge-iters", 2)
    assert out["recall_estimate"] is None
