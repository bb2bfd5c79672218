"""``bigknn prune``: the kNN graph -> a search graph (bigknn/algorithms/search_params.py names the papers and the rules),
shard by shard, out of core, in two passes over the shards:

1. forward: each row's kNN list is diversified (TSDG's first stage with alpha, or the RNG rule); the kept
   edges are written to scratch, and each becomes a reverse edge filed under the shard of its target.
2. reverse: each row gets its reverse edges. TSDG (§3.3): forward and reverse edges together (the nearest
   ``k + degree``) get occlusion factors; sorted by (factor, distance), those above lambda0 dropped, cut to
   ``degree``. RNG: GGNN's symmetric linking (§5.2): a reverse edge z -> x is added where x does not lead back
   to z within two hops inside the sphere around z + 0.4 (x - z), the nearest first, while x has free slots.

A row's candidates' vectors come from any shard: ``VectorSource`` reads them batched. The sorts that turn
edges into lists run on the backend (``Backend.nearest_lists``); what pass 1 hands pass 2 stays in memory
where it fits (``Scratch``). Where the whole graph, its vectors and the lists fit the backend (the device's
budget, or the host's), a tsdg prune runs both stages in one call instead (``Backend.prune_tsdg``,
bigknn/algorithms/tsdg_whole.py: the same graph, without the shards' host round trips). Nothing the readers see
changes until the final commit (the manifest's ``search`` entry, store format 3); a failed prune removes the
version it was writing.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from bigknn.backends import Backend
from bigknn.core.errors import BadInput
from bigknn.core.knn_graph import EMPTY, id_dtype
from bigknn.core.metric import metric as metric_of
from bigknn.core.progress import Reporter
from bigknn.algorithms.columns import take_columns
from bigknn.algorithms.search_params import NO_LAMBDA, DiversifyRule, PruneParams
from bigknn.operations.prune_scratch import Scratch
from bigknn.operations.search_arrays import (SEARCH_DIR, SEARCH_ID_DTYPE, drop_versions, drop_work, locate,
                                 mark_format, next_version, shard_rows, work_path)
from bigknn.operations.prune_vectors import VectorSource
from bigknn.algorithms.tsdg_whole import resident_bytes
from bigknn.shards import Store, safepaths
from bigknn.shards.lock import WriterLock
from bigknn.shards.manifest import CHECKSUMS_SINCE, SEARCH_SINCE
from bigknn.shards.sections import SearchEntry

MAX_ROWS = np.iinfo(SEARCH_ID_DTYPE).max + 1  # rows whose ids fit a search graph
SCRATCH_BYTES_PER_EDGE = 8 + 12  # a forward edge (int32 id, float32 key) and its reverse (int32 dst, src, key)


def prune(path: Path, params: PruneParams, backend: Backend, reporter: Reporter, host_bytes: int,
          wait_s: float = 0.0) -> dict:
    """Prune the store's finished kNN graph into a new search graph version and commit it; return a summary."""
    path = Path(path)
    Store.open(path, pin=False).manifest.require_complete(path)  # refuse before taking the lock
    with WriterLock(path, wait_s):
        store = Store.open(path, pin=False)
        try:
            _check(store, params)
            return _Pruner(store, params, backend, host_bytes).run(reporter)
        finally:
            store.close()


def _check(store: Store, params: PruneParams) -> None:
    m = store.manifest
    m.require_complete(store.path)
    if m.format < CHECKSUMS_SINCE:
        raise BadInput(store.path, f"store format {m.format} has no chunk checksums; rebuild it with this bigknn "
                                   "to prune it")
    if m.rows > MAX_ROWS:
        raise BadInput(store.path, f"{m.rows} rows: search graphs hold int32 ids (at most {MAX_ROWS} rows)")
    try:
        params.check(m.k)
    except ValueError as e:
        raise BadInput(store.path, str(e)) from None


