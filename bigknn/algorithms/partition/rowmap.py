"""Store positions <-> input row numbers.

Graph arrays hold store positions (a shard's offset plus the row's place in it), which is what every merge
and every vector lookup indexes by. In a contiguous store a position is the input row; in a partitioned one
shard <id>'s rows are the input rows ``shards/<id>/row_ids``, and ingested shards (stored after the build's)
keep their own rows in order. Everything users see (export, neighbours, recall rows, search results) is
translated here, so ids are the input's row numbers whatever the partition.
"""

from __future__ import annotations

import numpy as np


class RowMap:
    """``to_input`` / ``to_position`` over every committed shard of a store (one int64 per row each way)."""

    def __init__(self, input_of: np.ndarray | None):
        self._input_of = input_of  # None: the identity
        self._position_of: np.ndarray | None = None

    @classmethod
    def of(cls, store) -> "RowMap":
        m = store.manifest
        if m.partition is None:
            return cls(None)
        parts = [store.read_row_ids(s.id) if s.id < m.partition.shards else
                 np.arange(s.offset, s.offset + s.rows, dtype=np.int64) for s in m.shards]
        return cls(np.concatenate(parts) if parts else np.zeros(0, np.int64))

    @property
    def identity(self) -> bool:
        return self._input_of is None

    def to_input(self, positions: np.ndarray) -> np.ndarray:
        """Input rows of store positions (EMPTY, -1, stays -1)."""
        positions = np.asarray(positions)
        if self._input_of is None:
            return positions
        out = self._input_of[np.where(positions >= 0, positions, 0)]
        return np.where(positions >= 0, out, positions).astype(positions.dtype, copy=False)

    def to_position(self, rows: np.ndarray) -> np.ndarray:
        """Store positions of input rows (EMPTY stays EMPTY)."""
        rows = np.asarray(rows)
        if self._input_of is None:
            return rows
        if self._position_of is None:
            self._position_of = np.empty_like(self._input_of)
            self._position_of[self._input_of] = np.arange(len(self._input_of))
        out = self._position_of[np.where(rows >= 0, rows, 0)]
        return np.where(rows >= 0, out, rows).astype(rows.dtype, copy=False)
