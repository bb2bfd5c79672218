"""The recall estimate a build records: exact top-10 of a fixed sample of rows, found while the data passes.

The sample is drawn before sharding; each shard's vectors, as GNND takes them (in memory, straight from the
sharding pass), also give the sample's exact neighbours among that shard's rows, so the truth costs no extra
pass over the input. After the merges the sample rows' final lists are read from the store and compared
(bigknn/recall.py): the estimate, its interval and the sample size go into the manifest, the summary and
``bigknn info``. A resumed build folds in the shards the killed run had not yet seen, from the store.
"""

from __future__ import annotations

import threading

import numpy as np

from bigknn.backends import Backend
from bigknn.formats import VectorFile
from bigknn.graph import EMPTY, KnnGraph, merge_lists
from bigknn.metrics import kernel_metric, prepare_rows
from bigknn.partition.rowmap import RowMap
from bigknn.recall import ESTIMATE_ROWS, PROBE_ROWS, RECALL_AT, Estimate, Probe, estimate, probe_m, without_self
from bigknn.shards import Manifest, Store


class SampleTruth:
    """Exact top-(m+1) of ``rows`` (global ids, sorted) over the shards folded in so far."""

    def __init__(self, rows: np.ndarray, vectors: np.ndarray, metric: str, k: int, positional: bool = False):
        self.rows = rows
        self.positional = positional  # the rows are store positions too (a contiguous store): probes can be made
        self.vectors = vectors
        self.metric = kernel_metric(metric)
        self.m = min(RECALL_AT, k)
        self.ids = np.full((len(rows), self.m + 1), EMPTY, np.int32)
        self.keys = np.full((len(rows), self.m + 1), np.inf, np.float32)
        self.covered: set[int] = set()
        self._lock = threading.Lock()

    @classmethod
    def draw(cls, vf: VectorFile, m: Manifest, seed: int, size: int = ESTIMATE_ROWS) -> "SampleTruth":
        """A seeded sample of the input's rows, read (their pages asked for at once) and prepared as stored."""
        rows = np.sort(np.random.default_rng((seed, 2)).choice(vf.rows, size=min(size, vf.rows), replace=False))
        raw = vf.take(rows)
        x = prepare_rows(raw, m.metric).astype(np.dtype(m.dtype), copy=False)
        return cls(rows.astype(np.int64), np.ascontiguousarray(x), m.metric, m.k, positional=m.partition is None)

    @classmethod
    def from_store(cls, store: Store, size: int = ESTIMATE_ROWS) -> "SampleTruth":
        """The build's sample drawn again from the store's own rows (a resumed run without the input at hand)."""
        m = store.manifest
        rows = np.sort(np.random.default_rng((m.seed, 2)).choice(m.rows, size=min(size, m.rows), replace=False))
        return cls(rows.astype(np.int64), store.vectors_of(RowMap.of(store).to_position(rows)), m.metric, m.k)

    def positions(self, store: Store) -> np.ndarray:
        """The sample's store positions (its rows are input rows)."""
        return RowMap.of(store).to_position(self.rows)

    def add(self, backend: Backend, shard_id: int, offset: int, x: np.ndarray) -> KnnGraph:
        """Fold the exact neighbours among one shard's rows (global ids from ``offset``) into the truth; returns
        them (``probe``)."""
        g = backend.exact_knn(self.vectors, self.m + 1, self.metric, [(offset, x)])
        self.fold(shard_id, g)
        return g

    def probe(self, offset: int, n: int, g: KnnGraph, width: int, seconds: float) -> Probe | None:
        """The sample rows inside a contiguous store's shard of ``n`` rows from ``offset``, with their exact
        top-m among the shard (``g``, from ``add``, which took ``seconds``), as the probe of the shard's GNND
        (Backend.gnnd): the descent needs no exact search of its own, and its interval is narrower (2,000 rows
        of a one-shard build against PROBE_ROWS). None where fewer than PROBE_ROWS lie in the shard, or where
        the descent measures another m than the sample (k < 10: make_probe's m is 10)."""
        inside = np.nonzero((self.rows >= offset) & (self.rows < offset + n))[0]
        if not self.positional or len(inside) < PROBE_ROWS or self.m != probe_m(width, n):
            return None
        rows = self.rows[inside] - offset
        ids = g.ids[inside].astype(np.int64)
        ids, keys = without_self(np.where(ids == EMPTY, EMPTY, ids - offset), g.dists[inside], rows, self.m)
        return Probe(rows, ids, keys[:, -1].copy(), exact_pace=seconds / max(1, len(self.rows) * n))

    def fold(self, shard_id: int, g: KnnGraph) -> None:
        """Fold one shard's exact neighbours of the sample (computed here by ``add``, or on a Dask worker
        that had the shard in memory) into the truth; a shard folded before is ignored."""
        with self._lock:
            if shard_id in self.covered:
                return
            self.ids, self.keys = merge_lists(np.concatenate([self.ids, g.ids], axis=1),
                                              np.concatenate([self.keys, g.dists], axis=1), self.m + 1)
            self.covered.add(shard_id)

    def complete(self, store: Store, backend: Backend) -> None:
        """Fold in every committed shard not seen yet (a resumed run), reading it from the store."""
        for s in store.manifest.shards:
            if s.id not in self.covered:
                self.add(backend, s.id, s.offset, store.read_vectors(s.id))

    def truth(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The sample's exact top-m (store positions, keys), each row itself left out."""
        return without_self(self.ids, self.keys, positions, self.m)

    def measure(self, store: Store) -> Estimate:
        """Recall@m of the store's committed graph on the sample."""
        rows = self.positions(store)
        truth, keys = self.truth(rows)
        kth = keys[:, -1].copy()
        got_ids = np.empty((len(rows), self.m), np.int64)
        got_keys = np.empty((len(rows), self.m), np.float32)
        for s in store.manifest.shards:
            sel = np.nonzero((rows >= s.offset) & (rows < s.offset + s.rows))[0]
            if sel.size:
                ids, keys = store.read_graph_rows(s.id, rows[sel] - s.offset)
                got_ids[sel], got_keys[sel] = ids[:, :self.m], keys[:, :self.m]
        return estimate(got_ids, got_keys, truth, kth)


def record_estimate(store: Store, backend: Backend, sample: SampleTruth) -> dict:
    """Complete the sample's truth, measure the committed graph, and commit the estimate to the manifest."""
    sample.complete(store, backend)
    est = sample.measure(store)
    target = store.manifest.params.recall
    store.manifest.estimate = dict(est.to_dict(), at=RECALL_AT, target=target, graph_rows=store.manifest.rows)
    store.commit()
    return store.manifest.estimate
