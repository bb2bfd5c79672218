"""CUDA backend: GNND (paper 000 §4), GGM (§5.1) and exact k-NN on one GPU through CuPy + CUDA C++ kernels.

CuPy is imported inside the methods only, so this module imports on machines without a GPU.

Kernels (kernels.cu, compiled by NVRTC for the running device's arch, one module per element type /
metric / sample-size class / dim-chunk class, cached per process and on disk by CuPy):

* ``gnnd_init``    random k distinct neighbours != self per row, keys, warp bitonic sort, all NEW.
* ``gnnd_sample``  first p NEW and first p OLD per list (list order); sampled NEW become OLD. With labels
                   (GGM): NEW only from entries of the other shard, OLD only from the row's own shard.
* ``gnnd_reverse`` reverse samples appended with atomics while a sample list holds < 2p.
* ``gnnd_cross``   one block per list: dedupe samples, NEW x (NEW u OLD) distances register-tiled in
                   shared memory (dims chunked), selective update (nearest other NEW and nearest OLD for
                   each NEW sample, nearest NEW for each OLD sample) into a per-row candidate table
                   (hash slot per neighbour id, 64-bit atomicMin on (key, id): lock-free). CROSS variant
                   (GGM): NEW x OLD only (NEW and OLD samples lie in different shards).
* ``gnnd_merge``   one warp per row: drop listed / self / not-better candidates, rank-merge with the
                   sorted list, mark inserts NEW, count them, reset the table.
* ``gnnd_norms`` / ``gnnd_finalize``  l2 only (``l2_expand``, default on): the cross-match computes
                   |a|^2 + |b|^2 - 2 a.b (one FMA per dim); afterwards every kept key is recomputed by
                   direct differences and the lists re-sorted, so returned keys are exact.
* ``ggm_setup``    GGM set-up, one warp per row: global -> local ids (a: [0, na), b: [na, na + nb)), the
                   first W - W//2 in-pair entries of the old list (stored keys, OLD), W//2 distinct random
                   rows of the other shard (exact keys, NEW), (key, id) sort. Seeded merge: rows of a keep
                   their whole in-pair list and their bound in the empty slots; rows of b are filled with
                   rows of a two hops away through ``vias`` first (bigknn/ggm.py).
* ``ggm_finish``   GGM fold-back, one warp per row: the whole old list (global ids, other shards included)
                   plus the refined entries not in it (keys recomputed exactly), sorted, top W, global ids.
* ``knn_select``   running top-k over cuBLAS dot-product tiles (threshold filter + bitonic sort of the
                   survivors, pieces of 4096 columns); ``knn_exact_keys`` recomputes the kept keys exactly.

The iteration kernels take an existing graph + NEW flags + optional per-row partition labels
(``_iterate``), so GGM (Alg. 3) can reuse them: pairs with equal labels are never compared. Lists handed
to ``_iterate`` must be sorted by (key, id); with ``norms`` given, run ``gnnd_finalize`` afterwards.

Timing knobs measured in docs/perf-notes.md: p (GnndParams.samples), iterations, the list width
(GnndParams.list_width: lists of 48 instead of 32 take T1's recall@10 from 0.985 to 0.991).

Memory (bytes on the GPU; ``gpu_mem_bytes`` caps the budget, else 92 % of free memory):

* gnnd: ``n * (dpad*s + 9kb + 16p + 20 + 8C) + n*d*s`` (the last term only while padding rows),
  kb = GnndParams.width() list entries built (>= k; the store keeps them all, output cuts to k),
  s = element size, dpad = d rounded up to max(16/s, 8), p = samples (<= 32), C = candidate slots per
  row (128, ``LOG_SLOTS``; halved while the budget is short, down to 16; MemoryError below that). Slot
  collisions drop proposals: with 64 slots the GPU lost 1-2 points of recall against the CPU reference
  (docs/perf-notes.md). Shard sizes (``bigknn plan``, ``--shard-rows 0``) are computed for 64 slots, so the
  largest shards run with 64 rather than being made smaller.
* ggm (n = na + nb rows): gnnd's bytes with k = W, plus ``n * (8*wo + 8*W + 4)`` (old lists wo wide kept
  for the fold-back, output lists, labels). 2 x 1M x 96 f32, W = 32: about 3.7 GB.
* exact_knn: ``nq*(4d + 8k) + 2 * rows*(d*s + 4d + 4) + qb*tc*4`` for query batch qb and column tile tc
  (tc <= 65536, both picked from what is left of the budget). Host blocks go to two device slots on a
  copy stream, staged through three pinned 32 MiB buffers filled by 8 threads, so the copy of block i+1
  overlaps the GEMM/select work on block i.
* host: the pinned staging buffers (2 x 96 MiB: calls, and uploads ahead) live as long as the backend
  object; allocating them costs ~0.3 s on the first large transfer.
* kept between calls (``resident.py``): a merge's output lists and both shards' vectors, and what ``stage``
  uploaded ahead for the next pair. They count against ``gpu_mem_bytes``, and a call drops the least
  recently used of them until its own working set fits.

Every call frees CuPy's memory pools at its end.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

import numpy as np

from bigknn.backends.base import ShardPart
from bigknn.backends.cuda.resident import ResidentCopies
from bigknn.backends.cuda.target import MAX_P, DeviceTarget
from bigknn.ggm import merge_stop_frac
from bigknn.graph import EMPTY, KnnGraph, drop_self
from bigknn.params import EXACT_ROWS, GnndParams
from bigknn.recall import Stopper, make_merge_probe, make_probe

# one source, no includes: NVRTC needs no include path and CuPy's cache key (the text) sees every line
_KERNEL_FILES = tuple(Path(__file__).with_name(f) for f in ("common.cuh", "gnnd.cu", "cross.cu", "ggm.cu", "exact.cu"))
_CTYPES = {
    np.dtype(np.float32): "float",
    np.dtype(np.float16): "unsigned short",
    np.dtype(np.uint8): "unsigned char",
    np.dtype(np.int8): "signed char",
}
_MODULES: dict = {}
MAX_K = 128
HALF_MIN_DIM = 128  # float32 rows at least this wide descend on half-precision copies (_half_rows)
HALF_RANGE = 2.0 ** 14  # largest magnitude after scaling (half's largest finite value is 65504)
LOG_SLOTS = 7  # candidate slots per row (kernels.cu MAX_SLOTS): 128; halved while the budget is short
MAX_VIAS = 8  # shards a seeded merge may draw seeds through (ggm_setup numbers them in a byte; a loop per entry)


def _cupy():
    import cupy

    return cupy


def _check() -> bool:
    return os.environ.get("BIGKNN_CUDA_CHECK", "") not in ("", "0")


def _compile(name_expressions: tuple[str, ...]):
    """RawModule holding the extern "C" kernels plus the named template instances (cached)."""
    # BIGKNN_CUDA_GUNR: loads in flight per thread in the cross-match gather (experiments; 0 = default)
    # BIGKNN_CUDA_MODE: diagnostics (1: cross-match emits nothing, 2: nor computes distances); never in use
    defines = tuple(f"-DGNND_GUNR={int(v)}" for v in [os.environ.get("BIGKNN_CUDA_GUNR", "")] if v)
    defines += tuple(f"-DGNND_MODE={int(v)}" for v in [os.environ.get("BIGKNN_CUDA_MODE", "")] if v)
    cp = _cupy()
    device = cp.cuda.Device().id  # a loaded module belongs to one device's context (several GPUs: one each)
    mod = _MODULES.get((name_expressions, defines, device))
    if mod is not None:
        return mod
    for (names, defs, dev), mod in _MODULES.items():  # a module compiled for a superset serves too
        if dev == device and defs == defines and set(name_expressions) <= set(names):
            return mod
    src = "".join(f.read_text() for f in _KERNEL_FILES)
    cc = cp.cuda.Device().compute_capability
    errors = []
    for opts in (("-std=c++17", f"-arch=sm_{cc}") + defines, ("-std=c++17",) + defines):
        try:
            mod = cp.RawModule(code=src, options=opts, name_expressions=list(name_expressions))
            mod.compile()
            break
        except Exception as e:  # some CuPy versions add their own -arch and reject a second one
            errors.append(e)
            mod = None
    if mod is None:
        raise errors[-1]
    _MODULES[(name_expressions, defines, device)] = mod
    return mod


def _next_pow2(v: int) -> int:
    return 1 << max(0, (int(v) - 1).bit_length())


def _kernel_metric(metric: str) -> int:
    if metric == "l2":
        return 0
    if metric == "ip":
        return 1
    raise ValueError(f"CUDA backend computes metric 'l2' or 'ip', got {metric!r} (cosine arrives as ip)")


def _dtype_of(x) -> np.dtype:
    dt = np.dtype(x.dtype)
    return dt if dt in _CTYPES else np.dtype(np.float32)


def ctype_of(x) -> str:
    return _CTYPES[_dtype_of(x)]


def dpad_of(x) -> int:
    item = _dtype_of(x).itemsize
    align = max(16 // item, 8)
    return -(-x.shape[1] // align) * align


def _report_failure(future) -> None:
    """An upload ahead that failed only costs the next merge its own upload; say so on stderr."""
    if future.exception() is not None:
        print(f"bigknn: note: uploading the next shards ahead failed: {future.exception()!r}", file=sys.stderr)


def _sync_check(cp):
    if _check():
        cp.cuda.get_current_stream().synchronize()


class CudaBackend:
    """GNND and exact k-NN on one GPU. ``gpu_mem_bytes`` caps the device memory a call plans to use."""

    name = "cuda"

    def __init__(self, gpu_mem_bytes: int | None = None, device: int | None = None, profile: bool = False,
                 l2_expand: bool | None = None, tensor_cores: bool | None = None):
        self.gpu_mem_bytes = gpu_mem_bytes
        self.device = device
        self.profile = profile  # time each kernel with events (last_stats["kernel_ms"])
        # l2 cross-match distances by |a|^2 + |b|^2 - 2 a.b (exact keys restored at the end); None: env
        # BIGKNN_CUDA_EXPAND, default on
        self.l2_expand = l2_expand
        # half-precision cross-match tiles on tensor cores; None: env BIGKNN_CUDA_MMA, default on
        self.tensor_cores = tensor_cores
        self.last_stats: dict = {}
        self._staging: list | None = None
        self._staging_ahead: list | None = None  # pinned buffers of the upload-ahead thread
        self._pool = None
        self._setup_lock = threading.Lock()
        self._resident = ResidentCopies()  # device copies kept between calls (resident.py)
        self._ahead: ThreadPoolExecutor | None = None  # uploads the next pair's shards (stage)
        self._copy_stream = None
        self._last_need = 0  # device bytes of the last merge: what uploads ahead must leave free
        # the CUDA context (~0.6 s on an H200) is made while the caller still reads and checks its input
        threading.Thread(target=self._make_context, daemon=True, name="cuda-context").start()

    def _make_context(self) -> None:
        try:
            with self._device():
                _cupy().empty(1)
        except Exception:  # noqa: BLE001 - the first real call meets the same error and reports it
            pass

    # ------------------------------------------------------------------ memory
    def _budget(self) -> int:
        cp = _cupy()
        pool = cp.get_default_memory_pool()
        free, _total = cp.cuda.runtime.memGetInfo()
        budget = int((free + pool.free_bytes()) * 0.92)
        if self.gpu_mem_bytes is not None:  # copies kept between calls count against the cap too
            budget = min(budget, int(self.gpu_mem_bytes) - self._resident.nbytes())
        return budget

    def _device(self):
        """This backend's GPU as a context (the current one when no device was given)."""
        cp = _cupy()
        return cp.cuda.Device(self.device) if self.device is not None else cp.cuda.Device()

    def memory_budget(self) -> int:
        """Bytes of this backend's GPU that one call may plan to use (what shard sizes are chosen from)."""
        with self._device():
            return self._budget()

    @staticmethod
    def gnnd_bytes(n: int, d: int, itemsize: int, k: int, p: int, slots: int = 64) -> int:
        """Device bytes gnnd needs (see the module docstring)."""
        ve = 16 // itemsize
        dpad = -(-d // max(ve, 8)) * max(ve, 8)
        p = min(p, MAX_P)
        pad_copy = n * d * itemsize if dpad != d else 0
        return n * (dpad * itemsize + 9 * k + 16 * p + 20 + 8 * slots) + pad_copy + (1 << 20)

    @staticmethod
    def _free_pools():
        cp = _cupy()
        cp.get_default_memory_pool().free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()

    def _tensor_cores(self) -> bool:
        if self.tensor_cores is not None:
            return bool(self.tensor_cores)
        return os.environ.get("BIGKNN_CUDA_MMA", "1") not in ("0", "")

    def _l2_expand(self) -> bool:
        if self.l2_expand is not None:
            return bool(self.l2_expand)
        return os.environ.get("BIGKNN_CUDA_EXPAND", "1") not in ("0", "")

    # ------------------------------------------------------------------ host <-> device
    _CHUNK = 32 << 20
    _NSTAGE = 3
    _THREADS = 8

    def _stage(self, ahead: bool = False):
        """Pinned staging buffers (kept for the backend's lifetime; one set for the calls, one for the
        upload-ahead thread) and a copy thread pool."""
        import cupyx

        with self._setup_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._THREADS)
            attr = "_staging_ahead" if ahead else "_staging"
            if getattr(self, attr) is None:
                setattr(self, attr, [[cupyx.empty_pinned((self._CHUNK,), dtype=np.uint8), None]
                                     for _ in range(self._NSTAGE)])
            return getattr(self, attr)

    def _pcopy(self, dst: np.ndarray, src: np.ndarray):
        """dst[:] = src for flat uint8 arrays, split over threads (NumPy drops the GIL while copying)."""
        n = src.nbytes
        if n < (4 << 20):
            np.copyto(dst, src)
            return
        step = -(-n // self._THREADS)
        futs = [self._pool.submit(np.copyto, dst[a:a + step], src[a:a + step]) for a in range(0, n, step)]
        for f in futs:
            f.result()

    def _h2d(self, src: np.ndarray, dst, stream=None, ahead: bool = False):
        """Copy a contiguous host array into a device array of the same size, queued on ``stream``."""
        cp = _cupy()
        src = np.ascontiguousarray(src)
        nbytes = src.nbytes
        if nbytes < (16 << 20):
            dst.set(src, stream=stream)
            return
        stream = stream if stream is not None else cp.cuda.get_current_stream()
        s8 = src.reshape(-1).view(np.uint8)
        d8 = dst.reshape(-1).view(cp.uint8)
        bufs = self._stage(ahead)
        for i, a in enumerate(range(0, nbytes, self._CHUNK)):
            buf = bufs[i % len(bufs)]
            if buf[1] is not None:
                buf[1].synchronize()
            b = min(a + self._CHUNK, nbytes)
            self._pcopy(buf[0][: b - a], s8[a:b])
            d8[a:b].set(buf[0][: b - a], stream=stream)
            buf[1] = stream.record()

    def _d2h(self, src) -> np.ndarray:
        """Device array -> new host array, staged through the pinned buffers."""
        cp = _cupy()
        src = cp.ascontiguousarray(src)
        out = np.empty(src.shape, dtype=src.dtype)
        nbytes = out.nbytes
        if nbytes < (16 << 20):
            return src.get()
        stream = cp.cuda.get_current_stream()
        s8 = src.reshape(-1).view(cp.uint8)
        o8 = out.reshape(-1).view(np.uint8)
        bufs = self._stage()
        chunks = list(range(0, nbytes, self._CHUNK))
        pending = []  # (buffer, a, b) queued, not yet copied out
        for i, a in enumerate(chunks):
            buf = bufs[i % len(bufs)]
            if len(pending) == len(bufs):
                pb, pa, pe = pending.pop(0)
                pb[1].synchronize()
                self._pcopy(o8[pa:pe], pb[0][: pe - pa])
            b = min(a + self._CHUNK, nbytes)
            s8[a:b].get(stream=stream, out=buf[0][: b - a], blocking=False)
            buf[1] = stream.record()
            pending.append((buf, a, b))
        for pb, pa, pe in pending:
            pb[1].synchronize()
            self._pcopy(o8[pa:pe], pb[0][: pe - pa])
        return out

    def _to_device(self, host: np.ndarray, dst, stats: dict) -> None:
        """dst[:] = host: from the device copy kept between calls if there is one, else uploaded."""
        cp = _cupy()
        dev = self._resident.get(host, cp.cuda.get_current_stream())
        if dev is not None:
            dst[...] = dev.reshape(dst.shape)
            stats["resident_hits"] = stats.get("resident_hits", 0) + 1
        else:
            self._h2d(host, dst)
            stats["h2d_bytes"] = stats.get("h2d_bytes", 0) + host.nbytes

    def _device_array(self, host: np.ndarray, stats: dict):
        """``host`` on the device, C-contiguous: the copy kept between calls if there is one (used as it is,
        not copied), else uploaded."""
        cp = _cupy()
        dev = self._resident.get(host, cp.cuda.get_current_stream())
        if dev is not None:
            stats["resident_hits"] = stats.get("resident_hits", 0) + 1
            return cp.ascontiguousarray(dev)
        dev = cp.empty(host.shape, dtype=host.dtype)
        self._h2d(host, dev)
        stats["h2d_bytes"] = stats.get("h2d_bytes", 0) + host.nbytes
        return dev

    def stage(self, arrays: Iterable[np.ndarray]) -> None:
        """Start copying host arrays (the next pair's shards) to this GPU on a stream of their own while the
        current call computes, so the next merge finds them there. Returns at once; arrays already on the
        GPU are skipped, and copies stop where they would leave less free memory than the last merge used."""
        todo = [a for a in arrays if isinstance(a, np.ndarray) and a.flags.c_contiguous and not self._resident.has(a)]
        if not todo:
            return
        with self._setup_lock:
            if self._ahead is None:
                self._ahead = ThreadPoolExecutor(1, thread_name_prefix="h2d-ahead")
        self._ahead.submit(self._upload_ahead, todo).add_done_callback(_report_failure)

    def _upload_ahead(self, arrays: list[np.ndarray]) -> None:
        cp = _cupy()
        with self._device():
            if self._copy_stream is None:
                self._copy_stream = cp.cuda.Stream(non_blocking=True)
            for a in arrays:
                if self._resident.has(a):
                    continue
                if self._budget() - a.nbytes < self._last_need + (256 << 20):
                    return
                dev = cp.empty(a.shape, dtype=a.dtype)
                self._h2d(a, dev, self._copy_stream, ahead=True)
                self._resident.put(a, dev, self._copy_stream.record())

    # ------------------------------------------------------------------ GNND
    def gnnd(self, x: np.ndarray, metric: str, params: GnndParams, seed: int) -> KnnGraph:
        with self._device():
            try:
                return self._gnnd(x, metric, params, seed)
            finally:
                self._free_pools()

    def _prepare_rows(self, x):
        """(host or device array) -> (device array (n, dpad) in a kernel dtype, ctype name, d, dpad)."""
        cp = _cupy()
        dt = np.dtype(x.dtype)
        if dt not in _CTYPES:
            x = x.astype(np.float32)
            dt = np.dtype(np.float32)
        n, d = x.shape
        item = dt.itemsize
        align = max(16 // item, 8)
        dpad = -(-d // align) * align
        if isinstance(x, cp.ndarray):
            xd = cp.ascontiguousarray(x)
        else:
            xd = cp.empty(x.shape, dtype=dt)
            self._h2d(x, xd)
        if dt == np.float16:
            xd = xd.view(cp.uint16)
        if dpad != d:
            xp = cp.zeros((n, dpad), dtype=xd.dtype)
            xp[:, :d] = xd
            xd = xp
        return xd, _CTYPES[dt], d, dpad

    def _gnnd(self, x, metric, params: GnndParams, seed: int) -> KnnGraph:
        cp = _cupy()
        t0 = time.perf_counter()
        m = _kernel_metric(metric)
        n, d = x.shape
        k = int(params.width())
        if k < 1 or k > MAX_K:
            raise ValueError(f"CUDA backend supports 1 <= k <= {MAX_K}, got k={k}")
        if n <= min(MAX_K, k + 1) or (n <= EXACT_ROWS and k < MAX_K):
            # a small set: its exact graph (NN-Descent mixes too little there; every row when n <= k + 1)
            g = self._exact_graph(x, min(k, n - 1), metric) if n > 1 else None
            ids = np.full((n, k), EMPTY, np.int32)
            dists = np.full((n, k), np.inf, np.float32)
            if g is not None:
                ids[:, : g.k] = g.ids
                dists[:, : g.k] = g.dists
            return KnnGraph(ids, dists)

        p = max(1, min(params.sample_count(), MAX_P))
        itemsize = np.dtype(x.dtype).itemsize if np.dtype(x.dtype) in _CTYPES else 4
        ct = ctype_of(x)
        half = ct == "float" and d >= HALF_MIN_DIM  # the descent reads half-precision copies (see _half_rows)
        half_bytes = n * d * 2 if half else 0
        budget = self._budget()
        while (self.gnnd_bytes(n, d, itemsize, k, p, 1 << LOG_SLOTS) + half_bytes > budget
               and self._resident.drop_oldest()):
            budget = self._budget()  # copies kept from earlier merges make room first
        log_c = LOG_SLOTS if k >= 16 else 5
        while log_c > 4 and self.gnnd_bytes(n, d, itemsize, k, p, 1 << log_c) + half_bytes > budget:
            log_c -= 1
        need = self.gnnd_bytes(n, d, itemsize, k, p, 1 << log_c) + half_bytes
        if need > budget:
            raise MemoryError(f"gnnd of {n} x {d} rows (k={k}) needs {need / 2**30:.2f} GiB of GPU memory, "
                              f"budget {budget / 2**30:.2f} GiB: use smaller shards")

        kb = k
        sync = cp.cuda.get_current_stream().synchronize
        expand = m == 0 and self._l2_expand()
        wct = "unsigned short" if half else ct
        names = (f"gnnd_init<{wct}, {m}>", self._cross_name(wct, m, p, dpad_of(x), expand),
                 f"gnnd_finalize<{ct}, {m}>")
        if expand:
            names += (f"gnnd_norms<{wct}>",)
        mod = _compile(names)  # one NVRTC run
        t_c = time.perf_counter()
        xd, ctype, d, dpad = self._prepare_rows(x)
        xw, key_scale = self._half_rows(xd) if half else (xd, 1.0)
        sync()
        t_h2d = time.perf_counter()
        ids, keys, flags = self._init_graph(xw, wct, d, dpad, m, kb, seed)
        norms = None
        if expand:
            norms = cp.empty((n,), dtype=cp.float32)
            mod.get_function(f"gnnd_norms<{wct}>")(((n * 32 + 255) // 256,), (256,),
                                                   (xw, np.int32(n), np.int32(d), np.int32(dpad), norms))
        sync()
        t_init = time.perf_counter()
        target = self._target(xd, d, metric, params, seed, lambda w, q: self.gnnd_bytes(
            n, d, itemsize, w, q, 1 << log_c) + half_bytes <= self._budget(), key_scale)
        stats, ids, keys, flags = self._iterate(xw, wct, dpad, m, ids, keys, flags, p, int(params.iters),
                                                float(params.min_update_frac), labels=None, log_c=log_c,
                                                norms=norms, target=target)
        del xw
        if target is not None and target.stopper.fell_short():  # NN-Descent cannot reach the target here
            del ids, keys, flags, norms
            target.stopper.exact_instead()
            g = self._exact_graph(self._numeric(xd, d), kb, metric)
            self.last_stats = dict(stats, p=p, k_built=kb, half=half, exact=True, total_s=time.perf_counter() - t0)
            return KnnGraph(g.ids, g.dists, target.stopper.report())
        ids, keys = self._cut(ids, kb), self._cut(keys, kb)
        if expand or half:
            # the lists hold norm-expansion or half-precision keys: make them exact and re-sort
            mod.get_function(f"gnnd_finalize<{ct}, {m}>")(((n + 3) // 4,), (128,), (
                xd, np.int32(n), np.int32(d), np.int32(dpad), np.int32(kb), ids, keys))
            _sync_check(cp)
        sync()
        t_it = time.perf_counter()
        out = KnnGraph(self._d2h(ids), self._d2h(keys), target.stopper.report() if target else None)
        t_end = time.perf_counter()
        self.last_stats = dict(stats, p=p, slots=1 << log_c, k_built=kb, l2_expand=expand, half=half,
                               mma=self._mma(wct, m, p, expand),
                               compile_s=t_c - t0,
                               h2d_s=t_h2d - t_c,
                               init_s=t_init - t_h2d, iter_s=t_it - t_init, d2h_s=t_end - t_it, total_s=t_end - t0)
        return out

    @staticmethod
    def _cross_shape(p: int) -> tuple[int, int, int]:
        maxn = max(8, _next_pow2(2 * p))
        tr, tc = (4, 4) if maxn >= 32 else (2, 2)
        return maxn, tr, tc

    def _cross_name(self, ctype: str, m: int, p: int, dpad: int, expand: bool = False, cross: bool = False) -> str:
        maxn, tr, tc = self._cross_shape(p)
        dc_lim = 128 if maxn <= 32 else 64  # keeps the static shared memory under 48 KB
        dc = dpad if dpad <= dc_lim else dc_lim
        e = 1 if (expand and m == 0) else 0
        mma = int(self._mma(ctype, m, p, expand))
        return f"gnnd_cross<{ctype}, {m}, {e}, {maxn}, {tr}, {tc}, {dc}, {1 if cross else 0}, {mma}>"

    def _mma(self, ctype: str, m: int, p: int, expand: bool) -> bool:
        """Whether the cross-match tiles run on tensor cores (kernels.cu, MMA): half rows, a dot-product key
        (ip, or l2 by the norm expansion) and at least 16 samples a side."""
        dot = m == 1 or (m == 0 and expand)
        return ctype == "unsigned short" and self._cross_shape(p)[0] >= 16 and dot and self._tensor_cores()

    def _init_graph(self, xd, ctype: str, d: int, dpad: int, m: int, k: int, seed: int):
        """Random initial graph on the device: (ids, keys, flags), k distinct ids != self per row, all NEW."""
        cp = _cupy()
        n = xd.shape[0]
        if n - 1 < k:
            raise ValueError(f"random init needs n - 1 >= k (n={n}, k={k})")
        ids = cp.empty((n, k), dtype=cp.int32)
        keys = cp.empty((n, k), dtype=cp.float32)
        flags = cp.empty((n, k), dtype=cp.uint8)
        name = f"gnnd_init<{ctype}, {m}>"
        init = _compile((name,)).get_function(name)
        seed64 = np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF)
        init(((n + 3) // 4,), (128,), (xd, np.int32(n), np.int32(d), np.int32(dpad), np.int32(k), seed64,
                                      ids, keys, flags))
        _sync_check(cp)
        return ids, keys, flags

    def _iterate(self, xd, ctype: str, dpad: int, m: int, ids, keys, flags, p: int, iters: int,
                 min_update_frac: float, labels=None, log_c: int = 6, norms=None, on_iter=None,
                 target: "DeviceTarget | None" = None):
        """GNND iterations on a device graph (ids/keys sorted by (key, id) per row, flags 1 = NEW).

        ``labels`` (n,) int32 on the device, optional, two classes (GGM's shards a and b): cross-shard mode.
        NEW samples are taken only from entries of the other label, OLD samples only from entries of the
        row's own label, so every NEW x OLD pair is cross-shard; NEW x NEW is not computed and pairs with
        equal labels are never compared.
        ``norms`` (n,) float32 squared row norms, optional (l2 only): distances by the norm expansion; the
        keys left in the lists are then approximate, and gnnd_finalize must make them exact.
        ``target``: stop by the probe's recall estimate (bigknn/recall.py) instead of the update fraction,
        widening the lists where it stalls (new, wider arrays replace ids/keys/flags; the caller cuts them).
        Returns (stats with per-iteration update counts, ids, keys, flags).
        """
        cp = _cupy()
        n, k = ids.shape
        s2 = 2 * p
        expand = norms is not None and m == 0
        cross_name = self._cross_name(ctype, m, p, dpad, expand, cross=labels is not None)
        maxn, tr, tc = self._cross_shape(p)
        nt = (maxn // tr) * (2 * maxn // tc)
        mod = _compile((cross_name,))
        k_sample = mod.get_function("gnnd_sample")
        k_reverse = mod.get_function("gnnd_reverse")
        k_cross = mod.get_function(cross_name)
        k_merge = mod.get_function("gnnd_merge")

        new_s = cp.empty((n, s2), dtype=cp.int32)
        old_s = cp.empty((n, s2), dtype=cp.int32)
        cnt = cp.empty((4 * n,), dtype=cp.int32)
        cand = cp.full((n << log_c,), np.uint64(0xFFFFFFFFFFFFFFFF), dtype=cp.uint64)
        upd = cp.zeros((1,), dtype=cp.uint64)
        nrm = norms if expand else cp.zeros((1,), dtype=cp.float32)
        if labels is None:
            lab, use_lab = cp.zeros((1,), dtype=cp.int32), 0
        else:
            lab, use_lab = cp.ascontiguousarray(labels, dtype=cp.int32), 1
        n32, k32, p32 = np.int32(n), np.int32(k), np.int32(p)
        warps_grid = ((n + 3) // 4,)
        threshold = min_update_frac * n * k
        counts = []
        marks = []

        def mark(name):
            if self.profile:
                ev = cp.cuda.Event()
                ev.record()
                marks.append((name, ev))

        for _ in range(iters):
            upd.fill(0)
            mark("start")
            k_sample(warps_grid, (128,), (n32, k32, p32, ids, flags, new_s, old_s, cnt, lab, np.int32(use_lab)))
            _sync_check(cp)
            mark("sample")
            k_reverse(((n * p + 255) // 256,), (256,), (n32, p32, new_s, old_s, cnt))
            _sync_check(cp)
            mark("reverse")
            k_cross((n,), (nt,), (xd, n32, np.int32(dpad), k32, p32, new_s, old_s, cnt, keys, lab,
                                  np.int32(use_lab), cand, np.int32(log_c), nrm))
            _sync_check(cp)
            mark("cross")
            k_merge(warps_grid, (128,), (n32, k32, ids, keys, flags, cand, np.int32(log_c), upd))
            mark("merge")
            u = int(upd.get()[0])
            counts.append(u)
            if on_iter is not None:
                on_iter(u)
            if target is None:
                if u < threshold:
                    break
                continue
            action = target.after_iteration(ids, keys)
            if action == "stop":
                break
            if action == "widen":
                ids, keys, flags = target.widen(ids, keys, flags)
                k32 = np.int32(ids.shape[1])
                if target.p != p:
                    p, p32, s2 = target.p, np.int32(target.p), 2 * target.p
                    cross_name = self._cross_name(ctype, m, p, dpad, expand, cross=labels is not None)
                    maxn, tr, tc = self._cross_shape(p)
                    nt = (maxn // tr) * (2 * maxn // tc)
                    k_cross = _compile((cross_name,)).get_function(cross_name)
                    new_s = cp.empty((n, s2), dtype=cp.int32)
                    old_s = cp.empty((n, s2), dtype=cp.int32)
        out = {"iters_run": len(counts), "updates": counts}
        if target is not None:
            out["recall_target"] = target.stopper.report()
        if self.profile:
            ms: dict = {}
            cross_iter = []
            for (_, e0), (name, e1) in zip(marks[:-1], marks[1:]):
                if name != "start":
                    t = cp.cuda.get_elapsed_time(e0, e1)
                    ms[name] = ms.get(name, 0.0) + t
                    if name == "cross":
                        cross_iter.append(round(t, 2))
            out["kernel_ms"] = {key: round(v, 2) for key, v in ms.items()}
            out["cross_ms_per_iter"] = cross_iter
        return out, ids, keys, flags

    @staticmethod
    def _cut(arr, width: int):
        """The first ``width`` columns of a device list array (after a widened descent)."""
        return arr if arr.shape[1] == width else _cupy().ascontiguousarray(arr[:, :width])

    @staticmethod
    def _numeric(xd, d: int):
        """Device rows as prepared for the kernels (padded, halves viewed as uint16) back as (n, d) numbers."""
        cp = _cupy()
        return xd.view(cp.float16)[:, :d] if xd.dtype == cp.uint16 else xd[:, :d]

    @staticmethod
    def _half_rows(xd):
        """A half-precision copy of float32 rows, scaled by a power of two into half's range: (copy viewed as
        uint16, factor of its keys). Wide rows make the cross-match a gather of random rows (1M x 64 samples
        x 384 floats is 98 GB an iteration); halves move half of it. Ranks change only between near-equal
        keys, and every kept key is recomputed from the float32 rows at the end (gnnd_finalize)."""
        cp = _cupy()
        amax = float(cp.abs(xd).max())
        scale = 2.0 ** math.floor(math.log2(HALF_RANGE / amax)) if amax > 0 else 1.0
        out = cp.empty(xd.shape, dtype=cp.float16)
        step = max(1, (64 << 20) // (4 * xd.shape[1]))
        for i in range(0, xd.shape[0], step):
            out[i:i + step] = xd[i:i + step] * np.float32(scale)
        return out.view(cp.uint16), scale * scale

    def _target(self, xd, d: int, metric: str, params: GnndParams, seed: int, fits, key_scale: float = 1.0,
                pair: tuple[ShardPart, ShardPart] | None = None) -> "DeviceTarget | None":
        """The recall target of a descent over the device rows ``xd`` (local ids; None without a target):
        a probe of its rows with their exact neighbours among ``xd``, or for the merge of ``pair`` (xd = [a | b])
        among their old lists and the other shard (bigknn/recall.py). ``fits(width, p)``: whether lists of
        that width still fit the memory budget."""
        if params.recall <= 0:
            return None
        cp = _cupy()
        rows_all = self._numeric(xd, d)
        rng = np.random.default_rng((seed, 1))
        if pair is None:
            def exact(rows, k):
                g = self._exact_knn(rows_all[cp.asarray(rows)], k, metric, [(0, rows_all)])
                return g.ids, g.dists

            probe = make_probe(xd.shape[0], params.width(), exact, rng)
        else:
            a, b = pair
            na = len(a.vectors)

            def exact(rows, k, other_is_b):
                block = (b.offset, rows_all[na:]) if other_is_b else (a.offset, rows_all[:na])
                g = self._exact_knn(rows_all[cp.asarray(rows)], k, metric, [block])
                return g.ids, g.dists

            probe = make_merge_probe(a, b, params.width(), exact, rng)
        return DeviceTarget(probe, Stopper(params.recall, params.width()), params, fits, key_scale)

    # ------------------------------------------------------------------ exact k-NN
    def _exact_graph(self, x, k: int, metric: str) -> KnnGraph:
        """Exact k-NN graph of x among itself, self excluded (small sets and checks)."""
        n = x.shape[0]
        g = self.exact_knn(x, min(k + 1, n, MAX_K), metric, [(0, x)])
        ids, dists = drop_self(g.ids, g.dists, np.arange(n))
        return KnnGraph(np.ascontiguousarray(ids[:, :k]), np.ascontiguousarray(dists[:, :k]))

    def exact_knn(self, queries: np.ndarray, k: int, metric: str, blocks: Iterable[tuple[int, np.ndarray]]) -> KnnGraph:
        with self._device():
            try:
                return self._exact_knn(queries, k, metric, blocks)
            finally:
                self._free_pools()

    def _exact_knn(self, queries, k: int, metric: str, blocks) -> KnnGraph:
        cp = _cupy()
        m = _kernel_metric(metric)
        k = int(k)
        if k < 1 or k > MAX_K:
            raise ValueError(f"CUDA exact_knn supports 1 <= k <= {MAX_K}, got k={k}")
        nq, d = queries.shape
        if nq == 0:
            return KnnGraph(np.empty((0, k), np.int32), np.empty((0, k), np.float32))
        budget = self._budget()
        mod = _compile((f"knn_select<{m}>", f"knn_exact_keys<{m}>"))
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
                self._h2d(blk, B, xs)
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
                        _sync_check(cp)
                nw = nq * k
                k_exact(((nw * 32 + 255) // 256,), (256,), (Q, np.int32(nq), Bf, np.int32(rows), np.int32(d),
                                                           np.int64(int(off)), np.int32(k), ti, tk))
                _sync_check(cp)
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

    # ------------------------------------------------------------------ GGM
    @classmethod
    def ggm_bytes(cls, n: int, d: int, itemsize: int, w: int, wo: int, p: int, slots: int = 64) -> int:
        """Device bytes ggm needs for n = na + nb rows: gnnd's working set, the old lists (wo wide, kept for
        the final merge), the merged output lists (w wide) and the labels."""
        return cls.gnnd_bytes(n, d, itemsize, w, p, slots) + n * (8 * wo + 8 * w + 4)

    def ggm(self, a: ShardPart, b: ShardPart, metric: str, params: GnndParams, seed: int,
            on_iter=None, vias: list[ShardPart] | None = None) -> tuple[KnnGraph, KnnGraph]:
        """GGM (paper 000 §5.1, Alg. 3) of shards a and b on the GPU; ids in and out are global.

        Contract of the CPU reference (bigknn/ggm.py, CpuBackend.ggm): lists W = params.width() wide;
        set-up keeps the first W - W//2 in-pair entries of each old list and adds W//2 (at least 1) random
        rows of the other shard (NEW); cross-shard descent (params.merge_iters, early stop under
        min_update_frac * n * W updates); each refined list is merged with the row's whole old list (ids of
        other shards included), de-duplicated, sorted, cut to W. Returned keys are exact. ``vias``: a seeded
        merge (rows of a get no fill and keep their bound; rows of b are seeded two hops through vias).
        """
        with self._device():
            try:
                return self._ggm(a, b, metric, params, seed, on_iter, vias)
            finally:
                self._free_pools()

    @staticmethod
    def _fit_width(g: KnnGraph, w: int) -> KnnGraph:
        """A graph cut or padded (EMPTY / +inf) to w entries per row."""
        if g.k == w:
            return g
        if g.k > w:
            return KnnGraph(np.ascontiguousarray(g.ids[:, :w]), np.ascontiguousarray(g.dists[:, :w]))
        pad = ((0, 0), (0, w - g.k))
        return KnnGraph(np.pad(g.ids, pad, constant_values=EMPTY).astype(np.int32),
                        np.pad(g.dists, pad, constant_values=np.inf).astype(np.float32))

    def _upload_pair(self, va: np.ndarray, vb: np.ndarray, stats: dict):
        """Vectors of a and b as one device array (na + nb, dpad) in a kernel dtype: (xd, ctype, d, dpad)."""
        cp = _cupy()
        dt_a, dt_b = np.dtype(va.dtype), np.dtype(vb.dtype)
        dt = dt_a if (dt_a == dt_b and dt_a in _CTYPES) else np.dtype(np.float32)
        na, nb = va.shape[0], vb.shape[0]
        d = va.shape[1]
        align = max(16 // dt.itemsize, 8)
        dpad = -(-d // align) * align
        raw = cp.empty((na + nb, d), dtype=dt)
        for v, rows in ((va, raw[:na]), (vb, raw[na:])):
            host = np.asarray(v, dtype=dt)
            self._to_device(host, rows, stats)
            if host is v:  # the vectors never change: keep them for the shard's next merge
                self._resident.put(v, rows)
        xd = raw.view(cp.uint16) if dt == np.float16 else raw
        if dpad != d:
            xp = cp.zeros((na + nb, dpad), dtype=xd.dtype)
            xp[:, :d] = xd
            xd = xp
        return xd, _CTYPES[dt], d, dpad

    def _upload_lists(self, ga: KnnGraph, gb: KnnGraph, wo: int, stats: dict):
        """Old lists of a and b (global ids, keys) as device arrays (na + nb, wo)."""
        cp = _cupy()
        na, nb = ga.rows, gb.rows
        ids = cp.empty((na + nb, wo), dtype=cp.int32)
        keys = cp.empty((na + nb, wo), dtype=cp.float32)
        for g, sl in ((ga, slice(0, na)), (gb, slice(na, na + nb))):
            g = self._fit_width(g, wo)
            self._to_device(np.asarray(g.ids, dtype=np.int32), ids[sl], stats)
            self._to_device(np.asarray(g.dists, dtype=np.float32), keys[sl], stats)
        return ids, keys

    def _ggm(self, a: ShardPart, b: ShardPart, metric: str, params: GnndParams, seed: int, on_iter=None,
             vias: list[ShardPart] | None = None):
        from bigknn.ggm import exact_merge, fill_count

        cp = _cupy()
        t0 = time.perf_counter()
        m = _kernel_metric(metric)
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
            return self._fit_width(a.graph, w), self._fit_width(b.graph, w)
        n = na + nb
        d = int(a.vectors.shape[1])
        fill = fill_count(w)
        p = max(1, min(params.sample_count(), MAX_P))
        same = np.dtype(a.vectors.dtype) == np.dtype(b.vectors.dtype) and np.dtype(a.vectors.dtype) in _CTYPES
        itemsize = np.dtype(a.vectors.dtype).itemsize if same else 4
        vias = list(vias or [])
        if len(vias) > MAX_VIAS or len({v.graph.k for v in vias}) > 1:
            raise ValueError(f"CUDA ggm seeds through at most {MAX_VIAS} shards with lists of one width")
        extra_bytes = sum(v.graph.ids.nbytes for v in vias)  # the vias' lists, if they must be uploaded
        half = not (same and itemsize != 4) and d >= HALF_MIN_DIM  # float32 rows: the descent reads halves
        extra_bytes += n * d * 2 if half else 0  # (and the half-precision copy, while it lives)
        budget = self._budget()
        while (self.ggm_bytes(n, d, itemsize, w, wo, p, 1 << LOG_SLOTS) + extra_bytes > budget
               and self._resident.drop_oldest()):
            budget = self._budget()  # copies kept from earlier calls make room first
        log_c = LOG_SLOTS if w >= 16 else 5
        while log_c > 4 and self.ggm_bytes(n, d, itemsize, w, wo, p, 1 << log_c) + extra_bytes > budget:
            log_c -= 1
        need = self.ggm_bytes(n, d, itemsize, w, wo, p, 1 << log_c) + extra_bytes
        self._last_need = need
        if need > budget:
            raise MemoryError(f"ggm of {na} + {nb} rows x {d} (lists of {w}) needs {need / 2**30:.2f} GiB of GPU "
                              f"memory, budget {budget / 2**30:.2f} GiB: use smaller shards")

        sync = cp.cuda.get_current_stream().synchronize
        expand = m == 0 and self._l2_expand()
        ct = _CTYPES[np.dtype(a.vectors.dtype)] if same else "float"
        wct = "unsigned short" if half else ct
        dpad0 = -(-d // max(16 // itemsize, 8)) * max(16 // itemsize, 8)
        names = (f"ggm_setup<{wct}, {m}>", f"ggm_finish<{ct}, {m}>",
                 self._cross_name(wct, m, p, dpad0, expand, cross=True))
        if expand:
            names += (f"gnnd_norms<{wct}>",)
        mod = _compile(names)
        t_c = time.perf_counter()

        moved: dict = {"h2d_bytes": 0, "resident_hits": 0}
        xd, ctype, d, dpad = self._upload_pair(a.vectors, b.vectors, moved)
        old_ids, old_keys = self._upload_lists(a.graph, b.graph, wo, moved)
        via_lists = [self._device_array(np.asarray(v.graph.ids, dtype=np.int32), moved) for v in vias]
        via_ptrs = cp.asarray([arr.data.ptr for arr in via_lists] or [0], dtype=cp.uint64)
        via_offs = cp.asarray([v.offset for v in vias] or [0], dtype=cp.int64)
        via_rows = cp.asarray([v.graph.rows for v in vias] or [0], dtype=cp.int32)
        # the set-up and the descent see the half-precision rows and keys in their scale; the fold-back
        # (ggm_finish) recomputes the refined keys from the float32 rows and keeps the old keys as stored
        xw, key_scale = self._half_rows(xd) if half else (xd, 1.0)
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
        _sync_check(cp)
        del via_lists, via_ptrs, via_offs, via_rows, setup_keys
        norms = None
        if expand:
            norms = cp.empty((n,), dtype=cp.float32)
            mod.get_function(f"gnnd_norms<{wct}>")(((n * 32 + 255) // 256,), (256,), (xw, n32, d32, dp32, norms))
        sync()
        t_setup = time.perf_counter()

        target = None if vias else self._target(xd, d, metric, params, seed, lambda wd, q: self.ggm_bytes(
            n, d, itemsize, wd, wo, q, 1 << log_c) + extra_bytes <= self._budget(), key_scale, pair=(a, b))
        stats, ids, keys, flags = self._iterate(xw, wct, dpad, m, ids, keys, flags, p, int(params.merge_iters),
                                                merge_stop_frac(params.min_update_frac, na, nb), labels=labels,
                                                log_c=log_c, norms=norms, on_iter=on_iter, target=target)
        del xw
        if target is not None and target.stopper.fell_short():  # NN-Descent cannot reach the target here
            del ids, keys, flags, norms, labels, old_ids, old_keys
            target.stopper.exact_instead()
            rows = self._numeric(xd, d)
            local = {id(a): rows[:na], id(b): rows[na:]}

            def cross(own, other, k):
                return self._exact_knn(local[id(own)], k, metric, [(other.offset, local[id(other)])])

            ga, gb = exact_merge(a, b, w, cross)
            ga.report = gb.report = target.stopper.report()
            self.last_stats = dict(stats, **moved, p=p, width=w, half=half, exact=True,
                                   total_s=time.perf_counter() - t0)
            return ga, gb
        ids = self._cut(ids, w)
        sync()
        t_it = time.perf_counter()
        del flags, norms, labels
        out_ids = cp.empty((n, w), dtype=cp.int32)
        out_keys = cp.empty((n, w), dtype=cp.float32)
        mod.get_function(f"ggm_finish<{ct}, {m}>")(grid, (128,), (
            xd, n32, d32, dp32, na32, a_off, b_off, ids, np.int32(w), old_ids, old_keys, np.int32(wo),
            out_ids, out_keys))
        _sync_check(cp)
        sync()
        t_fin = time.perf_counter()
        del ids, keys, old_ids, old_keys, xd
        h_ids = self._d2h(out_ids)
        h_keys = self._d2h(out_keys)
        report = target.stopper.report() if target else None
        ga, gb = KnnGraph(h_ids[:na], h_keys[:na], report), KnnGraph(h_ids[na:], h_keys[na:], report)
        for host, dev in ((ga.ids, out_ids[:na]), (ga.dists, out_keys[:na]), (gb.ids, out_ids[na:]),
                          (gb.dists, out_keys[na:])):
            self._resident.put(host, dev)  # the next merge of either shard starts from these
        t_end = time.perf_counter()
        self.last_stats = dict(stats, **moved, p=p, slots=1 << log_c, width=w, fill=fill, seeded=len(vias),
                               l2_expand=expand, half=half, mma=self._mma(wct, m, p, expand),
                               compile_s=t_c - t0, h2d_s=t_h2d - t_c, setup_s=t_setup - t_h2d, iter_s=t_it - t_setup,
                               finish_s=t_fin - t_it, d2h_s=t_end - t_fin, total_s=t_end - t0)
        return ga, gb
