"""GNND of one shard on the GPU (GNND paper §4): random start, descent (descent.py), exact keys.

Kernels besides the descent's (gnnd.cu):

* ``gnnd_norms`` / ``gnnd_finalize``  l2 only (``l2_expand``, default on): the cross-match computes
  |a|^2 + |b|^2 - 2 a.b (one FMA per dim); afterwards every kept key is recomputed by direct differences
  and the lists re-sorted, so returned keys are exact. Wide float32 rows descend on half-precision copies
  (rows.half_rows), whose keys gnnd_finalize makes exact the same way.

A set small enough (``EXACT_ROWS``) gets its exact graph instead, as does a descent that cannot reach its
recall target. Timing knobs measured in docs/perf-notes.md: p (GnndParams.samples), iterations, the list
width (GnndParams.list_width: lists of 48 instead of 32 take T1's recall@10 from 0.985 to 0.991).
"""

from __future__ import annotations

import time

import numpy as np

from bigknn.backends.cuda.compile import (MAX_K, MAX_P, compile_kernels, cross_name, ctype_of, dpad_of, dtype_of,
                                          sync_check, uses_mma)
from bigknn.backends.cuda.descent import init_graph, iterate
from bigknn.backends.cuda.exact import exact_graph
from bigknn.backends.cuda.gpu import Gpu
from bigknn.backends.cuda.memory import gnnd_bytes, plan_slots
from bigknn.backends.cuda.rows import cut, descends_on_halves, half_rows, numeric, prepare_rows
from bigknn.backends.cuda.target import device_target
from bigknn.core.hostmem import touched_later
from bigknn.core.knn_graph import EMPTY, KnnGraph
from bigknn.core.metric import Metric
from bigknn.core.params import EXACT_ROWS, GnndParams
from bigknn.algorithms.recall_target import Probe


def gnnd(gpu: Gpu, x, metric: Metric, params: GnndParams, seed: int, on_iter=None,
         probe: Probe | None = None) -> KnnGraph:
    """k-NN graph (lists params.width() wide) of the rows of ``x`` (host or device) among themselves;
    ``probe``: the recall target's rows and truth where the caller has them (Backend.gnnd)."""
    import cupy as cp

    t0 = time.perf_counter()
    m = metric.kernel_id
    n, d = x.shape
    k = int(params.width())
    if k < 1 or k > MAX_K:
        raise ValueError(f"CUDA backend supports 1 <= k <= {MAX_K}, got k={k}")
    if n <= min(MAX_K, k + 1) or (n <= EXACT_ROWS and k < MAX_K):
        # a small set: its exact graph (NN-Descent mixes too little there; every row when n <= k + 1)
        g = exact_graph(gpu, x, min(k, n - 1), metric) if n > 1 else None
        ids = np.full((n, k), EMPTY, np.int32)
        dists = np.full((n, k), np.inf, np.float32)
        if g is not None:
            ids[:, : g.k] = g.ids
            dists[:, : g.k] = g.dists
        return KnnGraph(ids, dists)

    p = max(1, min(params.sample_count(), MAX_P))
    itemsize = dtype_of(x).itemsize
    ct = ctype_of(x)
    half = descends_on_halves(ct, d)  # the descent reads half-precision copies (rows.half_rows)
    half_bytes = n * d * 2 if half else 0
    # rows uploaded ahead (the recall sample's exact search read them there): used, not uploaded again, and
    # held by this call (their bytes are already taken from the free memory the budget counts)
    kept = gpu.resident.take(x, cp.cuda.get_current_stream()) if isinstance(x, np.ndarray) else None
    held = kept.nbytes if kept is not None else 0  # also the stats' rows_kept
    log_c, _ = plan_slots(gpu, lambda slots: gnnd_bytes(n, d, itemsize, k, p, slots) + half_bytes - held, k,
                          f"gnnd of {n} x {d} rows (k={k})")

    kb = k
    sync = cp.cuda.get_current_stream().synchronize
    expand = m == 0 and gpu.use_l2_expand()
    wct = "unsigned short" if half else ct
    names = (f"gnnd_init<{wct}, {m}>", cross_name(wct, m, p, dpad_of(x), expand, False, gpu.use_tensor_cores()),
             f"gnnd_finalize<{ct}, {m}>")
    if expand:
        names += (f"gnnd_norms<{wct}>",)
    mod = compile_kernels(names)  # one NVRTC run
    t_c = time.perf_counter()
    xd, _, d, dpad = prepare_rows(x if kept is None else kept, gpu.transfer)
    del kept
    xw = half_rows(xd)[0] if half else xd
    t_prep = time.perf_counter()
    sync()
    t_h2d = time.perf_counter()
    host_out = (touched_later((n, kb), np.int32), touched_later((n, kb), np.float32))  # faulted in while it descends
    ids, keys, flags = init_graph(xw, wct, d, dpad, m, kb, seed)
    norms = None
    if expand:
        norms = cp.empty((n,), dtype=cp.float32)
        mod.get_function(f"gnnd_norms<{wct}>")(((n * 32 + 255) // 256,), (256,),
                                               (xw, np.int32(n), np.int32(d), np.int32(dpad), norms, np.int32(0),
                                                np.int32(n)))
    sync()
    t_init = time.perf_counter()
    target = device_target(gpu, xd, d, metric, params, seed, lambda w, q: gnnd_bytes(
        n, d, itemsize, w, q, 1 << log_c) + half_bytes <= gpu.budget(), probe=probe)
    stats, ids, keys, flags = iterate(gpu, xw, wct, dpad, m, ids, keys, flags, p, int(params.iters),
                                      float(params.min_update_frac), labels=None, log_c=log_c,
                                      norms=norms, on_iter=on_iter, target=target)
    del xw
    if target is not None and target.stopper.fell_short():  # NN-Descent cannot reach the target here
        del ids, keys, flags, norms
        target.stopper.exact_instead()
        g = exact_graph(gpu, numeric(xd, d), kb, metric)
        gpu.last_stats = dict(stats, p=p, k_built=kb, half=half, exact=True, total_s=time.perf_counter() - t0)
        return KnnGraph(g.ids, g.dists, target.stopper.report())
    ids, keys = cut(ids, kb), cut(keys, kb)
    if expand or half:
        # the lists hold norm-expansion or half-precision keys: make them exact and re-sort
        mod.get_function(f"gnnd_finalize<{ct}, {m}>")(((n + 3) // 4,), (128,), (
            xd, np.int32(n), np.int32(d), np.int32(dpad), np.int32(kb), ids, keys, np.int32(0), np.int32(n)))
        sync_check(cp)
    sync()
    t_it = time.perf_counter()
    out = KnnGraph(gpu.transfer.d2h(ids, host_out[0].result()), gpu.transfer.d2h(keys, host_out[1].result()),
                   target.stopper.report() if target else None)
    t_end = time.perf_counter()
    gpu.last_stats = dict(stats, p=p, slots=1 << log_c, k_built=kb, l2_expand=expand, half=half, rows_kept=held > 0,
                          mma=uses_mma(wct, m, p, expand, gpu.use_tensor_cores()),
                          compile_s=t_c - t0,
                          h2d_s=t_h2d - t_c, rows_prep_s=t_prep - t_c,  # the host's part of h2d_s
                          init_s=t_init - t_h2d, iter_s=t_it - t_init, d2h_s=t_end - t_it, total_s=t_end - t0)
    return out
