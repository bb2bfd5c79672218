"""Vectors of arbitrary global rows for the prune, read from the store batched: a row's neighbours live in
any shard.

Where every shard fits the host budget, the first request reads them all into one array in global id order,
and every later request is served from it (the backends then see one table for the whole prune, which the
CUDA backend uploads once). Otherwise each request reads the rows it names from the store (each chunk that
holds any of them once) and gets a compact table of its own.
"""

from __future__ import annotations

import numpy as np

from bigknn.operations.search_arrays import shard_rows
from bigknn.shards import Store


class VectorSource:
    def __init__(self, store: Store, host_bytes: int):
        self.store = store
        m = store.manifest
        self.whole = m.rows * m.dim * np.dtype(m.dtype).itemsize <= host_bytes
        self._all: np.ndarray | None = None

    def table(self, global_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(table, index): vectors holding every row of ``global_ids`` (any shape, EMPTY entries allowed) and
        each id's row in that table (EMPTY stays EMPTY)."""
        ids = np.asarray(global_ids, np.int64)
        if self.whole:
            return self.everything(), ids
        valid = ids >= 0
        uniq = np.unique(ids[valid])
        index = np.full(ids.shape, -1, np.int64)
        index[valid] = np.searchsorted(uniq, ids[valid])
        return self.store.vectors_of(uniq), index

    def everything(self) -> np.ndarray:
        """Every row of the store in global id order (read once; only where ``whole``)."""
        if self._all is None:
            m = self.store.manifest
            out = np.empty((m.rows, m.dim), np.dtype(m.dtype))
            for s in m.shards:
                out[shard_rows(s)] = self.store.read_vectors(s.id)
            self._all = out
        return self._all
