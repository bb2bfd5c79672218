"""``bigknn plan`` and automatic shard sizes (issue 3 / 4): shards sized from the GPU memory formula, merge
counts, and estimates scaled from measured rates."""

from __future__ import annotations

import math

import pytest

from bigknn.backends import device_memory_model
from bigknn.core.params import GnndParams
from bigknn.algorithms.partition.learn import SLACK
from bigknn.operations.plan_model import (ASSUMED_PAIRS_PER_SHARD, AUTO_KMEANS_SHARDS, CPU_SHARD_ROWS, SIMULATED_PAIRS, all_pairs_merge_cost, auto_shard_rows,
                                  largest_shard_rows, merge_gpu_bytes, merge_rounds, near_pairs, plan,
                                  spread_for_workers)
from bigknn.engine.pair_order import pending_pairs

from conftest import replay_loads, run_cli, run_json

DISK = {"read_gbps": 2.0, "write_gbps": 2.0, "source": "test"}


@pytest.mark.parametrize("gib,dim,itemsize,k", [(8, 96, 4, 32), (120, 96, 4, 32), (40, 384, 2, 10), (2, 128, 1, 64)])
def test_largest_shard_is_the_biggest_whose_merge_fits(gib, dim, itemsize, k):
    params = GnndParams(k=k)
    budget = gib << 30
    r = largest_shard_rows(budget, dim, itemsize, params)
    assert merge_gpu_bytes(r, dim, itemsize, params) <= budget < merge_gpu_bytes(r + 1000, dim, itemsize, params)


@pytest.mark.parametrize("dim,itemsize", [(96, 4), (128, 4), (128, 1)])
def test_a_planned_merge_has_the_full_slots_and_room_to_widen(dim, itemsize):
    """The CUDA merge at the planned size needs no halved candidate slots, and the recall target's widening
    (lists WIDEN_STEP wider) still fits: a 100M-row build whose merges could do neither stalled below its
    target (H100, 2026-11-25)."""
    from bigknn.backends.cuda import CudaBackend
    from bigknn.backends.cuda.memory import LOG_SLOTS
    from bigknn.algorithms.recall_target import WIDEN_STEP

    params = GnndParams(k=32)
    budget = 40 << 30
    n = 2 * largest_shard_rows(budget, dim, itemsize, params)
    w, wide = params.width(), params.width() + WIDEN_STEP
    need = CudaBackend.ggm_bytes(n, dim, itemsize, wide, w, params.sample_count(wide), 1 << LOG_SLOTS)
    assert need + (n * dim * 2 if itemsize == 4 and dim >= 128 else 0) <= budget
    assert largest_shard_rows(budget, dim, itemsize, GnndParams(k=32, recall=0)) > n // 2  # no target: no room kept


def test_auto_shard_rows_without_a_gpu():
    params = GnndParams(k=32)
    assert auto_shard_rows([], 96, 4, params) == CPU_SHARD_ROWS
    assert auto_shard_rows([], 96, 4, params, gpu_mem=8 << 30) == largest_shard_rows(8 << 30, 96, 4, params)
    # rows whose one GNND fits the budget make one shard (no merge); a few more than that, merge-sized shards
    whole = device_memory_model().whole_bytes
    fits = next(n for n in range(1 << 20, 1 << 30, 1 << 20) if whole(n + (1 << 20), 96, 4, params) > 8 << 30)
    assert auto_shard_rows([], 96, 4, params, gpu_mem=8 << 30, rows=fits) == fits
    assert auto_shard_rows([], 96, 4, params, gpu_mem=8 << 30, rows=fits + (1 << 21)) == largest_shard_rows(
        8 << 30, 96, 4, params) < fits


def test_plan_scales_measured_rates():
    params = GnndParams(k=32, list_width=48)
    rates = {"gnnd_rows_per_s": 2.5e6, "ggm_rows_per_s": 4e6}
    p = plan(10**9, 96, 4, params, 25_000_000, 1, rates, DISK)
    assert p["shards"] == 40 and p["merges"] == 40 * 39 // 2 and p["rounds"] == 39
    assert p["estimate_s"]["gnnd"] == pytest.approx(400, rel=0.01)  # 1e9 rows at 2.5M rows/s
    assert p["estimate_s"]["ggm"] == pytest.approx(780 * 50e6 / 4e6, rel=0.01)  # each merge: 2 shards of rows
    two = plan(10**9, 96, 4, params, 25_000_000, 2, rates, DISK)
    assert two["estimate_s"]["ggm"] == pytest.approx(p["estimate_s"]["ggm"] / 2, rel=0.01)
    assert p["gpu_bytes_per_worker"] == merge_gpu_bytes(25_000_000, 96, 4, params)


