"""Near-duplicate groups: the connected components of the graph's edges at or under a distance, by
union-find over the lists (memory: one int64 per row, plus a graph chunk per read thread).

Each read thread takes one graph chunk of a shard at a time (so each chunk file is read and checked once),
compares its stored keys with the threshold turned into a key once (``Metric.key_at_most``: no distance is
computed, no mask or repeated row array is made) and unites every near entry's rows in the shared parent
array (``unionfind``). A union hangs the larger root under the smaller, so a group's root is its lowest row
id: that row is the group's id and the row it keeps (a deterministic rule that needs no vectors, and the
first occurrence in input order). Distances are the graph's (``Graph.neighbors``): Euclidean for l2, 1 - cos
for cosine. The union runs over store positions; a partitioned store's groups are then relabelled by their
lowest input row."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numba
import numpy as np

from bigknn.algorithms.partition.rowmap import RowMap
from bigknn.core.atomic import atomic_path
from bigknn.core.errors import BadInput, disk_full_named
from bigknn.core.knn_graph import KnnGraph
from bigknn.core.metric import metric
from bigknn.operations.readout import neighbours_per_row
from bigknn.products.atomics import fetch_add
from bigknn.products.unionfind import flatten, singletons, unite_near
from bigknn.shards import Store
from bigknn.shards.arrays import ReadBuffers

GROUP_FORMATS = ("parquet", "csv", "npy")
KEEP_FORMATS = ("npy", "txt", "ids")  # .txt and .ids: one row id a line
WRITE_ROWS = 1 << 20  # rows per Parquet row group / text chunk
GROUP_COLUMNS = (("row", np.int64), ("group", np.int64), ("kept", np.bool_), ("group_size", np.int64))
READ_THREADS = min(32, os.cpu_count() or 1)  # graph chunks read, checked and united at once


@numba.njit(cache=True)
def _input_labels(root: np.ndarray, input_of: np.ndarray) -> np.ndarray:
    """Each input row's group as its lowest input row, from each store position's root position."""
    lowest = np.full(len(root), len(root), np.int64)
    for p in range(len(root)):
        lowest[root[p]] = min(lowest[root[p]], input_of[p])
    labels = np.empty(len(root), np.int64)
    for p in range(len(root)):
        labels[input_of[p]] = lowest[root[p]]
    return labels


@numba.njit(parallel=True, cache=True)
def _group_counts(labels: np.ndarray) -> np.ndarray:
    """(rows,) how many rows each row's id labels (a bincount on every core)."""
    counts = np.zeros(len(labels), np.int64)
    for i in numba.prange(len(labels)):
        fetch_add(counts, labels[i], 1)
    return counts


