"""Capacity-bounded assignment: each row to its most preferred shard that still has room.

A plain nearest-centroid assignment lets dense clusters grow past the GPU memory budget; here a row whose
first choice is full spills to its next choice (the next-nearest centroid), nearest rows first, so shard sizes
stay within ``room`` whatever the data's density.
"""

from __future__ import annotations

import numpy as np


def assign_balanced(cost: np.ndarray, room: np.ndarray) -> np.ndarray:
    """Labels (n,) for rows whose cost of each shard is ``cost`` (n, S), lower preferred; ``room`` (S,) is
    decreased in place by the rows each shard takes. Raises ValueError when the rows exceed the room."""
    n, shards = cost.shape
    if n > int(room.sum()):
        raise ValueError(f"{n} rows exceed the {int(room.sum())} rows of room left in the shards")
    first = cost.argmin(axis=1)
    counts = np.bincount(first, minlength=shards)
    if (counts <= room).all():  # the common case (shards have room until the last rows): no sorting
        room -= counts
        return first
    labels = np.full(n, -1, np.int64)
    order = np.argsort(cost, axis=1)
    todo = np.arange(n)
    for rank in range(shards):
        if todo.size == 0:
            break
        want = order[todo, rank]
        by = np.lexsort((cost[todo, want], want))  # grouped by wanted shard, nearest first
        todo, want = todo[by], want[by]
        first = np.searchsorted(want, np.arange(shards))
        place = np.arange(todo.size) - first[want] < room[want]  # the first room[s] rows wanting s
        labels[todo[place]] = want[place]
        np.subtract.at(room, want[place], 1)
        todo = np.sort(todo[~place])
    return labels



def take_first_choices(first: np.ndarray, key: np.ndarray, room: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``assign_balanced``'s first round from each row's first choice alone (``first`` (n,), its cost
    ``key``): labels (n,), -1 for the rows whose shard had no room left for them (the farthest of those
    wanting it), and those rows' indices, ascending. ``room`` is decreased in place. The spilled rows'
    ``assign_balanced`` on the room left ends as ``assign_balanced`` of every row would."""
    shards = len(room)
    counts = np.bincount(first, minlength=shards)
    if (counts <= room).all():
        room -= counts
        return first, np.zeros(0, np.int64)
    by = np.lexsort((key, first))  # grouped by shard, nearest first
    want = first[by]
    place = np.arange(len(by)) - np.searchsorted(want, np.arange(shards))[want] < room[want]
    labels = np.full(len(first), -1, np.int64)
    labels[by[place]] = want[place]
    room -= np.bincount(want[place], minlength=shards)
    return labels, np.sort(by[~place])
