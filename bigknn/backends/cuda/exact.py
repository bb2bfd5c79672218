"""Exact k-NN on the GPU: queries against blocks of rows streamed from the host.

Two ways to keep each query's running top-k over a block (exact.cu, exact_fused.cu):

* **fused** (``knn_fused``): tensor-core dot products of half copies (scaled by powers of two) and the
  threshold filter in one kernel; no distance matrix reaches memory. Each query keeps a list ``fused_width``
  entries wide (a margin over k for the rounding of halves), whose keys are recomputed exactly before the
  top k are taken. For rows of up to FUSED_MAX_DIM dims and enough queries to fill the GPU (FUSED_MIN_QUERIES):
  whole exact graphs (iid shards, exact merges), the build's recall sample.
* **tiled** (``knn_select``): cuBLAS float32 dot-product tiles, then a running top-k per query (threshold
  filter + bitonic sort of the survivors, pieces of 4096 columns). Few queries (probes, eval) or wide rows.

``knn_exact_keys`` recomputes the kept keys exactly after each block. Host blocks go to two device slots on
a copy stream, staged through the pinned buffers (transfer.py), so the copy of block i+1 overlaps the work
on block i; a block with a copy kept on the device (resident.py) is read there. Device bytes: memory.py.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from bigknn.backends.cuda.compile import MAX_K, compile_kernels, sync_check
from bigknn.backends.cuda.gpu import Gpu
from bigknn.backends.cuda.memory import free_pools
from bigknn.backends.cuda.rows import half_rows, row_blocks
from bigknn.core.knn_graph import EMPTY, KnnGraph, merge_lists
from bigknn.core.metric import Metric

DEVICE_BLOCK_BYTES = 1 << 30  # rows on the device are searched in parts of this size (rows.BLOCK_BYTES: why)
FUSED_MAX_DIM = 256  # widest rows (padded to 16 dims) whose query fragments fit the fused kernel's registers
FUSED_MIN_DIM = 16  # narrower rows have too few terms to average out the halves' rounding: tiled (float32)
FUSED_MIN_QUERIES = 32768  # fewer queries leave SMs idle in 128-query blocks: the tiled way fills them
FUSED_WARPS = 8  # exact_fused.cu FB_WARPS: warps per block, 16 queries each
FUSED_BLOCK_QUERIES = 16 * FUSED_WARPS
FUSED_CHUNK_BYTES = 24 << 20  # rows per launch: a chunk every block reads stays in L2 (50-60 MB on Hopper)
FUSED_MARGIN = 8  # extra list entries (at least; k/4 where larger) kept past k for the halves' rounding


# measured costs (docs/perf-notes.md, H200): what a descent weighs its own remaining cost against
# (recall.Stopper), not a promise
FUSED_PAIR_S = 1.2e-12  # knn_fused, per query-row pair: the pass test, buffers and lists
FUSED_PAIR_DIM_S = 5.5e-15  # knn_fused, per pair and dim (padded to 16): the tensor-core products
TILED_PAIR_DIM_S = 1e-13  # cuBLAS float32 tiles + knn_select (T5's rate, docs/perf-notes.md)
EXACT_CALL_S = 2e-3  # allocations, launches, the copies back: what a small call costs whatever its size


def exact_seconds(nq: int, rows: int, d: int) -> float:
    """Predicted seconds of the exact top-k of ``nq`` queries over ``rows`` rows of ``d`` dims on one GPU."""
    if uses_fused(nq, d):
        return EXACT_CALL_S + nq * rows * (FUSED_PAIR_S + _dims16(d) * FUSED_PAIR_DIM_S)
    return EXACT_CALL_S + nq * rows * d * TILED_PAIR_DIM_S


def fused_width(k: int) -> int:
    """Entries each query keeps in the fused kernel: k plus a margin, so that a neighbour whose half-precision
    key ranks it just past k is still there when the exact keys decide."""
    return min(MAX_K, k + max(FUSED_MARGIN, k // 4))


def uses_fused(nq: int, d: int) -> bool:
    return nq >= FUSED_MIN_QUERIES and FUSED_MIN_DIM <= d and _dims16(d) <= FUSED_MAX_DIM


def fused_shared_bytes(dp: int) -> int:
    """Shared memory of one knn_fused block for rows of ``dp`` (a multiple of 16) dims, exact_fused.cu's layout in
    4-byte words: FB_STAGES tiles of FB_TILE rows (RSW words each) and their norms, the queries' buffers
    (key, id), tau and counts, and each warp's sort scratch (key, id)."""
    nk = dp // 16
    rsw, stages, qb = nk * 8 + 4, 3 if nk <= 11 else 2, FUSED_BLOCK_QUERIES
    return 4 * (stages * 128 * (rsw + 1) + 2 * qb * 64 + 2 * qb + 2 * FUSED_WARPS * 256)


