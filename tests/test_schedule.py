"""The merge schedule (round-robin rounds of disjoint pairs) and the shard split."""

from __future__ import annotations

import itertools

import pytest

from bigknn.operations.build import shard_sizes
from bigknn.engine.pair_order import pending_pairs, round_robin

from conftest import replay_loads


@pytest.mark.parametrize("s", range(1, 13))
def test_round_robin_covers_every_pair_once_in_disjoint_rounds(s):
    rounds = round_robin(s)
    pairs = [p for rnd in rounds for p in rnd]
    assert sorted(pairs) == list(itertools.combinations(range(s), 2))  # every pair exactly once, i < j
    assert len(pairs) == len(set(pairs)) == s * (s - 1) // 2
    for rnd in rounds:
        assert rnd, "an empty round"
        shards = [x for p in rnd for x in p]
        assert len(shards) == len(set(shards)), f"round {rnd} touches a shard twice"
        assert len(rnd) == s // 2  # every round is as full as it can be
    if s == 1:
        assert rounds == []
    elif s % 2 == 0:
        assert len(rounds) == s - 1
    else:
        assert len(rounds) == s


@pytest.mark.parametrize("s", [2, 5, 6, 9])
def test_pending_pairs_skips_done_ones_in_schedule_order(s):
    order = [p for rnd in round_robin(s) for p in rnd]
    assert pending_pairs(s, set()) == order
    done = set(order[::3])
    assert pending_pairs(s, done) == [p for p in order if p not in done]
    assert pending_pairs(s, set(order)) == []
    # pairs of shards that do not exist (or reversed duplicates) change nothing
    assert pending_pairs(s, {(s, s + 1)}) == order


