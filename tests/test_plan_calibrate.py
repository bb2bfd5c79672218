"""Issue 12: ``bigknn plan``'s projection of a measured build. Calibration times the input's own rows, warms
both kernels up before timing them, and scales its rates to the planned shard size along the power law
through two sizes; the plan adds the serial start (first shards read) and end (last graphs written)."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
from click.testing import CliRunner

from bigknn.formats import write_vectors
from bigknn.core.knn_graph import KnnGraph
from bigknn.core.params import GnndParams
from bigknn.operations import calibrate as cal
from bigknn.operations.plan_model import merge_rounds, plan
from bigknn.core.synth import as_dtype, synth

DISK = {"read_gbps": 2.0, "write_gbps": 1.0, "source": "test"}
COLD_S = 100.0  # what the fake's first call of each kernel costs on top (compiling, loading)


class FakeBackend:
    """Costs in virtual seconds on ``clock``: GNND of n rows n / (gnnd * n^-bg), GGM of two n-row shards
    2n / (ggm * n^-bm), each kernel's first call COLD_S more. Records the dtypes and sizes it was given."""

    name = "fake"

    def __init__(self, gnnd=1e6, ggm=2e6, bg=0.1, bm=0.2):
        self.rate = {"gnnd": (gnnd, bg), "ggm": (ggm, bm)}
        self.clock = 0.0
        self.calls: list[tuple[str, int, np.dtype]] = []

    def _spend(self, kind: str, n: int, pair_rows: int) -> None:
        rate, b = self.rate[kind]
        self.clock += pair_rows / (rate * n ** -b) + (COLD_S if all(c[0] != kind for c in self.calls) else 0)

    def gnnd(self, x, metric, params, seed, on_iter=None):
        self._spend("gnnd", len(x), len(x))
        self.calls.append(("gnnd", len(x), x.dtype))
        w = params.width()
        return KnnGraph(np.zeros((len(x), w), np.int32), np.zeros((len(x), w), np.float32))

    def ggm(self, a, b, metric, params, seed, on_iter=None, vias=None):
        self._spend("ggm", len(a.vectors), len(a.vectors) + len(b.vectors))
        self.calls.append(("ggm", len(a.vectors), a.vectors.dtype))
        return a.graph, b.graph

    def memory_budget(self):
        return None

    def warm_up(self, say, like=None):
        return 0.0  # nothing to compile: the first call's COLD_S is what calibration must keep out


@pytest.fixture
def fake(monkeypatch) -> FakeBackend:
    """A FakeBackend whose clock is the one calibration reads."""
    backend = FakeBackend()
    monkeypatch.setattr(cal, "time", types.SimpleNamespace(perf_counter=lambda: backend.clock))
    return backend


