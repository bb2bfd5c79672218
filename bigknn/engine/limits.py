"""The one place of the limits a build refuses beyond, so that ``bigknn plan`` and ``bigknn build`` agree: the
shards a build of ``rows`` rows makes at a ``--shard-rows``, the most merges a run takes on, the smallest
``--shard-rows`` within them, and the k a number of rows can have (a store's build and an in-memory one)."""

from __future__ import annotations

import math

from bigknn.algorithms.partition.labelling import shard_count
from bigknn.algorithms.partition.learn import SLACK
from bigknn.engine.sharding_pass import shard_total

MAX_MERGES = 10_000  # more pairwise merges than this (142 shards or more) are refused
MAX_SHARDS = math.isqrt(2 * MAX_MERGES)  # 141 shards: 9,870 pairs
MERGES_PER_SHARD_NOTE = 10  # more merges than this per shard (22 shards or more) get a note


def k_refusal(k: int, rows: int) -> str | None:
    """Why ``k`` neighbours cannot be found among ``rows`` rows, or None: each row needs k others."""
    if k < 1:
        return f"k must be at least 1, got {k}"
    if k >= rows:
        return f"k = {k} needs more than {k} rows; the input has {rows}"
    return None


def build_shards(rows: int, shard_rows: int, width: int, partition: str) -> int:
    """The shards ``bigknn build`` makes of ``rows`` rows at ``shard_rows`` (lists ``width`` wide): balanced
    contiguous ranges, or a partition's (more of them, with room for its uneven shares)."""
    contiguous = shard_total(rows, shard_rows, width)
    if partition == "contiguous" or contiguous == 1:  # one shard: nothing to partition
        return contiguous
    return shard_count(rows, shard_rows, width)


def too_many_merges(shards: int, merges: int) -> str | None:
    """Why a run of ``merges`` merges over ``shards`` shards is refused, or None: more than MAX_MERGES cannot
    finish in useful time (a tiny --shard-rows: merges grow with the square of the shard count)."""
    if merges <= MAX_MERGES:
        return None
    return f"{shards:,} shards need {merges:,} merges, more than the {MAX_MERGES:,} that finish in useful time"


def build_refusal(rows: int, shard_rows: int, width: int, partition: str) -> str | None:
    """Why ``bigknn build`` refuses this size, or None. A build counts every pair of its shards, partitioned
    or not (the near pairs are known only once every shard has its graph)."""
    shards = build_shards(rows, shard_rows, width, partition)
    return too_many_merges(shards, shards * (shards - 1) // 2)


def smallest_shard_rows(rows: int, width: int, partition: str) -> int:
    """The smallest --shard-rows whose build stays within MAX_MERGES."""
    least = max(1, -(-int(rows * (1.0 if partition == "contiguous" else SLACK)) // MAX_SHARDS))
    while build_refusal(rows, least, width, partition) is not None:  # a partition's slack: a few more rows
        least = max(least + 1, math.ceil(least * 1.01))
    return least
