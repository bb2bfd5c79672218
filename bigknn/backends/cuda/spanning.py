"""One GNND whose lists span the GPUs of a node (docs/design.md, Backends; what is left: docs/perf-notes.md).

A one-shard build on one GPU leaves the others idle, and two shards on two GPUs need a merge of all pairs: here
every GPU holds every row (its own copy, as the kernels read them, and its norms) and the rows [row0, row0 +
rows) of the lists, sample lists, counts and candidate table, in CUDA managed memory advised to stay on their
GPU and be reachable from the others. Each kernel of the descent runs on every GPU over its rows (descent.py
``iterate`` with parts), with atomics that act across GPUs (common.cuh GNND_SYSTEM_ATOMICS): a reverse sample or
a candidate for a row of the other GPU lands there over NVLink. The recall target measures on the first GPU; a
widening makes wider managed lists, each GPU copying its own rows.
"""

from __future__ import annotations

import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bigknn.backends.cuda.compile import MAX_K, MAX_P, compile_kernels, cross_name, ctype_of, dpad_of
from bigknn.backends.cuda.descent import Part, iterate, resized
from bigknn.backends.cuda.exact import exact_graph
from bigknn.backends.cuda.gpu import Gpu
from bigknn.backends.cuda.memory import LOG_SLOTS, gnnd_bytes
from bigknn.backends.cuda.rows import descends_on_halves, half_rows, numeric, prepare_rows
from bigknn.backends.cuda.target import device_target
from bigknn.core.hostmem import touched_later
from bigknn.core.knn_graph import KnnGraph
from bigknn.core.metric import Metric
from bigknn.core.params import GnndParams
from bigknn.algorithms.recall_target import Probe

PREFERRED_LOCATION = 3  # cudaMemAdviseSetPreferredLocation
ACCESSED_BY = 5  # cudaMemAdviseSetAccessedBy


def row_parts(n: int, devices: list[int]) -> list[tuple[int, int, int]]:
    """(device, first row, rows) for each device: n rows in contiguous parts of near-equal size."""
    cuts = np.linspace(0, n, len(devices) + 1).round().astype(np.int64)
    return [(dev, int(a), int(b - a)) for dev, a, b in zip(devices, cuts[:-1], cuts[1:])]


def managed_maker(parts: list[tuple[int, int, int]], n: int):
    """``alloc(shape, dtype, fill=None)`` for arrays whose first dimension is n rows (or a multiple: the counts'
    4n, the candidate table's n << log_c): managed memory, each part's rows advised to stay on its device and
    mapped on every device; filled part by part on the part's own device (the first touch places the pages)."""
    import cupy as cp

    devices = [dev for dev, _, _ in parts]

    def alloc(shape: tuple, dtype, fill=None):
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        mem = cp.cuda.malloc_managed(max(1, count * dtype.itemsize))
        arr = cp.ndarray(shape, dtype=dtype, memptr=mem)
        flat = arr.reshape(-1)
        per_row = count // n if count >= n else 0  # elements a row (the (1,) update count: none)
        for dev, row0, rows in parts if per_row else []:
            start, size = row0 * per_row * dtype.itemsize, rows * per_row * dtype.itemsize
            cp.cuda.runtime.memAdvise(mem.ptr + start, size, PREFERRED_LOCATION, dev)
            for other in devices:
                cp.cuda.runtime.memAdvise(mem.ptr + start, size, ACCESSED_BY, other)
        if fill is not None:
            for dev, row0, rows in parts if per_row else [(devices[0], 0, 1)]:
                with cp.cuda.Device(dev), warnings.catch_warnings():
                    warnings.simplefilter("ignore", cp._util.PerformanceWarning)  # managed: reached from every GPU
                    flat[row0 * max(per_row, 1):(row0 + rows) * max(per_row, 1)].fill(fill)
            for dev in devices:
                cp.cuda.Device(dev).synchronize()
        return arr

    return alloc


def to_host(arr, width: int, parts: list[tuple[int, int, int]], gpus: list[Gpu], out: np.ndarray) -> np.ndarray:
    """The first ``width`` columns of a managed (n, w) array into the host array ``out`` (its pages faulted in
    already: hostmem.touched_later), each GPU copying its own rows at once through its pinned buffers (a copy of
    managed pages straight to pageable memory crawls)."""
    import cupy as cp

    def one(gpu_part: tuple[Gpu, tuple[int, int, int]]) -> None:
        gpu, (dev, row0, rows) = gpu_part
        with cp.cuda.Device(dev):
            local = cp.array(arr[row0:row0 + rows, :width], copy=True)  # plain memory of this GPU
            gpu.transfer.d2h(local, out[row0:row0 + rows])
            cp.cuda.Device(dev).synchronize()

    with ThreadPoolExecutor(len(parts)) as pool:
        list(pool.map(one, zip(gpus, parts)))
    return out


