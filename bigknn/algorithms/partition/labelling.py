"""The labelling pass: a sample to learn the partition from, then every row of the file to its shard.

The sample is read first (random rows through the memory map: a few MiB), the labels in one streamed pass
(n int64 labels: 8 GB at 1B rows, host RAM the planner counts). Each shard's rows are then its input rows in
file order (``layout``), which the sharding pass gathers. A row's label needs only its nearest centroid
(``Partition.first_choice``) while its shard has room; the (n, S) costs are computed for the rows that spill.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator

import numpy as np

from bigknn.core.errors import BadInput
from bigknn.formats import CHECK_CHUNK_ROWS, VectorSource, check_rows
from bigknn.core.metric import metric as metric_of, prepare_rows
from bigknn.algorithms.partition.balance import assign_balanced, take_first_choices
from bigknn.algorithms.partition.learn import SLACK, Partition, learn
from bigknn.algorithms.partition.nearest import Nearest

log = logging.getLogger("bigknn")

SAMPLE_PER_SHARD = 1024  # sample rows per shard the partition is learnt on (64 per fine k-means cluster)
SAMPLE_MIN, SAMPLE_MAX = 8192, 262_144
LABEL_CHUNK_ROWS = 1 << 19  # rows labelled at once (192 MiB at 96 float32): few backend calls
READ_THREADS = 4  # threads reading and checking the next chunk: one thread reads a cold file at one fault at a time


def shard_count(rows: int, shard_rows: int, min_rows: int) -> int:
    """Shards of a partitioned build: enough that an equal share leaves each ``SLACK`` of room below
    ``shard_rows`` (full shards would spill every boundary row to a far shard), more than ``min_rows`` rows
    each on average."""
    return max(1, min(-(-int(SLACK * rows) // shard_rows), rows // (min_rows + 1)))


def sample_size(rows: int, shards: int) -> int:
    """Rows of the sample a partition of ``shards`` shards is learnt on, from ``rows`` rows."""
    return min(rows, max(SAMPLE_MIN, min(SAMPLE_MAX, SAMPLE_PER_SHARD * shards)))


def learn_from_file(vf: VectorSource, method: str, shards: int, metric: str, seed: int,
                    nearest: Nearest = None) -> Partition:
    size = sample_size(vf.rows, shards)
    start = time.perf_counter()
    rows = np.sort(np.random.default_rng((seed, 5)).choice(vf.rows, size=size, replace=False))
    part = learn(method, prepare_rows(_checked_take(vf, rows), metric), shards, seed, nearest)
    log.info("partition: %s of %d shards learnt on %s rows in %.1f s", method, shards, f"{size:,}",
             time.perf_counter() - start)
    return part


def _checked_take(vf: VectorSource, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` (sorted) of the file, a bad one refused by its row number: the sample is learnt on before
    the labelling pass checks every row (a NaN would end k-means++ in a ValueError, exit 1)."""
    x = vf.take(rows)
    try:
        check_rows(vf.path, 0, x)
    except BadInput:
        for row, values in zip(rows, x):
            vf.check(int(row), values[None])
        raise
    return x


