"""A store's directed edges, streamed shard by shard, and the bucketing that files every edge and its
reverse under the row block of its row: the first pass of every symmetric product. The second pass reads
one block at a time, so the graph is never whole in memory. Where every block fits one, the buckets stay in
memory; otherwise each block is a file of edges in a temporary directory the caller places (next to the
output), removed at the end."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np

from bigknn.core.errors import disk_full_named
from bigknn.operations.readout import shard_blocks
from bigknn.engine.pending import physical_memory
from bigknn.shards import Store

EDGE = np.dtype([("row", "<i8"), ("col", "<i8"), ("w", "<f4"), ("fwd", "u1")])  # fwd: 1 from row's own list
# a block's edges, their sort keys and order, the sorted copy and the joined output: about 5 edges' bytes per
# edge at the peak tracemalloc measures (scripts/bench_products.py)
WORK_PER_EDGE = 5 * EDGE.itemsize


def default_budget() -> int:
    """Host memory for a block's edges when the caller names none: half the machine's RAM, as the build's
    shard cache (``--host-mem``)."""
    return physical_memory() // 2


def shard_edges(store: Store, k: int | None) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(input rows as int64 (n,), neighbour ids (n, k), distances (n, k)) of each shard, nearest first."""
    for rows, ids, dists in shard_blocks(store, k):
        if isinstance(rows, slice):
            rows = np.arange(rows.start, rows.stop, dtype=np.int64)
        yield np.asarray(rows, np.int64), ids, dists


def both_ways(rows: np.ndarray, ids: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Every list entry row -> id as a forward edge and as its reverse id -> row (fwd 0), with weight ``w``."""
    valid = (ids >= 0).ravel()
    r = np.repeat(rows, ids.shape[1])[valid]
    c = ids.ravel()[valid].astype(np.int64)
    n = len(r)
    out = np.empty(2 * n, EDGE)
    out["row"][:n], out["col"][:n], out["row"][n:], out["col"][n:] = r, c, c, r
    out["w"][:n] = out["w"][n:] = np.asarray(w, np.float32).ravel()[valid]
    out["fwd"][:n], out["fwd"][n:] = 1, 0
    return out


def block_rows(rows: int, k: int, budget: int) -> int:
    """Rows per block such that a block's edges (2k per row on average: its lists and their reverses) and the
    work on them fit ``budget`` bytes."""
    return int(max(1, min(rows, budget // (2 * k * WORK_PER_EDGE))))


class Buckets:
    """Edges filed under the row block of their ``row``: a list in memory where one block holds all rows,
    else one file per block in a new temporary directory under ``tmp_parent``."""

    def __init__(self, rows: int, block: int, tmp_parent: Path | None):
        self.rows, self.block = rows, block
        self.count = -(-rows // block)
        self._memory: list[np.ndarray] | None = [] if self.count == 1 else None
        self._dir = None if self.count == 1 else Path(tempfile.mkdtemp(prefix=".bigknn-edges-", dir=tmp_parent))

    @property
    def on_disk(self) -> bool:
        return self._dir is not None

    def add(self, edges: np.ndarray) -> None:
        if self._memory is not None:
            self._memory.append(edges)
            return
        which = edges["row"] // self.block
        order = np.argsort(which, kind="stable")
        edges, which = edges[order], which[order]
        cuts = np.searchsorted(which, np.arange(self.count + 1))
        for b in np.nonzero(np.diff(cuts))[0]:
            path = self._file(b)
            with disk_full_named(path, None), open(path, "ab") as f:
                edges[cuts[b]:cuts[b + 1]].tofile(f)

    def blocks(self) -> Iterator[tuple[int, int, np.ndarray]]:
        """(first row, end row, edges whose row lies in the block) for each block in row order."""
        for b in range(self.count):
            lo, hi = b * self.block, min(self.rows, (b + 1) * self.block)
            if self._memory is not None:
                edges = np.concatenate(self._memory) if self._memory else np.zeros(0, EDGE)
                self._memory = []
            else:
                path = self._file(b)
                edges = np.fromfile(path, EDGE) if path.exists() else np.zeros(0, EDGE)
                path.unlink(missing_ok=True)
            yield lo, hi, edges

    def _file(self, b: int) -> Path:
        return self._dir / f"block-{b:08d}.edges"

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)  # the directory mkdtemp made for this run, nothing else

    def __enter__(self) -> Buckets:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
