"""GGM of two shards on the GPU (GNND paper §5.1, Alg. 3): set-up, cross-shard descent, fold-back.

Kernels (ggm.cu; the descent between them is descent.py's in cross-shard mode):

* ``ggm_setup``    one warp per row: global -> local ids (a: [0, na), b: [na, na + nb)), the first
                   W - W//2 in-pair entries of the old list (stored keys, OLD), W//2 distinct random rows of
                   the other shard (exact keys, NEW), (key, id) sort. Seeded merge: rows of a keep their
                   whole in-pair list and their bound in the empty slots; rows of b are filled with rows of a
                   two hops away through ``vias`` first (bigknn/algorithms/merge_setup.py).
* ``ggm_finish``   one warp per row: the whole old list (global ids, other shards included) plus the
                   refined entries not in it (keys recomputed exactly), sorted, top W, global ids.

A merge's output lists and both shards' vectors stay on the GPU (resident.py), for the next merge of either.
"""

from __future__ import annotations

import time

import numpy as np

from bigknn.core.knn_graph import ShardPart
from bigknn.backends.cuda.compile import (CTYPES, MAX_K, MAX_P, compile_kernels, cross_name,
                                          padded_dim, sync_check, uses_mma)
from bigknn.backends.cuda.descent import iterate
from bigknn.backends.cuda.exact import exact_knn
from bigknn.backends.cuda.gpu import Gpu
from bigknn.backends.cuda.memory import ggm_bytes, plan_slots
from bigknn.backends.cuda.rows import cut, descends_on_halves, half_rows, kernel_rows, numeric
from bigknn.backends.cuda.target import device_target
from bigknn.backends.cuda.transfer import Transfer
from bigknn.algorithms.merge_setup import exact_merge, fill_count, merge_stop_frac
from bigknn.core.hostmem import touched_later
from bigknn.core.knn_graph import EMPTY, KnnGraph
from bigknn.core.metric import Metric
from bigknn.core.params import GnndParams

MAX_VIAS = 8  # shards a seeded merge may draw seeds through (ggm_setup numbers them in a byte; a loop per entry)


def fit_width(g: KnnGraph, w: int) -> KnnGraph:
    """A graph cut or padded (EMPTY / +inf) to w entries per row."""
    if g.k == w:
        return g
    if g.k > w:
        return KnnGraph(np.ascontiguousarray(g.ids[:, :w]), np.ascontiguousarray(g.dists[:, :w]))
    pad = ((0, 0), (0, w - g.k))
    return KnnGraph(np.pad(g.ids, pad, constant_values=EMPTY).astype(np.int32),
                    np.pad(g.dists, pad, constant_values=np.inf).astype(np.float32))


def _pair_dtype(va: np.ndarray, vb: np.ndarray) -> np.dtype:
    """The element type the kernels read a pair in: the shards' own when they share one the kernels know,
    else float32."""
    dt_a, dt_b = np.dtype(va.dtype), np.dtype(vb.dtype)
    return dt_a if (dt_a == dt_b and dt_a in CTYPES) else np.dtype(np.float32)


def _upload_pair(gpu: Gpu, va: np.ndarray, vb: np.ndarray, stats: dict):
    """Vectors of a and b as one device array (na + nb, dpad) in a kernel dtype: (xd, ctype, d, dpad)."""
    import cupy as cp

    dt = _pair_dtype(va, vb)
    na, nb = va.shape[0], vb.shape[0]
    d = va.shape[1]
    dpad = padded_dim(d, dt.itemsize)
    raw = cp.empty((na + nb, d), dtype=dt)
    for v, rows in ((va, raw[:na]), (vb, raw[na:])):
        host = np.asarray(v, dtype=dt)
        gpu.transfer.to_device(host, rows, stats)
        if host is v:  # the vectors never change: keep them for the shard's next merge
            gpu.resident.put(v, rows)
    return kernel_rows(raw, dpad), CTYPES[dt], d, dpad


def _upload_lists(transfer: Transfer, ga: KnnGraph, gb: KnnGraph, wo: int, stats: dict):
    """Old lists of a and b (global ids, keys) as device arrays (na + nb, wo)."""
    import cupy as cp

    na, nb = ga.rows, gb.rows
    ids = cp.empty((na + nb, wo), dtype=cp.int32)
    keys = cp.empty((na + nb, wo), dtype=cp.float32)
    for g, sl in ((ga, slice(0, na)), (gb, slice(na, na + nb))):
        g = fit_width(g, wo)
        transfer.to_device(np.asarray(g.ids, dtype=np.int32), ids[sl], stats)
        transfer.to_device(np.asarray(g.dists, dtype=np.float32), keys[sl], stats)
    return ids, keys