def layout(vf: VectorSource, part: Partition, metric: str, shard_rows: int, min_rows: int,
           nearest: Nearest = None, progress: Callable[[int], None] | None = None,
           keep: np.ndarray | None = None) -> list[np.ndarray]:
    """Each shard's input rows (sorted): at most ``min(shard_rows, SLACK x an equal share)`` (never below an equal
    share, so that every row has room) and more than
    ``min_rows`` each; a shard left with fewer is dropped and its rows go to their next choice. Bad rows
    (NaN, Inf) are refused here, before anything is written. ``nearest``: as ``Partition.cost``;
    ``progress(rows)``: called as rows are labelled (the first pass only). ``keep``: (rows, dim) in the stored
    dtype, filled with every row as prepared, so that the sharding pass gathers shards from host RAM instead of
    reading the file a second time (and a relabelling after a dropped shard reads it from there too)."""
    filling = keep is not None
    direct = filling and keep.dtype == vf.read_dtype and not metric_of(metric).normalised  # kept as read
    chunks = _checked_chunks(vf, metric, keep if direct else None)
    spent = dict.fromkeys(("read", "nearest", "balance"), 0.0)  # the pass's seconds, said at its end
    while True:
        share = -(-vf.rows // part.shards)  # an equal share: the room every row needs, whatever --shard-rows says
        cap = max(share, min(shard_rows, int(np.ceil(SLACK * vf.rows / part.shards))))
        room = np.full(part.shards, cap, np.int64)
        labels = np.empty(vf.rows, np.int16 if part.shards <= np.iinfo(np.int16).max else np.int64)
        for start, x in _timed(chunks, spent):
            if filling and not direct:
                keep[start:start + len(x)] = x
            labels[start:start + len(x)] = label_chunk(part, x, room, nearest, spent)
            if progress is not None:
                progress(len(x))
        counts = np.bincount(labels, minlength=part.shards)
        if part.shards == 1 or counts.min() > min_rows:
            break
        small = int(counts.argmin())
        log.info("partition: shard %d got %s rows (%s or fewer): dropped, labelling again", small,
                 f"{counts[small]:,}", f"{min_rows:,}")
        part.drop(small)
        progress, filling = None, False
        chunks = _checked_chunks(vf, metric) if keep is None else (
            (lo, keep[lo:lo + LABEL_CHUNK_ROWS]) for lo in range(0, vf.rows, LABEL_CHUNK_ROWS))
    order = np.argsort(labels, kind="stable")  # 16-bit labels: a linear radix sort, not a comparison sort
    log.info("partition: %s rows labelled; waited %.1f s for the reads, %.1f s in nearest centroids, %.1f s "
             "balancing", f"{vf.rows:,}", spent["read"], spent["nearest"], spent["balance"])
    return np.split(order, np.cumsum(counts)[:-1])


def label_chunk(part: Partition, x: np.ndarray, room: np.ndarray, nearest: Nearest,
                spent: dict[str, float] | None = None) -> np.ndarray:
    """Labels of one chunk's rows by the capacity rule (``balance``), ``room`` decreased in place; its
    seconds added to ``spent["nearest"]`` and ``spent["balance"]`` where given."""
    clock = time.perf_counter
    start = clock()
    first = part.first_choice(x, nearest)
    nearest_s = clock() - start
    labels, spilled = take_first_choices(*first, room)
    if spilled.size:
        t = clock()
        cost = part.cost(x[spilled], nearest)
        nearest_s += clock() - t
        labels[spilled] = assign_balanced(cost, room)
    if spent is not None:
        spent["nearest"] += nearest_s
        spent["balance"] += clock() - start - nearest_s
    return labels


def _timed(chunks: Iterator[tuple[int, np.ndarray]], spent: dict[str, float]) -> Iterator[tuple[int, np.ndarray]]:
    """``chunks``, the seconds spent waiting for each added to ``spent["read"]``."""
    while True:
        start = time.perf_counter()
        item = next(chunks, None)
        spent["read"] += time.perf_counter() - start
        if item is None:
            return
        yield item


def _checked_chunks(vf: VectorSource, metric: str, into: np.ndarray | None = None
                    ) -> Iterator[tuple[int, np.ndarray]]:
    """(start, rows prepared for ``metric``) of every ``LABEL_CHUNK_ROWS`` chunk, bad rows refused (the first
    in file order named). The next chunk is read and checked by ``READ_THREADS`` threads, ``CHECK_CHUNK_ROWS``
    rows each (page faults of a cold file and NumPy's checks release the GIL), while this one is labelled;
    two buffers take turns (fresh arrays of a chunk's size cost a page fault per 4 KiB: measured, that
    tripled the reading and checking). ``into``: an array of every row (read dtype, a metric that leaves rows
    as they are) that the chunks are read straight into instead: no copy, and its first-touch page faults
    fall on the reading threads."""
    starts = range(0, vf.rows, LABEL_CHUNK_ROWS)
    buffers = [] if into is not None else [
        np.empty((min(LABEL_CHUNK_ROWS, vf.rows), vf.dim), vf.read_dtype) for _ in range(2)]
    with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="label-read") as pool:
        def load(i: int) -> tuple[np.ndarray, list[Future]]:
            rows = min(LABEL_CHUNK_ROWS, vf.rows - starts[i])
            block = into[starts[i]:starts[i] + rows] if into is not None else buffers[i % 2][:rows]
            return block, [pool.submit(_read_checked, vf, starts[i] + lo, block[lo:lo + CHECK_CHUNK_ROWS])
                           for lo in range(0, len(block), CHECK_CHUNK_ROWS)]

        ahead = load(0) if starts else None
        for i, start in enumerate(starts):
            block, parts = ahead
            for part in parts:
                part.result()
            if i + 1 < len(starts):  # into the buffer the previous chunk is done with
                ahead = load(i + 1)
            yield start, prepare_rows(block, metric)


def _read_checked(vf: VectorSource, start: int, out: np.ndarray) -> None:
    """Rows ``start``... of the file into ``out``, bad rows refused."""
    vf.read_into(start, out)
    vf.check(start, out)