def test_partitioned_plan_merges_pairs_per_shard_and_reads_the_input_twice():
    params = GnndParams(k=32, list_width=48)
    rates = {"gnnd_rows_per_s": 2.5e6, "ggm_rows_per_s": 4e6}
    full = plan(10**9, 96, 4, params, 25_000_000, 1, rates, DISK, host_mem=0)  # no cache: every merge reads
    near = plan(10**9, 96, 4, params, 25_000_000, 1, rates, DISK, "kmeans", pairs_per_shard=1.5, host_mem=0)
    assert near["shards"] == 46 and near["merges"] == 69 and near["all_pairs"] == 46 * 45 // 2  # 1.15 x 40
    assert near["estimate_s"]["ggm"] == pytest.approx(69 * 2 * near["shard_rows"] / 4e6, rel=0.01)
    assert near["read_bytes"] - 69 * 2 * (near["shard_rows"] * (96 * 4 + 48 * 8)) == 2 * 10**9 * 96 * 4
    assert full["read_bytes"] - full["merges"] * 2 * (full["shard_rows"] * (96 * 4 + 48 * 8)) == 10**9 * 96 * 4
    assert near["estimate_s"]["total"] < full["estimate_s"]["total"] / 5


def test_plan_command_calibrates_on_the_cpu():
    out = run_json("plan", "--rows", 10**9, "--dim", 96, "--k", 32, "--gpu-mem", "120G", "--backend", "cpu",
                   "--calibrate-rows", 3000)
    assert out["shard_rows"] * out["shards"] >= 10**9
    assert out["gpu_bytes_per_worker"] <= 120 << 30
    # the default partition (auto) at a billion rows: k-means' near pairs, not all pairs
    assert out["partition"] == "kmeans" and out["shards"] >= AUTO_KMEANS_SHARDS
    assert out["merges"] == math.ceil(out["shards"] * ASSUMED_PAIRS_PER_SHARD) < out["all_pairs"]
    assert out["build_refuses"] is None and out["over_gpu_fit"] is False  # the default is one build takes
    assert [q["workers"] for q in out["projections"]] == [1, 2, 4, 8]
    assert out["estimate_s"]["total"] > 0 and out["rates"]["source"].startswith("calibration on cpu")
    disk = out["assumptions"]["disk"]
    assert disk["read_gbps"] > 0 and disk["write_gbps"] > 0 and disk["source"].startswith("measured in")
    assert disk["cache_write_gbps"] > 0 and disk["dirty_bytes"] > 0  # Linux: the page cache's pace and room
    assert out["assumptions"]["host_ram_bytes"] > 0 and out["assumptions"]["gpu_bytes"] == 120 << 30
    code, _, err = run_cli("plan", "--dim", 96)
    assert code == 2 and "--rows" in err


def test_plan_command_takes_the_builds_host_cache():
    """--host-mem sizes the plan's shard cache as it sizes the build's: 22 GiB holds 3 shards of 10M x 96
    (7.68 GB each with their graphs), so merges read shards back."""
    args = ("plan", "--rows", 10**8, "--dim", 96, "--k", 32, "--backend", "cpu", "--calibrate-rows", 1000,
            "--shard-rows", 10**7, "--partition", "contiguous", "--disk-gbps", 1)
    tight, roomy = run_json(*args, "--host-mem", "22G"), run_json(*args, "--host-mem", "1T")
    assert tight["cached_shards"] == 3 and roomy["cached_shards"] == 10
    assert tight["merge_reads"] > 0 == roomy["merge_reads"]


def test_build_picks_the_shard_size_itself(tmp_path):
    from conftest import write_synth

    data = tmp_path / "x.fbin"
    write_synth(data, 3000, 16)
    s = run_json("build", data, "-o", tmp_path / "s.knn", "--k", 10, "--backend", "cpu")
    assert s["shards"] == 1 and s["rows"] == 3000  # CPU: 1M-row shards
    again = run_json("build", data, "-o", tmp_path / "s.knn", "--k", 10, "--backend", "cpu")  # resumes
    assert again["resumed"] is True and again["shards"] == 1