class _Pruner:
    def __init__(self, store: Store, params: PruneParams, backend: Backend, host_bytes: int):
        self.store, self.params, self.backend, self.host_bytes = store, params, backend, host_bytes
        self.m = store.manifest
        self.metric = metric_of(self.m.metric)
        self.k = self.m.k
        self.vectors = VectorSource(store, host_bytes)
        self.version = next_version(store)
        vector_bytes = self.m.rows * self.m.dim * np.dtype(self.m.dtype).itemsize
        scratch_bytes = self.m.rows * params.forward_width(self.k) * SCRATCH_BYTES_PER_EDGE
        self.scratch = Scratch(work_path(store, self.version),
                               self.vectors.whole and vector_bytes + scratch_bytes <= host_bytes)
        self.stats = {"forward_edges": 0, "reverse_edges": 0, "symmetric_links": 0, "edges": 0}

    def run(self, reporter: Reporter) -> dict:
        t0 = time.perf_counter()
        shards = self.m.shards
        try:
            if self._whole_fits():
                with reporter.phase("tsdg", 1, "graphs") as advance:
                    self._whole()
                    advance(1)
            else:
                with reporter.phase("forward", len(shards), "shards") as advance:
                    for s in shards:
                        self._forward(s)
                        advance(1)
                with reporter.phase("reverse", len(shards), "shards") as advance:
                    for s in shards:
                        self._finish(s)
                        advance(1)
            drop_work(self.store, self.version)
        except BaseException:
            safepaths.remove_tree(self.store.path, f"{SEARCH_DIR}/{self.version}")
            raise
        return self._commit(time.perf_counter() - t0)

    # ---- both stages at once ----------------------------------------------------------------------
    def _whole_fits(self) -> bool:
        """tsdg, the vectors and the scratch in host memory, and whole.py's peak within half the device budget
        (or the host budget where no device bounds it)."""
        if self.params.method != "tsdg" or not self.scratch.in_memory:
            return False
        budget = self.backend.memory_budget()
        need = resident_bytes(self.m.rows, self.k, self.m.dim, self.params)
        return need <= (self.host_bytes if budget is None else budget // 2)

    def _whole(self) -> None:
        ids = np.empty((self.m.rows, self.k), id_dtype(self.m.rows))  # int32 below 2^31 rows: half the upload
        keys = np.empty((self.m.rows, self.k), np.float32)
        for s in self.m.shards:
            g = self.store.read_graph(s.id)
            ids[shard_rows(s)], keys[shard_rows(s)] = g.ids[:, :self.k], g.dists[:, :self.k]
        out, lambdas, forward = self.backend.prune_tsdg(ids, keys, self.vectors.everything(), self.metric,
                                                        self.params)
        self.stats["forward_edges"] += forward
        self.stats["reverse_edges"] += forward
        self.stats["edges"] += int((out >= 0).sum())
        for s in self.m.shards:
            self.store.write_search(self.version, f"shards/{s.id}/ids", out[shard_rows(s)])
            self.store.write_search(self.version, f"shards/{s.id}/lambdas", lambdas[shard_rows(s)])

    # ---- pass 1 --------------------------------------------------------------------------------
    def _forward(self, s) -> None:
        g = self.store.read_graph(s.id)
        ids, keys = g.ids[:, :self.k], g.dists[:, :self.k]
        p = self.params
        rule = DiversifyRule("gd", p.alpha) if p.method == "tsdg" else DiversifyRule("rng")
        table, index = self.vectors.table(ids)
        cols, _ = self.backend.diversify_lists(index, keys, table, self.metric, rule, p.forward_width(self.k))
        f_ids, f_keys = take_columns(ids, cols, EMPTY), take_columns(keys, cols, np.float32(np.inf))
        self.scratch.put(f"forward/{s.id}.ids", f_ids)
        self.scratch.put(f"forward/{s.id}.keys", f_keys)
        valid = f_ids >= 0
        self.stats["forward_edges"] += int(valid.sum())
        dst, key = f_ids[valid], f_keys[valid]
        src = np.repeat(shard_rows(s).astype(SEARCH_ID_DTYPE), valid.sum(axis=1))
        pos, _ = locate(self.store, dst)
        for p_i in np.flatnonzero(np.bincount(pos, minlength=len(self.m.shards))):
            mine = pos == p_i
            to = f"reverse/{self.m.shards[p_i].id}/{s.id}"
            self.scratch.put(f"{to}.pairs", np.stack([dst[mine], src[mine]]))  # (2, edges): dst, src
            self.scratch.put(f"{to}.keys", key[mine])

    # ---- pass 2 --------------------------------------------------------------------------------
    def _finish(self, s) -> None:
        f_ids = np.asarray(self.scratch.get(f"forward/{s.id}.ids"), np.int64)
        f_keys = np.asarray(self.scratch.get(f"forward/{s.id}.keys"))
        pairs = self.scratch.parts(f"reverse/{s.id}", ".pairs")
        dst, src = np.concatenate(pairs, axis=1) if pairs else np.empty((2, 0), SEARCH_ID_DTYPE)
        keys = self.scratch.parts(f"reverse/{s.id}", ".keys")
        key = np.concatenate(keys) if keys else np.empty(0, np.float32)
        _, at = locate(self.store, dst)
        self.stats["reverse_edges"] += len(dst)
        if self.params.method == "tsdg":
            ids, lambdas = self._tsdg(f_ids, f_keys, at, src, key)
        else:
            ids, lambdas = self._rng(s, f_ids, at, src.astype(np.int64), key)
        self.stats["edges"] += int((ids >= 0).sum())
        self.store.write_search(self.version, f"shards/{s.id}/ids", ids.astype(SEARCH_ID_DTYPE))
        self.store.write_search(self.version, f"shards/{s.id}/lambdas", lambdas)

    def _tsdg(self, f_ids, f_keys, at, src, key):
        """TSDG §3.3: forward and reverse edges, occlusion factors, sorted by (factor, distance), cut."""
        p = self.params
        width = p.candidate_width(self.k)
        cand, ckeys = self.backend.nearest_lists(len(f_ids), width, at, src, key, (f_ids, f_keys))
        table, index = self.vectors.table(cand)
        # by (factor, column): keys ascend along the columns, so within each factor
        cols, lam = self.backend.diversify_lists(index, ckeys, table, self.metric, DiversifyRule("occlusion"),
                                                 p.degree)
        ids = take_columns(cand, cols, EMPTY)
        drop = lam > p.lambda0
        return np.where(drop, EMPTY, ids), np.where(drop, NO_LAMBDA, lam).astype(np.uint8)

    def _rng(self, s, f_ids, at, src, key):
        """GGNN §5.2: a reverse edge is added only where no two-hop path leads back, nearest first, into the
        slots the forward edges left free."""
        p = self.params
        rows = shard_rows(s)
        mine = f_ids >= 0
        member = np.zeros(self.m.rows, bool)  # the rows whose lists the test reads: this shard's and their lists'
        member[rows] = True
        member[f_ids[mine]] = True
        known = np.flatnonzero(member)  # distinct, ascending, without a sort
        table, index = self.vectors.table(np.concatenate([known, src]))
        known_index, z_index = index[:len(known)], index[len(known):]
        table_row = np.full(self.m.rows, -1, np.int64)  # global id -> table row, for the known ids
        table_row[known] = known_index
        lists = self._forward_lists(known)
        table_lists = np.full((len(table), lists.shape[1]), EMPTY, np.int64)
        table_lists[known_index] = lists
        list_index = np.full(table_lists.shape, -1, np.int64)
        own = table_row[rows]  # table rows of this shard's rows
        list_index[own] = np.where(mine, table_row[np.where(mine, f_ids, 0)], -1)
        found = self.backend.reach_back(table, table_lists, list_index, own[at], z_index, src)
        need = ~found
        free = p.degree - mine.sum(axis=1)
        sym, _ = self.backend.nearest_lists(len(rows), p.degree, at[need], src[need], key[need])
        col = np.arange(p.degree)[None, :]
        sym = np.where(col < free[:, None], sym, EMPTY)
        self.stats["symmetric_links"] += int((sym >= 0).sum())
        # forward edges first (compacted), the symmetric links in the free slots after them
        count = mine.sum(axis=1)[:, None]
        fw = f_ids.shape[1]
        ids = np.where(col < count, np.take_along_axis(f_ids, np.minimum(col, fw - 1), axis=1),
                       np.take_along_axis(sym, np.maximum(col - count, 0), axis=1))
        return ids, np.where(ids >= 0, 0, NO_LAMBDA).astype(np.uint8)

    def _forward_lists(self, global_ids: np.ndarray) -> np.ndarray:
        """Forward lists of any rows (scratch of pass 1)."""
        pos, local = locate(self.store, global_ids)
        out = np.full((len(global_ids), self.params.forward_width(self.k)), EMPTY, np.int64)
        for p_i in np.flatnonzero(np.bincount(pos, minlength=len(self.m.shards))):
            f = self.scratch.get(f"forward/{self.m.shards[p_i].id}.ids")
            mine = pos == p_i
            out[mine] = f[local[mine]]
        return out

    # ---- commit --------------------------------------------------------------------------------
    def _commit(self, seconds: float) -> dict:
        m, p = self.m, self.params
        previous = m.search.version if m.search else None
        mean_degree = round(self.stats["edges"] / max(1, m.rows), 3)
        entry = SearchEntry(version=self.version, method=p.method, degree=p.degree, rows=m.rows,
                            graphs=[s.graph for s in m.shards],
                            made={"alpha": p.alpha, "lambda0": p.lambda0, "knn_k": self.k, "mean_degree": mean_degree,
                                  "seconds": round(seconds, 3)})
        with self.store.lock:
            m.search = entry
            m.format = max(m.format, SEARCH_SINCE)
            m.timings["prune"] = round(m.timings.get("prune", 0.0) + seconds, 3)
            self.store.commit()
        mark_format(self.store)
        drop_versions(self.store, {self.version} | ({previous} if previous else set()))
        return {"store": str(self.store.path), "version": self.version, "method": p.method, "degree": p.degree,
                "alpha": p.alpha if p.method == "tsdg" else None, "rows": m.rows, "knn_k": self.k,
                "mean_degree": mean_degree, **self.stats, "backend": self.backend.name,
                "wall_s": round(seconds, 3)}
