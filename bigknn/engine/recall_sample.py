"""The recall estimate a build records: exact top-10 of a fixed sample of rows, found while the data passes.

The sample is drawn before sharding, in two parts: ``PROBE_ROWS`` rows a one-shard build's GNND stops on
(its probe), and ``ESTIMATE_ROWS`` held-out rows that stand for the others in the recorded estimate. An
estimate on the rows that stopped the descent is biased upward: the descent ends at the first iteration
those rows clear the target (held-out text: 0.991 reported, 0.987 true). Each shard's vectors, as GNND takes them (in memory,
straight from the sharding pass), also give the sample's exact neighbours among that shard's rows, so the truth
costs no extra pass over the input. The held-out rows' final lists are kept as the writer writes each final
graph (read back from the store only for shards an earlier run wrote) and compared after the merges
(bigknn/algorithms/recall_target.py): the estimate, its interval and the sample size go into the manifest, the summary
and ``bigknn info``. A resumed build folds in the shards the killed run had not yet seen, from the store.
"""

from __future__ import annotations

import threading
from typing import Iterator

import numpy as np

from bigknn.backends import Backend
from bigknn.formats import VectorSource
from bigknn.core.knn_graph import EMPTY, KnnGraph, merge_lists
from bigknn.core.metric import metric as metric_of, prepare_rows
from bigknn.algorithms.partition.rowmap import RowMap
from bigknn.algorithms.recall_target import (ESTIMATE_ROWS, PROBE_ROWS, RECALL_AT, Estimate, Probe, held_out_estimate, probe_m,
                           row_recalls, without_self)
from bigknn.shards import Manifest, ShardEntry, Store