@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_merge_rounds_are_what_the_scheduler_runs_side_by_side(workers):
    """One worker: one merge a round. Several: no round hands out two pairs sharing a shard (3 shards: one
    merge a round whatever the workers), and a round runs up to ``workers`` merges."""
    assert [merge_rounds(s, 1) for s in range(2, 8)] == [s * (s - 1) // 2 for s in range(2, 8)]
    assert merge_rounds(3, workers) == 3
    for s in range(2, 9):
        pairs = s * (s - 1) // 2
        assert -(-pairs // min(workers, s // 2)) <= merge_rounds(s, workers) <= pairs


def test_one_worker_keeps_the_largest_shards_and_several_split_three_into_four():
    """One GPU: merging costs shards - 1 input-sized merges, so the fewest shards win. Several: three shards
    merge one pair at a time, four two at a time (50M x 96 on H200s: 3 shards of 16.7M)."""
    assert [all_pairs_merge_cost(s, 1) for s in range(1, 8)] == [0, 1, 2, 3, 4, 5, 6]
    assert all_pairs_merge_cost(4, 2) == all_pairs_merge_cost(4, 4) == 1.5
    rows, fits = 50_000_000, 16_700_000
    assert spread_for_workers(rows, fits, 1) == fits
    assert spread_for_workers(rows, fits, 2) == spread_for_workers(rows, fits, 4) == 12_500_000
    assert spread_for_workers(rows, 25_000_000, 2) == 25_000_000  # two shards: one merge, nothing to gain


@pytest.mark.parametrize("run", [
    # rows, shard rows, workers, GNND s, GGM s, merges (one H200, 2026-11-26 and 28: BENCHMARKS.md), and the bytes
    # issue 35 holds a default build to: the input read once, its copy and the final graph (k = 32) written once
    ("T2, 10 shards", 10_000_000, 1_000_000, 1, 4.854, 18.431, 45, 3.84, 3.84 + 2.56),
    ("50M, 3 shards, 1 GPU", 50_000_000, 16_666_667, 1, 23.051, 30.149, 3, 19.2, 19.2 + 12.8),
])
def test_planned_bytes_of_a_cached_build_are_one_read_and_one_write(run):
    """With every shard in the host cache and no checkpoint within its allowance, a build reads its input once
    and writes its rows and each final graph, k wide, once (test_plan_io.py checks it against a real build; the
    plan once counted every merge reading and writing both shards: 73 GB read and 42 GB written for T2)."""
    _, rows, shard_rows, workers, gnnd_s, ggm_s, merges, read_gb, written_gb = run
    shards = -(-rows // shard_rows)
    rates = {"gnnd_rows_per_s": rows / gnnd_s, "ggm_rows_per_s": merges * 2 * (rows / shards) / ggm_s}
    p = plan(rows, 96, 4, GnndParams(k=32), shard_rows, workers, rates, DISK, host_mem=500 << 30)
    assert p["merges"] == merges and p["cached_shards"] == shards
    assert p["read_bytes"] / 1e9 == pytest.approx(read_gb, rel=1e-3)
    assert p["written_bytes"] / 1e9 == pytest.approx(written_gb, rel=1e-3)
    assert p["disk_floor"]["read_bytes"] == p["read_bytes"] and p["disk_floor"]["written_bytes"] == p["written_bytes"]


def test_a_cache_too_small_reads_shards_back_and_writes_what_it_evicts():
    """Shards the cache cannot hold are read back for merges and written (48 wide, not final) when evicted
    unwritten; a long build's checkpoints of 10 cached graphs 48 wide would pass their allowance (a tenth of
    the vectors and final graphs), so it writes no more than a short one."""
    params, fast, slow = GnndParams(k=32), {"gnnd_rows_per_s": 2e8, "ggm_rows_per_s": 4e8}, \
        {"gnnd_rows_per_s": 2e6, "ggm_rows_per_s": 4e6}
    shard_bytes, graph, inputs = 10**7 * (96 * 4 + 48 * 8), 10**7 * 48 * 8, 10**8 * 96 * 4
    roomy = plan(10**8, 96, 4, params, 10**7, 1, fast, DISK, host_mem=1 << 40)
    tight = plan(10**8, 96, 4, params, 10**7, 1, fast, DISK, host_mem=5 * shard_bytes)
    assert tight["cached_shards"] == 5 and roomy["cached_shards"] == 10
    misses = tight["merge_reads"]
    assert misses == replay_loads(10, 5, True) < 45 * 2 * (1 - 5 / 10) and roomy["merge_reads"] == 0
    assert roomy["read_bytes"] == inputs and roomy["written_bytes"] == inputs + 10**8 * 32 * 8
    assert tight["read_bytes"] - roomy["read_bytes"] == pytest.approx(misses * shard_bytes, rel=1e-6)
    assert tight["written_bytes"] - roomy["written_bytes"] == pytest.approx(misses * graph, rel=1e-6)
    long = plan(10**8, 96, 4, params, 10**7, 1, slow, DISK, host_mem=1 << 40)  # 50 s of GNND, 225 s of merges
    assert long["written_bytes"] == roomy["written_bytes"]


@pytest.mark.parametrize("partition", ["contiguous", "kmeans"])
def test_the_plan_reads_back_what_the_schedulers_order_reads_through_an_lru_cache(partition):
    """12 shards through a cache of 3: the shards the plan reads back for merges are an explicit LRU replay of
    the Scheduler's order (pairs of cached shards first), fewer than merges hitting cached shards at random;
    each one read back was evicted unwritten, so it is written once more too."""
    params, fast, r = GnndParams(k=32), {"gnnd_rows_per_s": 2e8, "ggm_rows_per_s": 4e8}, 10**6
    shard_bytes, graph = r * (96 * 4 + params.width() * 8), r * params.width() * 8
    shard_rows = r if partition == "contiguous" else int(SLACK * r)  # 12 shards either way
    p = plan(12 * r, 96, 4, params, shard_rows, 1, fast, DISK, partition, pairs_per_shard=3, host_mem=3 * shard_bytes)
    roomy = plan(12 * r, 96, 4, params, shard_rows, 1, fast, DISK, partition, pairs_per_shard=3, host_mem=1 << 40)
    assert p["shards"] == 12 and p["cached_shards"] == 3 and p["merges"] == (66 if partition == "contiguous" else 36)
    pairs = None if partition == "contiguous" else near_pairs(12, 36)
    assert p["merge_reads"] == replay_loads(12, 3, True, pairs) < p["merges"] * 2 * (1 - 3 / 12)
    # a partitioned input too large for the small host budget is read twice (labelling, sharding); the roomy one
    # is held in RAM between the two passes
    second_read = 0 if partition == "contiguous" else 12 * r * 96 * 4
    assert p["read_bytes"] - roomy["read_bytes"] == p["merge_reads"] * shard_bytes + second_read
    assert p["written_bytes"] - roomy["written_bytes"] == p["merge_reads"] * graph
    assert "replayed" in p["assumptions"]["merge_reads"]


def test_near_pairs_are_a_repeatable_draw_in_the_builds_order():
    pairs = near_pairs(61, 157)
    assert len(pairs) == len(set(pairs)) == 157 and pairs == near_pairs(61, 157)
    assert pairs == [p for p in pending_pairs(61, set()) if p in set(pairs)]  # as Ledger.todo_pairs orders them


def test_reads_of_more_merges_than_are_replayed_are_counted_at_random():
    """Replaying costs merges^2: beyond SIMULATED_PAIRS the plan says it counted reads as random hits."""
    params, fast, r = GnndParams(k=32), {"gnnd_rows_per_s": 2e8, "ggm_rows_per_s": 4e8}, 10**5
    p = plan(100 * r, 96, 4, params, r, 1, fast, DISK, host_mem=10 * r * (96 * 4 + params.width() * 8))
    assert p["merges"] == 4950 > SIMULATED_PAIRS and p["cached_shards"] == 10
    assert p["merge_reads"] == round(4950 * 2 * 0.9) and "random" in p["assumptions"]["merge_reads"]


def test_auto_shard_rows_spans_the_gpus_where_one_gpu_cannot_hold_the_gnnd():
    """Rows whose one GNND does not fit a GPU but does with its lists split over two (every GPU holding every
    row) make one shard where the backends can span (Backend.spanning), merge-sized shards where they cannot;
    on one GPU the spanning count is the whole GNND's."""
    params, budget = GnndParams(k=32), 8 << 30
    model = device_memory_model()

    class Device:
        def __init__(self, spans: bool):
            self.spans = spans

        def memory_budget(self) -> int:
            return budget

        def spanning(self, others):
            return self if self.spans else None

    for dim, itemsize in ((96, 4), (384, 4), (128, 1)):
        for rows in (10_007, 3_000_000):
            assert model.spanning_bytes(rows, dim, itemsize, params, 1) == model.whole_bytes(rows, dim, itemsize, params)
    rows = next(n for n in range(1 << 20, 1 << 30, 1 << 20) if model.whole_bytes(n, 96, 4, params) > budget)
    assert model.spanning_bytes(rows, 96, 4, params, 2) <= budget
    assert auto_shard_rows([Device(True), Device(True)], 96, 4, params, rows=rows) == rows
    merge_sized = largest_shard_rows(budget, 96, 4, params)
    assert auto_shard_rows([Device(False), Device(False)], 96, 4, params, rows=rows) == merge_sized < rows
    assert auto_shard_rows([Device(True)], 96, 4, params, rows=rows) == merge_sized