def _dims16(d: int) -> int:
    return -(-d // 16) * 16


def exact_graph(gpu: Gpu, x, k: int, metric: Metric) -> KnnGraph:
    """Exact k-NN graph of x among itself, self excluded (small sets, descents that cannot reach their
    target)."""
    n = x.shape[0]
    try:
        if min(k + 1, n) <= MAX_K:
            return _exact(gpu, x, min(k + 1, n), metric, [(0, x)], self_base=0)
        return _exact_widest(gpu, x, k, metric)
    finally:
        free_pools()  # as at the end of every call of the backend


def _exact_widest(gpu: Gpu, x, k: int, metric: Metric) -> KnnGraph:
    """The exact graph k = MAX_K wide, a width whose top-(k + 1) with the row itself the kernels cannot hold:
    each half's rows take their top k among the other half and their top k - 1 among their own half (self
    dropped), and keep the nearest k of the two (disjoint) lists (graph.merge_lists)."""
    n, h = x.shape[0], x.shape[0] // 2
    ids, dists = np.empty((n, k), np.int32), np.empty((n, k), np.float32)
    for lo, hi, other in ((0, h, (h, n)), (h, n, (0, h))):
        own = _exact(gpu, x[lo:hi], k, metric, [(lo, x[lo:hi])], self_base=lo)
        far = _exact(gpu, x[lo:hi], k, metric, [(other[0], x[other[0]:other[1]])])
        ids[lo:hi], dists[lo:hi] = merge_lists(np.concatenate([own.ids, far.ids], axis=1),
                                               np.concatenate([own.dists, far.dists], axis=1), k)
    return KnnGraph(ids, dists)


def exact_knn(gpu: Gpu, queries, k: int, metric: Metric, blocks: Iterable[tuple[int, np.ndarray]]) -> KnnGraph:
    """Exact top-k of each query over all rows of ``blocks`` ((global offset, vectors), host or device)."""
    return _exact(gpu, queries, k, metric, blocks)


def _exact(gpu: Gpu, queries, k: int, metric: Metric, blocks: Iterable[tuple[int, np.ndarray]],
           self_base: int | None = None) -> KnnGraph:
    """Exact top-k as exact_knn; with ``self_base`` (queries are the rows themselves, ids from self_base) each
    row's own id is dropped, leaving k - 1 (graph.drop_self's rule)."""
    import cupy as cp

    m = metric.kernel_id
    k = int(k)
    if k < 1 or k > MAX_K:
        raise ValueError(f"CUDA exact_knn supports 1 <= k <= {MAX_K}, got k={k}")
    nq, d = queries.shape
    k_out = k - 1 if self_base is not None else k
    if nq == 0 or k_out == 0:
        return KnnGraph(np.empty((nq, k_out), np.int32), np.empty((nq, k_out), np.float32))
    cs = cp.cuda.Stream(non_blocking=True)
    with cs:
        Q = cp.ascontiguousarray(cp.asarray(queries).astype(cp.float32, copy=False))
        qn = (Q * Q).sum(axis=1, dtype=cp.float32) if m == 0 else cp.zeros((1,), dtype=cp.float32)
        select = (_Fused if uses_fused(nq, d) else _Tiled)(gpu, Q, qn, m, k)
        mod = compile_kernels((f"knn_exact_keys<{m}>",))
        k_exact = mod.get_function(f"knn_exact_keys<{m}>")
    kw = select.width
    for off, B in _device_blocks(gpu, blocks, d, cs):
        with cs:
            Bf = B if B.dtype == cp.float32 else B.astype(cp.float32)
            bn = (Bf * Bf).sum(axis=1, dtype=cp.float32) if m == 0 else None
            select.add(int(off), Bf, bn)
            k_exact((((nq * kw) * 32 + 255) // 256,), (256,), (Q, np.int32(nq), Bf, np.int32(Bf.shape[0]), np.int32(d),
                                                               np.int64(int(off)), np.int32(kw), select.ti, select.tk))
            sync_check(cp)
            del Bf, bn
    with cs:
        out_k = cp.empty((nq, k_out), dtype=cp.float32)
        out_i = cp.empty((nq, k_out), dtype=cp.int32)
        mod.get_function("knn_sort_rows")(((nq + 3) // 4,), (128,), (
            select.tk, select.ti, np.int32(nq), np.int32(kw), np.int32(k_out),
            np.int64(-1 if self_base is None else self_base), out_k, out_i))
        sync_check(cp)
    cs.synchronize()
    return KnnGraph(out_i.get(), out_k.get())


def _device_blocks(gpu: Gpu, blocks: Iterable[tuple[int, np.ndarray]], d: int, cs) -> Iterator[tuple[int, object]]:
    """(offset, device rows) for each block, ready for work queued on ``cs``: host blocks are copied into two
    device slots on a copy stream, so that the copy of block i+1 overlaps the work queued on block i (the
    slot of block i-1 is reused once that work is done)."""
    import cupy as cp

    xs = cp.cuda.Stream(non_blocking=True)
    dev_raw = [None, None]
    ev_done = [None, None]
    nblk = 0
    for off, blk in blocks:
        rows = int(blk.shape[0])
        if rows == 0:
            continue
        if blk.ndim != 2 or blk.shape[1] != d:
            raise ValueError(f"block at offset {off} has shape {blk.shape}, queries have dim {d}")
        slot = nblk % 2
        nblk += 1
        kept = None if isinstance(blk, cp.ndarray) else gpu.resident.get(blk, cs)  # uploaded ahead (stage)
        if isinstance(blk, cp.ndarray) or kept is not None:
            dev = cp.ascontiguousarray(blk if kept is None else kept)
            parts = row_blocks(rows, d, DEVICE_BLOCK_BYTES)  # a whole shard: below 2^31 elements a part
            for i in parts:
                yield off + i, dev[i:i + parts.step]
        else:
            blk = np.ascontiguousarray(blk)
            if ev_done[slot] is not None:
                xs.wait_event(ev_done[slot])  # the slot is no longer read by block i-2
            if dev_raw[slot] is None or dev_raw[slot].nbytes < blk.nbytes:
                if ev_done[slot] is not None:
                    ev_done[slot].synchronize()  # the old buffer may still be read on cs
                with xs:
                    dev_raw[slot] = cp.empty((blk.nbytes,), dtype=cp.uint8)
            B = dev_raw[slot][:blk.nbytes].view(blk.dtype).reshape(blk.shape)
            # staged through small pinned buffers with threaded host copies; returns when the last chunk is
            # queued, so this copy overlaps the GPU work queued on cs for block i-1
            gpu.transfer.h2d(blk, B, xs)
            cs.wait_event(xs.record())
            yield off, B
        ev_done[slot] = cs.record()


class _Tiled:
    """Running top-k by cuBLAS dot-product tiles and ``knn_select``."""

    def __init__(self, gpu: Gpu, Q, qn, m: int, k: int):
        import cupy as cp

        self.gpu, self.Q, self.qn, self.m, self.width = gpu, Q, qn, m, k
        nq = Q.shape[0]
        self.tk = cp.full((nq, k), np.inf, dtype=cp.float32)
        self.ti = cp.full((nq, k), EMPTY, dtype=cp.int32)
        self.k_sel = compile_kernels((f"knn_select<{m}>",)).get_function(f"knn_select<{m}>")
        self.s_buf = None
        self.budget = gpu.budget()

    def _tiles(self, rows: int, d: int, itemsize: int) -> tuple[int, int]:
        """(query batch, column tile) from what the budget leaves (sized on the first block)."""
        import cupy as cp

        nq = self.Q.shape[0]
        fixed = nq * (4 * d + 8 * self.width)
        avail = self.budget - fixed - 2 * rows * (d * itemsize + 4 * d + 4) - (64 << 20)
        tc = min(65536, -(-rows // 4096) * 4096)
        qb = min(nq, max(0, avail) // (4 * tc))
        if qb < min(nq, 2048):
            tc = min(65536, max(4096, (max(0, avail) // (4 * min(nq, 2048))) // 4096 * 4096))
            qb = min(nq, max(0, avail) // (4 * tc))
        if qb < 1:
            raise MemoryError(f"exact_knn: GPU budget {self.budget / 2**30:.2f} GiB too small for "
                              f"{nq} queries and blocks of {rows} x {d}")
        self.s_buf = cp.empty((qb * tc,), dtype=cp.float32)
        return qb, tc

    def add(self, off: int, Bf, bn) -> None:
        import cupy as cp

        rows, d = Bf.shape
        if self.s_buf is None:
            self.qb, self.tc = self._tiles(rows, d, 4)
        nq, qb, tc = self.Q.shape[0], self.qb, self.tc
        dummy = self.qn if bn is None else None
        for c0 in range(0, rows, tc):
            tcc = min(tc, rows - c0)
            bn_view = bn[c0:] if bn is not None else dummy
            for q0 in range(0, nq, qb):
                qbb = min(qb, nq - q0)
                sv = self.s_buf[: qbb * tcc].reshape(qbb, tcc)
                cp.matmul(self.Q[q0:q0 + qbb], Bf[c0:c0 + tcc].T, out=sv)
                self.k_sel((qbb,), (256,), (sv, np.int32(tcc), bn_view, self.qn, np.int64(off + c0),
                                            np.int32(self.width), self.tk, self.ti, np.int32(q0)))
                sync_check(cp)


class _Fused:
    """Running top-``fused_width(k)`` by the fused tensor-core kernel ``knn_fused``. The rows are centred on
    the queries' mean c first, so that the products the halves round are those of the rows' spread around c,
    not of a common offset (rows far from the origin would lose their neighbours' differences in the
    rounding): l2 distances do not change when both sides move; for ip, q.b = q.(b - c) + q.c, the last term
    exact in float32 (exact_fused.cu knn_fused)."""

    def __init__(self, gpu: Gpu, Q, qn, m: int, k: int):
        import cupy as cp

        nq, d = Q.shape
        self.m, self.width = m, fused_width(k)
        self.dp = _dims16(d)
        self.center = Q.mean(axis=0, dtype=cp.float64).astype(cp.float32)
        if m == 0:
            Qc = Q - self.center
            self.qn = (Qc * Qc).sum(axis=1, dtype=cp.float32)
        else:
            Qc = Q
            self.qn = Q @ self.center
        self.Qh, self.q_scale = half_rows(Qc, self.dp)
        del Qc
        self.tk = cp.full((nq, self.width), np.inf, dtype=cp.float32)
        self.ti = cp.full((nq, self.width), EMPTY, dtype=cp.int32)
        name = f"knn_fused<{m}, {self.dp // 16}>"
        self.kernel = compile_kernels((name,)).get_function(name)
        self.smem = fused_shared_bytes(self.dp)
        self.kernel.max_dynamic_shared_size_bytes = self.smem

    def add(self, off: int, Bf, bn) -> None:
        """Fold the rows ``Bf`` (global ids from ``off``) into the lists; ``bn``: their squared norms (l2),
        unused here (the centred rows' norms are taken)."""
        import cupy as cp

        rows = Bf.shape[0]
        Bc = Bf - self.center
        Bh, b_scale = half_rows(Bc, self.dp)
        inv = np.float32(1.0 / (self.q_scale * b_scale))
        # l2: the centred norms in product units (exact_fused.cu compares c > thr(row) + bnorm); ip: never read
        bnorm = (Bc * Bc).sum(axis=1, dtype=cp.float32) * (0.5 / inv) if self.m == 0 else self.qn
        del Bc
        nq = self.Qh.shape[0]
        grid = (-(-nq // FUSED_BLOCK_QUERIES),)
        chunk = max(32, FUSED_CHUNK_BYTES // (self.dp * 2) // 32 * 32)
        for c0 in range(0, rows, chunk):
            n = min(chunk, rows - c0)
            self.kernel(grid, (32 * FUSED_WARPS,), (
                self.Qh, np.int32(nq), Bh[c0:], np.int32(n), self.qn, bnorm[c0:] if self.m == 0 else bnorm,
                inv, np.int64(off + c0), np.int32(self.width), self.tk, self.ti), shared_mem=self.smem)
            sync_check(cp)