def test_plan_of_a_uint8_file_calibrates_on_its_uint8_rows(tmp_path, fake, monkeypatch):
    """The 100M x 128 uint8 plan on 2 x H200 timed float32 synthetic rows: the CUDA kernels of another dtype."""
    path = tmp_path / "x.u8bin"
    x = as_dtype(synth(3000, 16, seed=3), np.uint8)
    write_vectors(path, x)
    from bigknn import api_commands
    from bigknn.cli import plan as plan_cli

    monkeypatch.setattr(api_commands, "get_backends", lambda *a: [fake])
    res = CliRunner().invoke(plan_cli.plan, [str(path), "--k", "8", "--calibrate-rows", "1000", "--disk-gbps", "1",
                                             "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert fake.calls and {dtype for _, _, dtype in fake.calls} == {np.dtype(np.uint8)}
    assert "x.u8bin" in out["rates"]["source"] and "uint8" in out["rates"]["source"]
    assert [p["rows"] for p in out["rates"]["points"]] == [250, 1000]
    # without INPUT: synthetic rows of --dtype
    fake.calls.clear()
    res = CliRunner().invoke(plan_cli.plan, ["--rows", "10000", "--dim", "16", "--dtype", "int8", "--k", "8",
                                             "--calibrate-rows", "1000", "--disk-gbps", "1", "--json"])
    assert res.exit_code == 0, res.output
    assert {dtype for _, _, dtype in fake.calls} == {np.dtype(np.int8)}


def test_calibration_warms_both_kernels_up_before_timing_them(fake):
    """A first GGM's loading or compiling is not a merge rate (1.14M pair rows/s planned, 2.85M measured)."""
    x = synth(8000, 8, seed=1)
    rates = cal.calibrate(fake, x, (1000, 4000), GnndParams(k=8), "test rows")
    for p in rates["points"]:
        n = p["rows"]
        assert p["gnnd_rows_per_s"] == pytest.approx(1e6 * n ** -0.1, rel=1e-6)
        assert p["ggm_rows_per_s"] == pytest.approx(2e6 * n ** -0.2, rel=1e-6)
    assert [c[:2] for c in fake.calls[:3]] == [("gnnd", 1000), ("gnnd", 1000), ("ggm", 1000)]  # the warm-up
    assert len(fake.calls) == 3 * 3


@pytest.mark.parametrize("bg,bm", [(0.1, 0.2), (-0.3, 0.9)])
def test_rates_are_scaled_to_the_planned_shard_along_the_power_law(fake, bg, bm):
    """Rates measured at 1,000 and 4,000 rows, planned at 1M: rate(1M) = rate(4K) x (1M / 4K)^-b, b through the
    two points, clamped to [0, 0.5] (GGM on an H200: 4.9M pair rows/s at 1M-row shards, 3.3M at 16.7M)."""
    fake.rate = {"gnnd": (1e6, bg), "ggm": (2e6, bm)}
    rates = cal.calibrate(fake, synth(8000, 8, seed=1), (1000, 4000), GnndParams(k=8), "test rows")
    want_bg, want_bm = min(max(bg, 0.0), 0.5), min(max(bm, 0.0), 0.5)
    assert rates["gnnd_exponent"] == pytest.approx(want_bg) and rates["ggm_exponent"] == pytest.approx(want_bm)
    r = 1_000_000
    p = plan(4 * r, 8, 4, GnndParams(k=8), r, 1, rates, DISK)
    gnnd_rate = 1e6 * 4000 ** -bg * (r / 4000) ** -want_bg
    ggm_rate = 2e6 * 4000 ** -bm * (r / 4000) ** -want_bm
    assert p["rates"]["gnnd_rows_per_s"] == pytest.approx(gnnd_rate, abs=1)
    assert p["rates"]["ggm_rows_per_s"] == pytest.approx(ggm_rate, abs=1)
    assert p["estimate_s"]["gnnd"] == pytest.approx(4 * r / gnnd_rate, abs=0.1)
    assert p["estimate_s"]["ggm"] == pytest.approx(6 * 2 * r / ggm_rate, abs=0.1)
    assert p["rates"]["measured_at_rows"] == 4000 and len(p["rates"]["points"]) == 2


def test_one_size_or_a_store_is_not_scaled():
    assert cal.calibration_sizes(20_000, 48) == (5_000, 20_000)
    assert cal.calibration_sizes(500, 48) == (500,)  # a quarter would hold under four lists' rows
    one = {"gnnd_rows_per_s": 1e6, "ggm_rows_per_s": 2e6, "at_rows": 1000, "gnnd_exponent": None,
           "ggm_exponent": None, "source": "one size"}
    assert cal.rate_at(one, "ggm", 10**7) == 2e6
    assert cal.rate_at({"gnnd_rows_per_s": 1e6, "ggm_rows_per_s": 2e6, "source": "test"}, "gnnd", 10**7) == 1e6


def test_the_plan_adds_the_first_shards_read_and_the_last_graphs_written():
    """No GPU starts before its first shard is read; the last merge's two graphs are written after it. Three
    shards on two workers merge one pair at a time (any two pairs share a shard): 3 merges of wall, not 1.5."""
    params, r = GnndParams(k=32), 10_000_000
    row_bytes = 96 * 4
    rates = {"gnnd_rows_per_s": 1e6, "ggm_rows_per_s": 2e6, "source": "test"}
    p = plan(3 * r, 96, 4, params, r, 2, rates, DISK, host_mem=1 << 40)
    est = p["estimate_s"]
    assert merge_rounds(3, 2) == 3 and est["ggm"] == pytest.approx(3 * 2 * r / 2e6, abs=0.1)
    assert est["start"] == pytest.approx(2 * r * row_bytes / 2e9, abs=0.1)  # one shard per worker
    assert est["end"] == pytest.approx(2 * r * params.k * 8 / 1e9, abs=0.1)  # the last merge's two graphs, k wide
    assert est["total"] == pytest.approx(est["start"] + est["gnnd"] + est["ggm"] + est["end"], abs=0.2)
    assert est["total"] > est["io"]
    slow_disk = {"read_gbps": 0.01, "write_gbps": 0.01, "source": "test"}  # I/O-bound: the ends are part of it
    q = plan(3 * r, 96, 4, params, r, 2, rates, slow_disk, host_mem=1 << 40)["estimate_s"]
    assert q["total"] == q["io"] > q["start"] + q["gnnd"] + q["ggm"] + q["end"]


def test_merge_rounds_of_many_shards_are_counted_not_replayed():
    """Replaying the Scheduler costs shards^4 (300 shards: 7 minutes); beyond a few dozen nearly every round
    is full."""
    assert merge_rounds(1000, 1) == 1000 * 999 // 2
    assert merge_rounds(300, 4) == -(-300 * 299 // 2 // 4)


class SpanningFake(FakeBackend):
    """A FakeBackend that spans another (Backend.spanning): the wide backend's GNND runs ``gain`` times faster."""

    def __init__(self, gain: float, **kw):
        super().__init__(**kw)
        self.wide = FakeBackend(gnnd=self.rate["gnnd"][0] * gain, bg=self.rate["gnnd"][1])
        self.spans: list = []

    def spanning(self, others):
        self.spans.append(len(others))
        return self.wide


def test_a_one_shard_plan_on_gpus_that_span_it_takes_the_spanning_gnnds_measured_rate(monkeypatch):
    """A one-shard build on two GPUs runs one GNND across both (Backend.spanning), so its plan times that GNND,
    after an untimed one (its kernels are compiled apart); a plan of several shards measures no spanning GNND,
    and the projections for other worker counts keep one GPU's rate."""
    from bigknn import api_commands
    from bigknn.cli import plan as plan_cli

    one, other = SpanningFake(gain=1.5, gnnd=1e3), FakeBackend(gnnd=1e3)  # slow: seconds to plan
    monkeypatch.setattr(cal, "time", types.SimpleNamespace(perf_counter=lambda: one.clock + one.wide.clock))
    monkeypatch.setattr(api_commands, "get_backends", lambda *a: [one, other])
    args = ["--rows", "40000", "--dim", "16", "--k", "8", "--calibrate-rows", "4000", "--disk-gbps", "100", "--json"]
    res = CliRunner().invoke(plan_cli.plan, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["shards"] == 1 and one.spans == [1]
    assert [c[1] for c in one.wide.calls] == [1000, 4000]  # untimed at the small size, timed at the large
    rates = out["rates"]
    assert rates["spanning_gpus"] == 2 and rates["spanning_at_rows"] == 4000 and rates["gnnd_spans_gpus"] == 2
    assert rates["spanning_gnnd_rows_per_s"] == pytest.approx(1.5e3 * 4000 ** -0.1, rel=1e-3)
    across = 1.5e3 * 40_000 ** -0.1  # scaled to the shard along the one-GPU GNND's law (b 0.1)
    assert rates["gnnd_rows_per_s"] == pytest.approx(across, rel=1e-3)
    assert out["estimate_s"]["gnnd"] == pytest.approx(40_000 / across, abs=0.1)
    alone = {q["workers"]: q["estimate_s"]["gnnd"] for q in out["projections"]}
    assert alone[1] == pytest.approx(1.5 * alone[2], rel=0.01) and alone[4] == pytest.approx(alone[1], rel=0.01)
    shown = CliRunner().invoke(plan_cli.plan, args[:-1]).output  # for people: the rate and where it came from
    assert "(one shard across 2 GPUs)" in shown and "GNND across 2 GPUs" in shown, shown
    one.spans.clear(), one.wide.calls.clear()
    res = CliRunner().invoke(plan_cli.plan, args[:-1] + ["--shard-rows", "10000", "--json"])
    out = json.loads(res.output.strip().splitlines()[-1])
    assert res.exit_code == 0 and out["shards"] == 4 and not one.wide.calls
    assert out["rates"]["gnnd_spans_gpus"] is None and "spanning_gpus" not in out["rates"]