@numba.njit(parallel=True, cache=True)
def _group_starts(counts: np.ndarray, parts: int) -> tuple[np.ndarray, int]:
    """(each group id's first place in the grouped rows, their total): a prefix sum of the sizes of groups
    of two or more, block by block on ``parts`` cores."""
    n = len(counts)
    blocks = max(1, min(n, 4 * parts))
    step = -(-n // blocks)
    sums = np.zeros(blocks + 1, np.int64)
    for b in numba.prange(blocks):
        total = 0
        for g in range(b * step, min(n, (b + 1) * step)):
            if counts[g] >= 2:
                total += counts[g]
        sums[b + 1] = total
    for b in range(blocks):
        sums[b + 1] += sums[b]
    start = np.empty(n, np.int64)
    for b in numba.prange(blocks):
        total = sums[b]
        for g in range(b * step, min(n, (b + 1) * step)):
            start[g] = total
            if counts[g] >= 2:
                total += counts[g]
    return start, sums[blocks]


def _group_rows(labels: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The rows in groups of two or more, by group, then row (``_counting_sort`` on every core)."""
    return _counting_sort(labels, counts, numba.get_num_threads())


def _column_slices(rows: np.ndarray, labels: np.ndarray, counts: np.ndarray
                   ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """(row, group, kept, group_size) of ``WRITE_ROWS`` grouped rows at a time: the last three are gathered per
    slice, so the whole columns are never made (fresh memory is paid for page by page)."""
    for start in range(0, max(len(rows), 1), WRITE_ROWS):
        row = rows[start:start + WRITE_ROWS]
        yield (row,) + _gathered(row, labels, counts)


@numba.njit(parallel=True, cache=True)
def _gathered(row: np.ndarray, labels: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group, kept, group_size) of the rows ``row``, gathered on every core."""
    group = np.empty(len(row), np.int64)
    kept = np.empty(len(row), np.bool_)
    size = np.empty(len(row), np.int64)
    for i in numba.prange(len(row)):
        g = labels[row[i]]
        group[i] = g
        kept[i] = row[i] == g
        size[i] = counts[g]
    return group, kept, size


@numba.njit(parallel=True, cache=True)
def _counting_sort(labels: np.ndarray, counts: np.ndarray, parts: int) -> np.ndarray:
    """A counting sort by label on every core, each core owning a range of group ids with an equal share of the
    rows and scanning the labels in row order for its own (so each group's rows come out ascending, with no
    atomics)."""
    start, total = _group_starts(counts, parts)
    bounds = np.searchsorted(start, np.arange(parts + 1) * total // parts)
    bounds[0], bounds[parts] = 0, len(counts)
    rows = np.empty(total, np.int64)
    for t in numba.prange(parts):
        lo, hi = bounds[t], bounds[t + 1]
        for i in range(len(labels)):
            g = labels[i]
            if lo <= g < hi and counts[g] >= 2:
                at = start[g]
                start[g] = at + 1
                rows[at] = i
    return rows


@numba.njit(parallel=True, cache=True)
def _tally(counts: np.ndarray) -> tuple[int, int, int, int]:
    """(groups of two or more, rows in them, rows kept, the largest group's size) from the counts."""
    groups, in_groups, kept, largest = 0, 0, 0, 0
    for g in numba.prange(len(counts)):
        c = counts[g]
        if c >= 2:
            groups += 1
            in_groups += c
        if c > 0:
            kept += 1
        largest = max(largest, c)
    return groups, in_groups, kept, largest


@dataclass
class Components:
    """Each row's group (the lowest row id in it) among the edges at distance <= ``max_distance``."""

    labels: np.ndarray  # (rows,) int64: the group's lowest row id
    max_distance: float
    counts: np.ndarray = field(init=False, repr=False)  # (rows,) rows whose group is each row (0: not a group id)

    def __post_init__(self) -> None:
        self.counts = _group_counts(self.labels)

    @property
    def sizes(self) -> np.ndarray:
        """(rows,) the size of each row's group (1: no near duplicate)."""
        return self.counts[self.labels]

    @property
    def kept(self) -> np.ndarray:
        """(rows,) bool: the row a deduplication keeps, one per group (its lowest id), and every single row."""
        return self.counts > 0

    def write(self, out: str | Path, keep: str | Path | None = None) -> dict:
        """Write the groups (``write_groups``) and return the summary ``bigknn dedup`` prints."""
        return write_groups(self, Path(out), None if keep is None else Path(keep))

    def summary(self) -> dict:
        groups, in_groups, kept, largest = _tally(self.counts)
        return {"rows": len(self.labels), "max_distance": self.max_distance, "groups": int(groups),
                "rows_in_groups": int(in_groups), "largest_group": int(largest),
                "rows_kept": int(kept), "rows_removed": len(self.labels) - int(kept)}


def components(store: Store, max_distance: float, k: int | None = None) -> Components:
    """Union-find over every list entry (of each row's first ``k``) at distance <= ``max_distance``."""
    if not np.isfinite(max_distance) or max_distance < 0:
        raise BadInput(store.path, f"max_distance must be a finite distance >= 0, got {max_distance}")
    m = store.manifest
    m.require_complete(store.path)  # unfinished lists are not yet top-k over all rows
    k = neighbours_per_row(store, k)
    bound = metric(m.metric).key_at_most(max_distance)
    parent = singletons(m.rows)

    each_graph_block(store, lambda first, g: unite_near(parent, g.ids, g.dists, k, bound, first))
    flatten(parent)
    rowmap = RowMap.of(store)
    if not rowmap.identity:
        parent = _input_labels(parent, np.asarray(rowmap.to_input(np.arange(m.rows, dtype=np.int64)), np.int64))
    return Components(parent, float(max_distance))


def each_graph_block(store: Store, visit: Callable[[int, KnnGraph], None]) -> None:
    """``visit(first row, lists)`` for every block of the store's committed graph, one graph chunk at a time on
    READ_THREADS threads (each chunk file read and checked once; each thread reuses its buffers, so a block's
    arrays are valid only during its visit)."""
    local = threading.local()

    def read(shard_id: int, offset: int, lo: int, hi: int) -> None:
        if not hasattr(local, "buffers"):
            local.buffers = ReadBuffers()
        visit(offset + lo, store.read_graph(shard_id, start=lo, stop=hi, buffers=local.buffers))

    blocks = [(shard.id, shard.offset, lo, min(lo + step, shard.rows))
              for shard in store.manifest.shards for step in (store.graph_chunk_rows(shard.id),)
              for lo in range(0, shard.rows, step)]
    with ThreadPoolExecutor(READ_THREADS) as pool:
        futures = [pool.submit(read, *block) for block in blocks]  # a block is read when its task runs
        try:
            for future in futures:
                future.result()
        finally:
            for future in futures:  # after a damaged chunk, the blocks not yet started are not read
                future.cancel()


def write_groups(comp: Components, out: Path, keep: Path | None = None) -> dict:
    """Write the rows of groups of two or more (row, group, kept, group_size; by group, then row) to ``out``
    (.parquet, .csv or .npy), and with ``keep`` every kept row's id (.npy, or text: .txt/.ids)."""
    out, keep = Path(out), None if keep is None else Path(keep)
    fmt = _format(out, GROUP_FORMATS, "groups")
    keep_fmt = None if keep is None else _format(keep, KEEP_FORMATS, "kept rows")
    if fmt == "parquet":
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise BadInput(out, "writing Parquet needs pyarrow: pip install 'bigknn[parquet]', or write .csv "
                                "or .npy") from None
    with ExitStack() as files, ThreadPoolExecutor(1) as pool:  # the pool exits (joins) before the renames
        tmp = files.enter_context(atomic_path(out))
        kept = None
        if keep is not None:  # written beside the groups; both renamed into place only once both are whole
            kept = pool.submit(_write_kept, files.enter_context(atomic_path(keep)), keep, keep_fmt, comp.counts)
        with disk_full_named(out, None):
            rows = _group_rows(comp.labels, comp.counts)
            {"parquet": _parquet, "csv": _csv, "npy": _npy}[fmt](tmp, len(rows),
                                                                 _column_slices(rows, comp.labels, comp.counts))
        if kept is not None:
            kept.result()
    return {**comp.summary(), "files": [str(out)] + ([] if keep is None else [str(keep)])}


def _write_kept(tmp: Path, keep: Path, fmt: str, counts: np.ndarray) -> None:
    """The kept rows' ids (each group's id, and every single row: the rows some row's label names)."""
    kept = np.flatnonzero(counts)
    with disk_full_named(keep, None), open(tmp, "wb") as f:
        if fmt == "npy":
            np.save(f, kept)
        else:
            for start in range(0, len(kept), WRITE_ROWS):
                np.savetxt(f, kept[start:start + WRITE_ROWS], fmt="%d")


def _format(path: Path, allowed: tuple[str, ...], what: str) -> str:
    fmt = path.suffix.lower().removeprefix(".")
    if fmt not in allowed:
        raise BadInput(path, f"{what} are written as {', '.join('.' + f for f in allowed)}, not "
                             f"{path.suffix or '(no extension)'!r}")
    return fmt


def _parquet(tmp: Path, rows: int, slices: Iterable[tuple[np.ndarray, ...]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("row", pa.int64()), ("group", pa.int64()), ("kept", pa.bool_()),
                        ("group_size", pa.int64())])
    # delta encoding: rows ascend within a group, groups ascend, sizes repeat (smaller and faster to write
    # than dictionaries of near-unique ids)
    encoding = {name: "DELTA_BINARY_PACKED" for name, dtype in GROUP_COLUMNS if dtype == np.int64}
    with pq.ParquetWriter(tmp, schema, use_dictionary=False, column_encoding=encoding) as writer:
        for part in slices:
            writer.write_table(pa.table(dict(zip((name for name, _ in GROUP_COLUMNS), part)), schema=schema))


def _csv(tmp: Path, rows: int, slices: Iterable[tuple[np.ndarray, ...]]) -> None:
    with open(tmp, "wb") as f:
        f.write((",".join(name for name, _ in GROUP_COLUMNS) + "\n").encode())
        for part in slices:
            if len(part[0]):
                np.savetxt(f, np.stack([c.astype(np.int64) for c in part], axis=1), fmt="%d", delimiter=",")


def _npy(tmp: Path, rows: int, slices: Iterable[tuple[np.ndarray, ...]]) -> None:
    table = np.empty(rows, np.dtype(list(GROUP_COLUMNS)))
    start = 0
    for part in slices:
        for (name, _), c in zip(GROUP_COLUMNS, part):
            table[name][start:start + len(c)] = c
        start += len(part[0])
    with open(tmp, "wb") as f:
        np.save(f, table)