def ggm(gpu: Gpu, a: ShardPart, b: ShardPart, metric: Metric, params: GnndParams, seed: int, on_iter=None,
        vias: list[ShardPart] | None = None) -> tuple[KnnGraph, KnnGraph]:
    """The merged lists of a and b (CudaBackend.ggm states the contract)."""
    import cupy as cp

    t0 = time.perf_counter()
    m = metric.kernel_id
    na, nb = int(a.vectors.shape[0]), int(b.vectors.shape[0])
    if a.graph.rows != na or b.graph.rows != nb:
        raise ValueError(f"ggm: graphs of {a.graph.rows} / {b.graph.rows} rows for shards of {na} / {nb} rows")
    if a.vectors.ndim != 2 or b.vectors.ndim != 2 or a.vectors.shape[1] != b.vectors.shape[1]:
        raise ValueError(f"ggm: vectors of shapes {a.vectors.shape} and {b.vectors.shape}")
    w = int(params.width())
    wo = max(a.graph.k, b.graph.k)
    if not 1 <= w <= MAX_K or wo > MAX_K:
        raise ValueError(f"CUDA ggm supports lists of 1..{MAX_K} entries, got width {w}, stored {wo}")
    if na == 0 or nb == 0:
        return fit_width(a.graph, w), fit_width(b.graph, w)
    n = na + nb
    d = int(a.vectors.shape[1])
    fill = fill_count(w)
    vias = list(vias or [])
    p = max(1, min(params.sample_count(seeded=bool(vias)), MAX_P))
    dt = _pair_dtype(a.vectors, b.vectors)
    itemsize = dt.itemsize
    if len(vias) > MAX_VIAS or len({v.graph.k for v in vias}) > 1:
        raise ValueError(f"CUDA ggm seeds through at most {MAX_VIAS} shards with lists of one width")
    extra_bytes = sum(v.graph.ids.nbytes for v in vias)  # the vias' lists, if they must be uploaded
    ct = CTYPES[dt]
    half = descends_on_halves(ct, d)  # float32 rows: the descent reads halves
    extra_bytes += n * d * 2 if half else 0  # (and the half-precision copy, while it lives)
    log_c, need = plan_slots(gpu, lambda slots: ggm_bytes(n, d, itemsize, w, wo, p, slots) + extra_bytes, w,
                             f"ggm of {na} + {nb} rows x {d} (lists of {w})")

    sync = cp.cuda.get_current_stream().synchronize
    expand = m == 0 and gpu.use_l2_expand()
    wct = "unsigned short" if half else ct
    names = (f"ggm_setup<{wct}, {m}>", f"ggm_finish<{ct}, {m}>",
             cross_name(wct, m, p, padded_dim(d, itemsize), expand, True, gpu.use_tensor_cores()))
    if expand:
        names += (f"gnnd_norms<{wct}>",)
    mod = compile_kernels(names)
    t_c = time.perf_counter()

    moved: dict = {"h2d_bytes": 0, "resident_hits": 0}
    xd, _, d, dpad = _upload_pair(gpu, a.vectors, b.vectors, moved)
    old_ids, old_keys = _upload_lists(gpu.transfer, a.graph, b.graph, wo, moved)
    via_lists = [gpu.transfer.device_array(np.asarray(v.graph.ids, dtype=np.int32), moved) for v in vias]
    via_ptrs = cp.asarray([arr.data.ptr for arr in via_lists] or [0], dtype=cp.uint64)
    via_offs = cp.asarray([v.offset for v in vias] or [0], dtype=cp.int64)
    via_rows = cp.asarray([v.graph.rows for v in vias] or [0], dtype=cp.int32)
    # the set-up and the descent see the half-precision rows and keys in their scale; the fold-back
    # (ggm_finish) recomputes the refined keys from the float32 rows and keeps the old keys as stored
    xw, scale = half_rows(xd) if half else (xd, 1.0)
    key_scale = scale * scale  # the descent's keys are of rows scaled by `scale`
    setup_keys = old_keys * np.float32(key_scale) if half else old_keys
    sync()
    t_h2d = time.perf_counter()

    n32, d32, dp32, na32 = np.int32(n), np.int32(d), np.int32(dpad), np.int32(na)
    a_off, b_off = np.int64(a.offset), np.int64(b.offset)
    grid = ((n + 3) // 4,)
    labels = (cp.arange(n, dtype=cp.int32) >= na).astype(cp.int32)
    ids = cp.empty((n, w), dtype=cp.int32)
    keys = cp.empty((n, w), dtype=cp.float32)
    flags = cp.empty((n, w), dtype=cp.uint8)
    seed64 = np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF)
    mod.get_function(f"ggm_setup<{wct}, {m}>")(grid, (128,), (
        xw, n32, d32, dp32, na32, a_off, b_off, old_ids, setup_keys, np.int32(wo), np.int32(w), np.int32(fill),
        np.int32(bool(vias)), via_ptrs, via_offs, via_rows, np.int32(len(vias)),
        np.int32(vias[0].graph.k if vias else 0), seed64, ids, keys, flags))
    sync_check(cp)
    del via_lists, via_ptrs, via_offs, via_rows, setup_keys
    norms = None
    if expand:
        norms = cp.empty((n,), dtype=cp.float32)
        mod.get_function(f"gnnd_norms<{wct}>")(((n * 32 + 255) // 256,), (256,), (xw, n32, d32, dp32, norms,
                                                                           np.int32(0), n32))
    sync()
    t_setup = time.perf_counter()
    host_out = (touched_later((n, w), np.int32), touched_later((n, w), np.float32))  # faulted in while it merges

    target = None if vias else device_target(gpu, xd, d, metric, params, seed, lambda wd, q: ggm_bytes(
        n, d, itemsize, wd, wo, q, 1 << log_c) + extra_bytes <= gpu.budget(), pair=(a, b))
    stats, ids, keys, flags = iterate(gpu, xw, wct, dpad, m, ids, keys, flags, p, int(params.merge_iters),
                                      merge_stop_frac(params.min_update_frac, na, nb), labels=labels,
                                      log_c=log_c, norms=norms, on_iter=on_iter, target=target)
    del xw
    if target is not None and target.stopper.fell_short():  # NN-Descent cannot reach the target here
        del ids, keys, flags, norms, labels, old_ids, old_keys
        target.stopper.exact_instead()
        rows = numeric(xd, d)
        local = {id(a): rows[:na], id(b): rows[na:]}

        def cross(own, other, k):
            return exact_knn(gpu, local[id(own)], k, metric, [(other.offset, local[id(other)])])

        ga, gb = exact_merge(a, b, w, cross)
        ga.report = gb.report = target.stopper.report()
        gpu.last_stats = dict(stats, **moved, p=p, width=w, half=half, exact=True,
                              total_s=time.perf_counter() - t0)
        return ga, gb
    ids = cut(ids, w)
    sync()
    t_it = time.perf_counter()
    del flags, norms, labels
    out_ids = cp.empty((n, w), dtype=cp.int32)
    out_keys = cp.empty((n, w), dtype=cp.float32)
    mod.get_function(f"ggm_finish<{ct}, {m}>")(grid, (128,), (
        xd, n32, d32, dp32, na32, a_off, b_off, ids, np.int32(w), old_ids, old_keys, np.int32(wo),
        out_ids, out_keys))
    sync_check(cp)
    sync()
    t_fin = time.perf_counter()
    del ids, keys, old_ids, old_keys, xd
    h_ids = gpu.transfer.d2h(out_ids, host_out[0].result())
    h_keys = gpu.transfer.d2h(out_keys, host_out[1].result())
    report = target.stopper.report() if target else None
    ga, gb = KnnGraph(h_ids[:na], h_keys[:na], report), KnnGraph(h_ids[na:], h_keys[na:], report)
    for host, dev in ((ga.ids, out_ids[:na]), (ga.dists, out_keys[:na]), (gb.ids, out_ids[na:]),
                      (gb.dists, out_keys[na:])):
        gpu.resident.put(host, dev)  # the next merge of either shard starts from these
    t_end = time.perf_counter()
    gpu.last_stats = dict(stats, **moved, p=p, slots=1 << log_c, width=w, fill=fill, seeded=len(vias),
                          l2_expand=expand, half=half, mma=uses_mma(wct, m, p, expand, gpu.use_tensor_cores()),
                          compile_s=t_c - t0, h2d_s=t_h2d - t_c, setup_s=t_setup - t_h2d, iter_s=t_it - t_setup,
                          finish_s=t_fin - t_it, d2h_s=t_end - t_fin, total_s=t_end - t0)
    return ga, gb