class SampleTruth:
    """Exact top-(m+1) of ``rows`` (global ids, sorted) over the shards folded in so far."""

    def __init__(self, rows: np.ndarray, vectors: np.ndarray | None, metric: str, k: int, seed: int,
                 positional: bool = False):
        self.rows = rows
        self.held_out = held_out_rows(len(rows), seed)  # (rows,) bool: the rows the estimate is measured on
        self.positional = positional  # the rows are store positions too (a contiguous store): probes can be made
        self.vectors = vectors
        self.metric = metric_of(metric)
        self.m = min(RECALL_AT, k)
        self.ids = np.full((len(rows), self.m + 1), EMPTY, np.int32)
        self.keys = np.full((len(rows), self.m + 1), np.inf, np.float32)
        self.covered: set[int] = set()
        self._positions = rows if positional else None  # the rows' store positions, where known (``place``)
        self._final: dict[int, tuple[int, np.ndarray, np.ndarray, np.ndarray]] = {}  # ``keep_final``'s
        self._lock = threading.Lock()

    @classmethod
    def draw(cls, vf: VectorSource, m: Manifest, seed: int, from_stream: bool = False) -> "SampleTruth":
        """A seeded sample of the input's rows, read (their pages asked for at once) and prepared as stored.
        ``from_stream``: not read here; ``taken_from`` fills it from a one-shard build's only shard (a source
        without cheap scattered reads, Parquet, would decode nearly every row group for a few thousand rows)."""
        rows = sample_rows(vf.rows, seed)
        x = None
        if not from_stream:
            x = np.ascontiguousarray(prepare_rows(vf.take(rows), m.metric).astype(np.dtype(m.dtype), copy=False))
        return cls(rows, x, m.metric, m.k, seed, positional=m.partition is None)

    def taken_from(self, shards: Iterator[tuple[ShardEntry, np.ndarray]]) -> Iterator[tuple[ShardEntry, np.ndarray]]:
        """The sharding pass's shards, passed on unchanged; a sample drawn without its vectors
        (``draw(from_stream=True)``, a one-shard build) takes them from the first: the whole input, prepared as
        stored."""
        for entry, x in shards:
            if self.vectors is None:
                if entry.offset != 0 or len(x) <= int(self.rows[-1]):
                    raise ValueError("a sample taken from the stream needs the whole input in its first shard")
                self.vectors = np.ascontiguousarray(x[self.rows])
            yield entry, x

    @classmethod
    def from_store(cls, store: Store) -> "SampleTruth":
        """The build's sample drawn again from the store's own rows (a resumed run without the input at hand)."""
        m = store.manifest
        rows = sample_rows(m.rows, m.seed)
        return cls(rows, store.vectors_of(RowMap.of(store).to_position(rows)), m.metric, m.k, m.seed)

    def positions(self, store: Store) -> np.ndarray:
        """The sample's store positions (its rows are input rows): as ``place`` gave them, or by the store's
        row map."""
        if self._positions is None:
            self._positions = RowMap.of(store).to_position(self.rows)
        return self._positions

    def place(self, layout: list[np.ndarray], first_offset: int) -> None:
        """The sample rows' store positions from a partition's layout (each shard's input rows, sorted; the
        shards laid end to end from ``first_offset``, as the sharding pass stores them), so that neither
        ``keep_final`` nor ``measure`` reads the store's row map (8 bytes a row)."""
        positions = np.full(len(self.rows), EMPTY, np.int64)
        offset = first_offset
        for rows in layout:
            at = np.minimum(np.searchsorted(rows, self.rows), max(0, len(rows) - 1))
            hit = rows[at] == self.rows if len(rows) else np.zeros(len(self.rows), bool)
            positions[hit] = offset + at[hit]
            offset += len(rows)
        if (positions == EMPTY).any():
            raise ValueError("the layout does not hold every sample row")
        self._positions = positions

    def keep_final(self, shard_id: int, version: int, offset: int, graph: KnnGraph) -> None:
        """Hold the sample's lists in a shard's final graph as written (``version``, rows from ``offset``), so
        that ``measure`` does not read them back: a few thousand rows spread over a large store's graph touch
        most of its chunks, each read and checked whole. Skipped where the positions are not known yet."""
        positions = self._positions
        if positions is None:
            return
        sel = np.nonzero((positions >= offset) & (positions < offset + graph.rows))[0]
        local = positions[sel] - offset
        with self._lock:
            self._final[shard_id] = (version, sel, np.asarray(graph.ids[local, :self.m]),
                                     np.asarray(graph.dists[local, :self.m]))

    def add(self, backend: Backend, shard_id: int, offset: int, x: np.ndarray) -> KnnGraph:
        """Fold the exact neighbours among one shard's rows (global ids from ``offset``) into the truth; returns
        them (``probe``)."""
        g = backend.exact_knn(self.vectors, self.m + 1, self.metric, [(offset, x)])
        self.fold(shard_id, g)
        return g

    def probe(self, offset: int, n: int, g: KnnGraph, width: int, seconds: float) -> Probe | None:
        """The sample rows inside a contiguous store's shard of ``n`` rows from ``offset``, with their exact
        top-m among the shard (``g``, from ``add``, which took ``seconds``), as the probe of the shard's GNND
        (Backend.gnnd): the descent needs no exact search of its own. Only the stopping part of the sample, and
        only where the shard holds all of it (a one-shard build): the held-out rows are what the build reports
        on, and a shard with part of the stopping rows would measure too few (a two-shard build's GNND draws
        PROBE_ROWS of its own). None there, or where the descent measures another m than the sample (k < 10:
        make_probe's m is 10)."""
        inside = np.nonzero((self.rows >= offset) & (self.rows < offset + n) & ~self.held_out)[0]
        if not self.positional or len(inside) < max(2, (~self.held_out).sum()) or self.m != probe_m(width, n):
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
        """Recall@m of the store's committed graph: the held-out rows stand for all rows but the stopping ones,
        which count as measured (recall.held_out_estimate)."""
        rows = self.positions(store)
        got_ids = np.empty((len(rows), self.m), np.int64)
        got_keys = np.empty((len(rows), self.m), np.float32)
        for s in store.manifest.shards:
            kept = self._final.get(s.id)
            if kept is not None and kept[0] == s.graph:  # the committed version, held as it was written
                got_ids[kept[1]], got_keys[kept[1]] = kept[2], kept[3]
                continue
            sel = np.nonzero((rows >= s.offset) & (rows < s.offset + s.rows))[0]
            if sel.size:
                ids, keys_s = store.read_graph_rows(s.id, rows[sel] - s.offset)
                got_ids[sel], got_keys[sel] = ids[:, :self.m], keys_s[:, :self.m]
        return self.measure_lists(rows, got_ids, got_keys, store.manifest.rows)

    def measure_lists(self, positions: np.ndarray, got_ids: np.ndarray, got_keys: np.ndarray,
                      population: int) -> Estimate:
        """Recall@m of the sample's lists ``got`` (rows at store ``positions``, >= m entries each) in a graph of
        ``population`` rows (``measure``'s terms; an in-memory build passes its lists straight)."""
        truth, keys = self.truth(positions)
        per_row = row_recalls(got_ids[:, :self.m], got_keys[:, :self.m], truth, keys[:, -1].copy())
        return held_out_estimate(per_row[self.held_out], per_row[~self.held_out], population)


def sample_rows(n: int, seed: int) -> np.ndarray:
    """The recall sample of an ``n``-row input: PROBE_ROWS + ESTIMATE_ROWS rows (all, if fewer), sorted."""
    size = min(PROBE_ROWS + ESTIMATE_ROWS, n)
    return np.sort(np.random.default_rng((seed, 2)).choice(n, size=size, replace=False)).astype(np.int64)


def held_out_rows(size: int, seed: int) -> np.ndarray:
    """Which of a sample's ``size`` (sorted) rows are held out for the recorded estimate: a seeded share of
    ESTIMATE_ROWS in PROBE_ROWS + ESTIMATE_ROWS, the rest stop descents. Drawn apart from the rows themselves
    so that both parts are uniform over the input."""
    report = size - size * PROBE_ROWS // (PROBE_ROWS + ESTIMATE_ROWS)
    mask = np.zeros(size, bool)
    mask[np.random.default_rng((seed, 3)).choice(size, size=report, replace=False)] = True
    return mask


def record_estimate(store: Store, backend: Backend, sample: SampleTruth) -> dict:
    """Complete the sample's truth, measure the committed graph, and commit the estimate to the manifest."""
    sample.complete(store, backend)
    est = sample.measure(store)
    target = store.manifest.params.recall
    store.manifest.estimate = dict(est.to_dict(), at=RECALL_AT, target=target, graph_rows=store.manifest.rows)
    store.commit()
    return store.manifest.estimate