def spanning_gnnd(gpus: list[Gpu], x: np.ndarray, metric: Metric, params: GnndParams, seed: int, on_iter=None,
                  probe: Probe | None = None) -> KnnGraph:
    """The k-NN graph (lists params.width() wide) of the host rows ``x``, its lists split over ``gpus`` by rows.
    Where the descent falls short of its recall target and the exact graph is affordable (Stopper.fell_short),
    the exact graph, searched on the first GPU (which holds every row), as a one-GPU GNND does."""
    import cupy as cp

    t0 = time.perf_counter()
    n, d = x.shape
    k = int(params.width())
    if not 1 <= k <= MAX_K or n <= k + 1:
        raise ValueError(f"a descent across GPUs needs 1 <= k <= {MAX_K} and more than k + 1 rows (n={n}, k={k})")
    devices = [g.device if g.device is not None else i for i, g in enumerate(gpus)]
    parts = row_parts(n, devices)
    alloc = managed_maker(parts, n)
    m = metric.kernel_id
    p = max(1, min(params.sample_count(), MAX_P))
    ct = ctype_of(x)
    half = descends_on_halves(ct, d)
    wct = "unsigned short" if half else ct
    expand = m == 0 and gpus[0].use_l2_expand()
    log_c = LOG_SLOTS
    names = (f"gnnd_init<{wct}, {m}>", cross_name(wct, m, p, dpad_of(x), expand, False, gpus[0].use_tensor_cores()),
             f"gnnd_finalize<{ct}, {m}>", f"gnnd_norms<{wct}>")
    for dev, _, _ in parts:
        with cp.cuda.Device(dev):
            compile_kernels(names, system_atomics=True)

    def replicate(gpu_part):  # every GPU its own copy of the rows (and norms), uploaded at once
        gpu, (dev, _, _) = gpu_part
        with cp.cuda.Device(dev):
            xd, _, dd, dpad = prepare_rows(x, gpu.transfer)
            xw = half_rows(xd)[0] if half else xd
            norms = None
            if expand:
                norms = cp.empty((n,), dtype=cp.float32)
                compile_kernels(names, system_atomics=True).get_function(f"gnnd_norms<{wct}>")(
                    ((n * 32 + 255) // 256,), (256,), (xw, np.int32(n), np.int32(dd), np.int32(dpad), norms,
                                                       np.int32(0), np.int32(n)))
            return xd, xw, norms, dpad

    with ThreadPoolExecutor(len(parts)) as pool:
        copies = list(pool.map(replicate, zip(gpus, parts)))
    dpad = copies[0][3]
    for dev in devices:
        cp.cuda.Device(dev).synchronize()
    t_rows = time.perf_counter()
    host_out = (touched_later((n, k), np.int32), touched_later((n, k), np.float32))  # faulted in while it descends
    ids = alloc((n, k), np.int32)
    keys = alloc((n, k), np.float32)
    flags = alloc((n, k), np.uint8)
    seed64 = np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF)
    for (dev, row0, rows), (_, xw, _, _) in zip(parts, copies):
        with cp.cuda.Device(dev):
            compile_kernels(names, system_atomics=True).get_function(f"gnnd_init<{wct}, {m}>")(
                ((rows + 3) // 4,), (128,), (xw, np.int32(n), np.int32(d), np.int32(dpad), np.int32(k), seed64,
                                             ids, keys, flags, np.int32(row0), np.int32(rows)))
    for dev in devices:
        cp.cuda.Device(dev).synchronize()
    with cp.cuda.Device(devices[0]):
        itemsize = copies[0][1].dtype.itemsize

        def fits(width: int, samples: int) -> bool:  # each GPU: its rows' lists and scratch beside the rows
            def fits_on(gpu: Gpu, dev: int, rows: int) -> bool:
                with cp.cuda.Device(dev):
                    return gnnd_bytes(rows, d, itemsize, width, samples, 1 << log_c) <= gpu.budget()

            return all(fits_on(gpu, dev, rows) for gpu, (dev, _, rows) in zip(gpus, parts))

        target = device_target(gpus[0], copies[0][0], d, metric, params, seed, fits, probe=probe)
        spans = [Part(dev, row0, rows, xw, norms) for (dev, row0, rows), (_, xw, norms, _) in zip(parts, copies)]
        stats, ids, keys, flags = iterate(
            gpus[0], copies[0][1], wct, dpad, m, ids, keys, flags, p, int(params.iters),
            float(params.min_update_frac), log_c=log_c, on_iter=on_iter, target=target, alloc=alloc,
            parts=spans)
    if target is not None and target.stopper.fell_short():  # NN-Descent cannot reach the target here
        del ids, keys, flags
        target.stopper.exact_instead()
        with cp.cuda.Device(devices[0]):
            g = exact_graph(gpus[0], numeric(copies[0][0], d), k, metric)
        gpus[0].last_stats = dict(stats, p=p, k_built=k, half=half, gpus=len(gpus), exact=True,
                                  total_s=time.perf_counter() - t0)
        return KnnGraph(g.ids, g.dists, target.stopper.report())
    t_it = time.perf_counter()
    ids, keys = resized((ids, keys), k, alloc, spans) if ids.shape[1] != k else (ids, keys)
    if expand or half:  # exact keys, re-sorted: each GPU its own rows' lists, from its float rows
        for (dev, row0, rows), (xd, _, _, _) in zip(parts, copies):
            with cp.cuda.Device(dev):
                compile_kernels(names, system_atomics=True).get_function(f"gnnd_finalize<{ct}, {m}>")(
                    ((rows + 3) // 4,), (128,), (xd, np.int32(n), np.int32(d), np.int32(dpad), np.int32(k), ids,
                                                 keys, np.int32(row0), np.int32(rows)))
        for dev in devices:
            cp.cuda.Device(dev).synchronize()
    out = KnnGraph(to_host(ids, k, parts, gpus, host_out[0].result()), to_host(keys, k, parts, gpus, host_out[1].result()),
                   target.stopper.report() if target else None)
    t_end = time.perf_counter()
    gpus[0].last_stats = dict(stats, p=p, slots=1 << log_c, k_built=k, l2_expand=expand, half=half,
                              gpus=len(gpus), rows_s=t_rows - t0, iter_s=t_it - t_rows, d2h_s=t_end - t_it,
                              total_s=t_end - t0)
    return out
