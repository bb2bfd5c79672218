"""Which shard pairs to merge, in rounds of disjoint pairs (a round-robin tournament).

S shards give S(S-1)/2 pairs in S-1 rounds (S rounds when S is odd); within a round no shard appears
twice, so several GPUs or workers can merge a round's pairs at once without touching the same shard.
"""

from __future__ import annotations


def round_robin(shards: int) -> list[list[tuple[int, int]]]:
    """The circle method: fix one seat, rotate the others one step per round."""
    seats = list(range(shards)) + ([None] if shards % 2 else [])
    m = len(seats)
    rounds = []
    for _ in range(m - 1):
        pairs = [(seats[i], seats[m - 1 - i]) for i in range(m // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        seats = [seats[0], seats[-1], *seats[1:-1]]
    return [r for r in rounds if r]


def round_count(shards: int) -> int:
    """``len(round_robin(shards))`` without listing the pairs (a plan of a billion shards must not)."""
    return 0 if shards < 2 else shards - 1 + shards % 2


def pending_pairs(shards: int, done: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """Every pair not yet merged, in schedule order."""
    return [p for rnd in round_robin(shards) for p in rnd if p not in done]
