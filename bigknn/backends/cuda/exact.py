"""Exact k-NN on the GPU: queries against blocks of rows streamed from the host.

``knn_select`` (exact.cu) keeps a running top-k over cuBLAS dot-product tiles (threshold filter + bitonic
sort of the survivors, pieces of 4096 columns); ``knn_exact_keys`` recomputes the kept keys exactly.
Host blocks go to two device slots on a copy stream, staged through the pinned buffers (transfer.py), so
the copy of block i+1 overlaps the GEMM/select work on block i. Device bytes: memory.py.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from bigknn.backends.cuda.compile import MAX_K, compile_kernels, kernel_metric, sync_check
from bigknn.backends.cuda.gpu import Gpu
from bigknn.backends.cuda.memory import free_pools
from bigknn.graph import EMPTY, KnnGraph, drop_self


def exact_graph(gpu: Gpu, x, k: int, metric: str) -> KnnGraph:
    """Exact k-NN graph of x among itself, self excluded (small sets and checks)."""
    n = x.shape[0]
    try:
        g = exact_knn(gpu, x, min(k + 1, n, MAX_K), metric, [(0, x)])
    finally:
        free_pools()  # as at the end of every call of the backend
    ids, dists = drop_self(g.ids, g.dists, np.arange(n))
    return KnnGraph(np.ascontiguousarray(ids[:, :k]), np.ascontiguousarray(dists[:, :k]))


def exact_knn(gpu: Gpu, queries, k: int, metric: str, blocks: Iterable[tuple[int, np.ndarray]]) -> KnnGraph:
    """Exact top-k of each query over all rows of ``blocks`` ((global offset, vectors), host or device)."""
    import cupy as cp

    m = kernel_metric(metric)
    k = int(k)
    if k < 1 or k > MAX_K:
        raise ValueError(f"CUDA exact_knn supports 1 <= k <= {MAX_K}, got k={k}")
    nq, d = queries.shape
    if nq == 0:
        return KnnGraph(np.empty((0, k), np.int32), np.empty((0, k), np.float32))
    budget = gpu.budget()
    mod = compile_kernels((f"knn_select<{m}>", f"knn_exact_keys<{m}>"))
    k_sel = mod.get_function(f"knn_select<{m}>")
    k_exact = mod.get_function(f"knn_exact_keys<{m}>")
    cs = cp.cuda.Stream(non_blocking=True)
    xs = cp.cuda.Stream(non_blocking=True)
    with cs:
        Q = cp.ascontiguousarray(cp.asarray(queries).astype(cp.float32, copy=False))
        qn = (Q * Q).sum(axis=1, dtype=cp.float32) if m == 0 else cp.zeros((1,), dtype=cp.float32)
        tk = cp.full((nq, k), np.inf, dtype=cp.float32)
        ti = cp.full((nq, k), EMPTY, dtype=cp.int32)
        dummy = cp.zeros((1,), dtype=cp.float32)
    fixed = nq * (4 * d + 8 * k)
    s_buf = None
    tc = qb = 0
    dev_raw = [None, None]
    ev_copy = [None, None]
    ev_done = [None, None]
    nblk = 0
    for off, blk in blocks:
        rows = int(blk.shape[0])
        if rows == 0:
            continue
        if blk.ndim != 2 or blk.shape[1] != d:
            raise ValueError(f"block at offset {off} has shape {blk.shape}, queries have dim {d}")
        bdt = np.dtype(blk.dtype)
        slot = nblk % 2
        nblk += 1
        if s_buf is None:
            blk_bytes = rows * (d * bdt.itemsize + 4 * d + 4)
            avail = budget - fixed - 2 * blk_bytes - (64 << 20)
            tc = min(65536, -(-rows // 4096) * 4096)
            qb = min(nq, max(0, avail) // (4 * tc))
            if qb < min(nq, 2048):
                tc = max(4096, (max(0, avail) // (4 * min(nq, 2048))) // 4096 * 4096)
                tc = min(tc, 65536)
                qb = min(nq, max(0, avail) // (4 * tc))
            if qb < 1:
                raise MemoryError(f"exact_knn: GPU budget {budget / 2**30:.2f} GiB too small for "
                                  f"{nq} queries and blocks of {rows} x {d}")
            with cs:
                s_buf = cp.empty((qb * tc,), dtype=cp.float32)
        if isinstance(blk, cp.ndarray):
            B = cp.ascontiguousarray(blk)
        else:
            blk = np.ascontiguousarray(blk)
            nbytes = blk.nbytes
            if ev_done[slot] is not None:
                xs.wait_event(ev_done[slot])  # device buffer no longer read by block i-2
            if dev_raw[slot] is None or dev_raw[slot].nbytes < nbytes:
                if ev_done[slot] is not None:
                    ev_done[slot].synchronize()  # the old buffer may still be read on cs
                with xs:
                    dev_raw[slot] = cp.empty((nbytes,), dtype=cp.uint8)
            B = dev_raw[slot][:nbytes].view(bdt).reshape(blk.shape)
            # staged through small pinned buffers with threaded host copies; returns when the last
            # chunk is queued, so this copy overlaps the GPU work queued on cs for block i-1
            gpu.transfer.h2d(blk, B, xs)
            ev_copy[slot] = xs.record()
            cs.wait_event(ev_copy[slot])
        with cs:
            Bf = B if B.dtype == cp.float32 else B.astype(cp.float32)
            bn = (Bf * Bf).sum(axis=1, dtype=cp.float32) if m == 0 else dummy
            for c0 in range(0, rows, tc):
                tcc = min(tc, rows - c0)
                bn_view = bn[c0:] if m == 0 else dummy
                for q0 in range(0, nq, qb):
                    qbb = min(qb, nq - q0)
                    sv = s_buf[: qbb * tcc].reshape(qbb, tcc)
                    cp.matmul(Q[q0:q0 + qbb], Bf[c0:c0 + tcc].T, out=sv)
                    k_sel((qbb,), (256,), (sv, np.int32(tcc), bn_view, qn, np.int64(int(off) + c0), np.int32(k),
                                           tk, ti, np.int32(q0)))
                    sync_check(cp)
            nw = nq * k
            k_exact(((nw * 32 + 255) // 256,), (256,), (Q, np.int32(nq), Bf, np.int32(rows), np.int32(d),
                                                       np.int64(int(off)), np.int32(k), ti, tk))
            sync_check(cp)
            ev_done[slot] = cs.record()
            del Bf, bn
    cs.synchronize()
    ids = ti.get()
    keys = tk.get()
    del s_buf, dev_raw, Q, tk, ti
    order = np.lexsort((ids.astype(np.int64) & 0xFFFFFFFF, keys), axis=-1)
    ids = np.take_along_axis(ids, order, axis=1)
    keys = np.take_along_axis(keys, order, axis=1)
    ids = np.where(np.isinf(keys), EMPTY, ids).astype(np.int32)
    return KnnGraph(ids, keys.astype(np.float32))