@pytest.mark.parametrize("rows,shard_rows,k", [
    (8000, 2000, 10), (8001, 2000, 10), (24_000, 4000, 32), (10, 100, 3), (1_000_003, 99_999, 32),
    (100, 7, 6), (29, 5, 4), (12, 5, 5), (1000, 1000, 999), (65, 33, 32), (7, 3, 1),
])
def test_shard_sizes_balanced_and_larger_than_k(rows, shard_rows, k):
    sizes = shard_sizes(rows, shard_rows, k)
    assert sum(sizes) == rows
    assert max(sizes) - min(sizes) <= 1, sizes
    assert all(s > k for s in sizes), sizes
    need = -(-rows // shard_rows)
    if need * (k + 1) <= rows:  # shard_rows can be honoured: as few shards as that allows
        assert len(sizes) == need and max(sizes) <= shard_rows
    else:  # fewer, larger shards, as many as "> k rows each" allows
        assert len(sizes) == rows // (k + 1)


def test_shard_sizes_examples():
    assert shard_sizes(8000, 2000, 10) == [2000] * 4
    assert shard_sizes(24_000, 4000, 32) == [4000] * 6
    assert shard_sizes(10, 3, 2) == [4, 3, 3]
    assert shard_sizes(5, 1_000_000, 4) == [5]


def test_a_pair_whose_shards_are_cached_comes_before_one_sharing_the_last_pair():
    from bigknn.engine.scheduler import Scheduler

    cached = {2, 3}
    sched = Scheduler([(0, 1), (0, 4), (2, 3)], ready=range(5), held=cached.__contains__)
    assert sched.next_task(prefer={0})[1] == (2, 3)
    assert sched.upcoming(prefer={0}, count=2) == [(0, 1), (0, 4)]  # then the last pair's shard, in order
    assert Scheduler([(0, 1), (0, 4), (2, 3)], ready=range(5)).next_task(prefer={4})[1] == (0, 4)


@pytest.mark.parametrize("shards, capacity", [(8, 4), (16, 6), (61, 10)])
def test_a_cache_smaller_than_the_store_is_read_a_few_times_not_once_per_merge(shards, capacity):
    """61 shards through 10 cached (1B x 96 on one H200 with half of 256 GB), least recently used out first:
    1,827 shard reads in the schedule's order, 316 choosing cached pairs first."""
    aware, blind = (replay_loads(shards, capacity, cache_aware, evict="lru") for cache_aware in (True, False))
    assert aware * 3 <= blind
    assert aware <= shards * (shards - 1) // 2 // 2  # fewer reads than half the merges


def test_among_pairs_holding_as_many_cached_shards_one_that_finishes_a_shard_comes_first():
    """Both pairs need one read; (0, 2) is shard 2's last pair (it can leave the cache for good after), (0, 1)
    is not shard 1's. Then, among pairs that finish as much, the one whose shard to read has more pairs left
    with cached shards: reading it makes more merges free of reads."""
    from bigknn.engine.scheduler import Scheduler

    cached = {0}
    sched = Scheduler([(0, 1), (1, 3), (0, 2)], ready=range(4), held=cached.__contains__)
    assert sched.next_task(prefer=set())[1] == (0, 2)
    cached = {0, 5}
    sched = Scheduler([(0, 2), (0, 1), (1, 5), (2, 3), (1, 4), (2, 4), (3, 5)], ready=range(6),
                      held=cached.__contains__)
    assert sched.next_task(prefer=set())[1] == (0, 1)  # shard 1 has two pairs with cached shards, shard 2 one


@pytest.mark.parametrize("shards, merges, capacity", [(61, 141, 10), (120, 276, 10), (30, 69, 8)])
def test_near_pairs_through_a_small_cache_read_fewer_shards_than_cached_pairs_first_alone(shards, merges, capacity):
    """A partitioned build's near pairs (as the plan draws them) through an LRU cache: the Scheduler's read
    rules (finish a shard, read the shard that frees most merges) read at most 85 % of the shards that choosing
    cached pairs first alone reads."""
    from bigknn.operations.plan_model import near_pairs

    pairs = near_pairs(shards, merges)
    ours = replay_loads(shards, capacity, True, pairs)
    held_first = replay_loads(shards, capacity, True, pairs, choose_held_first=True)
    assert ours <= 0.85 * held_first, (ours, held_first)


def test_the_cache_drops_first_the_shard_its_pending_pairs_need_least_soon():
    """With (0, 1) running: 4's pending pairs are all with uncached shards, so it goes first although it is the
    most recent; then 5 (one pair, with cached 3), then 3 (pairs with cached 0 and 5); 0 and 1, in the running
    merge, never. Equal ranks keep their least recently used order."""
    from bigknn.engine.scheduler import Scheduler

    sched = Scheduler([(0, 1), (0, 3), (2, 6), (3, 5), (4, 6), (4, 7)], ready=range(8))
    assert sched.next_task(prefer=set())[1] == (0, 1)
    cached = [5, 0, 1, 3, 4]
    assert sched.eviction_order(cached, set(cached)) == [4, 5, 3]
    assert sched.eviction_order([5, 3, 2], {5, 3, 2}) == [2, 5, 3]  # 2: one pair, its partner 6 not cached
    assert sched.eviction_order([7, 2], {7, 2}) == [7, 2] and sched.eviction_order([2, 7], {7, 2}) == [2, 7]


@pytest.mark.parametrize("shards, merges, capacity", [(8, 28, 4), (16, 120, 6), (61, 1830, 10), (61, 141, 10)])
def test_dropping_the_shards_pending_pairs_need_least_reads_fewer_than_least_recently_used(shards, merges, capacity):
    """The Scheduler's order through a cache that drops shards by their pending pairs with cached shards reads
    fewer shards back than one that drops the least recently used: all pairs, and near pairs as the plan draws
    them."""
    from bigknn.operations.plan_model import near_pairs

    pairs = near_pairs(shards, merges)
    ranked, lru = (replay_loads(shards, capacity, True, pairs, evict=rule) for rule in ("scheduler", "lru"))
    assert ranked < lru, (ranked, lru)
