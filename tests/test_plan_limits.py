"""Issue 42, item 3: `bigknn plan` and `bigknn build` share their limits (bigknn/engine/limits.py): the plan
counts the shards the build makes, says what the build would refuse, and plans what it takes instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from bigknn.core.errors import BadInput
from bigknn.core.params import GnndParams
from bigknn.engine.limits import MAX_MERGES, build_refusal, build_shards, smallest_shard_rows
from bigknn.operations.plan_model import (CPU_SHARD_ROWS, auto_shard_rows, automatic_shards, fitting_shard_rows,
                                          largest_shard_rows, plan, planned_shards, resolve_partition,
                                          spread_for_workers)
from bigknn.engine.pending import check_merge_count
from bigknn.core.progress import Reporter

from conftest import run_json

DISK = {"read_gbps": 2.0, "write_gbps": 1.5, "source": "test"}
PARAMS = GnndParams(k=32)
RATES = {"cpu": {"gnnd_rows_per_s": 6e3, "ggm_rows_per_s": 5e3},  # 2 cores, as measured on this project's synth
         "gpu": {"gnnd_rows_per_s": 5e7, "ggm_rows_per_s": 4e7}}


def build_accepts(rows: int, shard_rows: int, partition: str) -> int:
    """The shards `bigknn build --shard-rows shard_rows` makes, once its own merge-count check passed."""
    shards = build_shards(rows, shard_rows, PARAMS.width(), partition)
    check_merge_count(Path("s.knn"), shards, shards * (shards - 1) // 2, "", Reporter(every_s=0))
    return shards


@pytest.mark.parametrize("partition", ["contiguous", "kmeans"])
@pytest.mark.parametrize("device,workers", [("cpu", 1), ("gpu", 1), ("gpu", 4)])
def test_plan_never_proposes_a_build_that_build_refuses(device, workers, partition):
    auto = CPU_SHARD_ROWS if device == "cpu" else largest_shard_rows(80 << 30, 96, 4, PARAMS)
    refused_somewhere = False
    for exponent in range(4, 11):
        rows = 10 ** exponent
        asked = spread_for_workers(rows, auto, workers) if partition == "contiguous" else auto
        for shard_rows in (asked, max(PARAMS.width() + 1, rows // 1000)):  # the automatic size, and a tiny one
            planned, why = fitting_shard_rows(rows, shard_rows, PARAMS.width(), partition)
            p = plan(rows, 96, 4, PARAMS, min(planned, rows), workers, RATES[device], DISK, partition)
            assert build_accepts(rows, planned, partition) == p["shards"], (rows, shard_rows)  # plan and build agree
            if why is None:
                assert planned == shard_rows
            else:  # what was asked is refused by the build itself, for the reason the plan gives
                refused_somewhere = True
                with pytest.raises(BadInput, match="merges, more than the 10,000"):
                    build_accepts(rows, shard_rows, partition)
                assert f"{MAX_MERGES:,}" in why
    assert refused_somewhere  # the sizes reach past the limit


@pytest.mark.parametrize("itemsize", [4, 1])  # float32, uint8
@pytest.mark.parametrize("gpu_mem", [None, 8 << 30, 40 << 30, 80 << 30, 141 << 30])  # None: the CPU
def test_no_default_plan_of_any_size_is_refused_by_build(gpu_mem, itemsize):
    """Issue 35: the automatic shard size (what build picks without --shard-rows, and what plan plans) of every
    size from a thousand rows to four billion, on 1 to 8 workers, is one build accepts. Where the shard it must
    take is larger than a GPU's merge holds, no shard that fits is accepted (the plan says so: over_gpu_fit)."""
    width = PARAMS.width()
    for rows in [10**e for e in range(3, 10)] + [2 * 10**9, 4 * 10**9]:
        for dim in (8, 96, 384, 1024):
            fits = auto_shard_rows([], dim, itemsize, PARAMS, gpu_mem, rows)
            for workers in (1, 2, 4, 8):
                size, method = automatic_shards(rows, fits, workers, width, "auto")  # as build calls it
                method = resolve_partition(method, rows, size, width)
                assert build_refusal(rows, size, width, method) is None, (rows, dim, workers)
                assert planned_shards(rows, None, fits, workers, width, "auto") == (min(size, rows), method, None)
                assert build_accepts(rows, size, method) == build_shards(rows, size, width, method)
                # larger than fits only where build refuses every size up to it (on the CPU: its default 1M rows)
                assert size <= fits or smallest_shard_rows(rows, width, method) > fits


@pytest.mark.parametrize("partition", ["contiguous", "kmeans", "rptree"])
def test_the_smallest_accepted_shard_size_is_the_smallest(partition):
    for rows in (10**6, 123_456_789, 10**10):
        least = smallest_shard_rows(rows, PARAMS.width(), partition)
        build_accepts(rows, least, partition)
        with pytest.raises(BadInput):
            build_accepts(rows, least - 1, partition)


def test_plan_command_says_what_build_refuses_and_plans_what_it_takes():
    p = run_json("plan", "--rows", 10**9, "--dim", 96, "-k", 32, "--backend", "cpu", "--calibrate-rows", 1000,
                 "--disk-gbps", 1, "--shard-rows", CPU_SHARD_ROWS)
    refused = p["build_refuses"]
    assert p["partition"] == "kmeans"  # the default (auto) at a billion rows
    shards = build_shards(10**9, CPU_SHARD_ROWS, PARAMS.width(), "kmeans")  # every pair counted, as build counts
    merges = shards * (shards - 1) // 2
    assert refused["shard_rows"] == CPU_SHARD_ROWS and f"{merges:,} merges" in refused["why"], refused
    assert refused["planned_shard_rows"] == smallest_shard_rows(10**9, PARAMS.width(), "kmeans")
    assert p["shards"] * (p["shards"] - 1) // 2 <= MAX_MERGES
