"""The GNND descent on the device (GNND paper §4), shared by GNND and GGM: a random start and the iterations.

Kernels (gnnd.cu, cross.cu):

* ``gnnd_init``    random k distinct neighbours != self per row, keys, warp bitonic sort, all NEW.
* ``gnnd_sample``  first p NEW and first p OLD per list (list order); sampled NEW become OLD. With labels
                   (GGM): NEW only from entries of the other shard, OLD only from the row's own shard.
* ``gnnd_reverse`` reverse samples appended with atomics while a sample list holds < 2p.
* ``gnnd_cross``   one block per list: dedupe samples, NEW x (NEW u OLD) distances register-tiled in
                   shared memory (dims chunked), selective update (nearest other NEW and nearest OLD for
                   each NEW sample, nearest NEW for each OLD sample) into a per-row candidate table
                   (hash slot per neighbour id, 64-bit atomicMin on (key, id): lock-free). CROSS variant
                   (GGM): NEW x OLD only (NEW and OLD samples lie in different shards). MMA variant: the
                   distance tiles on tensor cores for half rows with a dot-product key (compile.uses_mma).
* ``gnnd_merge``   one warp per row: drop listed / self / not-better candidates, rank-merge with the
                   sorted list, mark inserts NEW, count them, reset the table.

The iterations take an existing graph + NEW flags + optional per-row partition labels, so GGM (Alg. 3) can
reuse them: pairs with equal labels are never compared. Lists handed to ``iterate`` must be sorted by
(key, id); with ``norms`` given, run ``gnnd_finalize`` afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from bigknn.backends.cuda.compile import compile_kernels, cross_name, cross_shape, sync_check

if TYPE_CHECKING:
    from bigknn.backends.cuda.gpu import Gpu
    from bigknn.backends.cuda.target import DeviceTarget


def init_graph(xd, ctype: str, d: int, dpad: int, m: int, k: int, seed: int):
    """Random initial graph on the device: (ids, keys, flags), k distinct ids != self per row, all NEW."""
    import cupy as cp

    n = xd.shape[0]
    if n - 1 < k:
        raise ValueError(f"random init needs n - 1 >= k (n={n}, k={k})")
    ids = cp.empty((n, k), dtype=cp.int32)
    keys = cp.empty((n, k), dtype=cp.float32)
    flags = cp.empty((n, k), dtype=cp.uint8)
    name = f"gnnd_init<{ctype}, {m}>"
    init = compile_kernels((name,)).get_function(name)
    seed64 = np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF)
    init(((n + 3) // 4,), (128,), (xd, np.int32(n), np.int32(d), np.int32(dpad), np.int32(k), seed64,
                                  ids, keys, flags, np.int32(0), np.int32(n)))
    sync_check(cp)
    return ids, keys, flags


@dataclass
class Part:
    """The rows [row0, row0 + rows) of a descent, the device that runs their kernels and its copies of every row
    (``xd``, as the kernels read them) and of their squared norms (``norms``, or None): the one part of a
    descent on one GPU, or one part a GPU where the lists span GPUs (spanning.py)."""

    device: int
    row0: int
    rows: int
    xd: Any
    norms: Any = None


def device_arrays(shape: tuple, dtype, fill=None):
    """A new array on the current device (``fill``: its every element), as ``iterate`` makes its scratch on one
    GPU; a descent across GPUs passes its own maker (managed memory, spanning.py)."""
    import cupy as cp

    return cp.empty(shape, dtype=dtype) if fill is None else cp.full(shape, fill, dtype=dtype)


def resized(arrays: tuple, width: int, alloc: Callable, parts: list[Part]) -> tuple:
    """ids, keys (and flags) with ``width`` columns: cut, or grown with empty slots (id -1, key +inf, OLD);
    each part's rows copied on its own device (a descent across GPUs: managed arrays)."""
    import cupy as cp

    k = min(arrays[0].shape[1], width)
    fills = (np.int32(-1), np.float32(np.inf), np.uint8(0))
    out = tuple(alloc((len(a), width), a.dtype, fill) for a, fill in zip(arrays, fills))
    for part in parts:
        with cp.cuda.Device(part.device):
            for new, old in zip(out, arrays):
                new[part.row0:part.row0 + part.rows, :k] = old[part.row0:part.row0 + part.rows, :k]
    for part in parts:
        cp.cuda.Device(part.device).synchronize()
    return out


def iterate(gpu: Gpu, xd, ctype: str, dpad: int, m: int, ids, keys, flags, p: int, iters: int,
            min_update_frac: float, labels=None, log_c: int = 6, norms=None, on_iter=None,
            target: DeviceTarget | None = None, parts: list[Part] | None = None,
            alloc: Callable = device_arrays):
    """GNND iterations on a device graph (ids/keys sorted by (key, id) per row, flags 1 = NEW).

    ``labels`` (n,) int32 on the device, optional, two classes (GGM's shards a and b): cross-shard mode.
    NEW samples are taken only from entries of the other label, OLD samples only from entries of the
    row's own label, so every NEW x OLD pair is cross-shard; NEW x NEW is not computed and pairs with
    equal labels are never compared.
    ``norms`` (n,) float32 squared row norms, optional (l2 only): distances by the norm expansion; the
    keys left in the lists are then approximate, and gnnd_finalize must make them exact.
    ``target``: stop by the probe's recall estimate (bigknn/algorithms/recall_target.py) instead of the update fraction,
    widening the lists where it stalls (new, wider arrays replace ids/keys/flags; the caller cuts them).
    ``gpu``: its options (tensor cores; profile: time each kernel with events, stats["kernel_ms"]).
    ``parts``: the lists span GPUs (spanning.py): each kernel runs on every part's device over its rows, with
    atomics that act across GPUs, and every device finishes it before the next starts (it reads what the
    others wrote); ``xd`` and ``norms`` are then each part's own, and ``alloc`` makes the scratch and the
    widened lists every GPU reaches. Returns (stats with per-iteration update counts, ids, keys, flags).
    """
    import cupy as cp

    n, k = ids.shape
    s2 = 2 * p
    spans = parts is not None
    parts = parts or [Part(cp.cuda.Device().id, 0, n, xd, norms)]
    expand = parts[0].norms is not None and m == 0
    cross_expr = cross_name(ctype, m, p, dpad, expand, labels is not None, gpu.use_tensor_cores())
    maxn, tr, tc = cross_shape(p)
    nt = (maxn // tr) * (2 * maxn // tc)
    kernels, dummies = {}, {}
    for part in parts:
        with cp.cuda.Device(part.device):
            mod = compile_kernels((cross_expr,), system_atomics=spans)
            kernels[part.device] = {name: mod.get_function(name)
                                    for name in ("gnnd_sample", "gnnd_reverse", "gnnd_merge", cross_expr)}
            dummies[part.device] = (cp.zeros((1,), dtype=cp.float32), cp.zeros((1,), dtype=cp.int32))

    new_s = alloc((n, s2), cp.int32)
    old_s = alloc((n, s2), cp.int32)
    cnt = alloc((4 * n,), cp.int32)
    cand = alloc((n << log_c,), cp.uint64, np.uint64(0xFFFFFFFFFFFFFFFF))
    upd = alloc((1,), cp.uint64, np.uint64(0))
    lab = None if labels is None else cp.ascontiguousarray(labels, dtype=cp.int32)
    n32, k32, p32 = np.int32(n), np.int32(k), np.int32(p)
    threshold = min_update_frac * n * k
    counts = []
    marks = []

    def mark(name):
        if gpu.profile:
            ev = cp.cuda.Event()
            ev.record()
            marks.append((name, ev))

    def each(launch: Callable) -> None:
        """``launch(part, kernels, rows, norms, labels)`` on every part's device, then (across GPUs) wait for all."""
        for part in parts:
            with cp.cuda.Device(part.device):
                zero_norms, zero_labels = dummies[part.device]
                launch(part, kernels[part.device], np.int32(part.row0), np.int32(part.rows),
                       part.norms if expand else zero_norms, zero_labels if lab is None else lab)
        sync_check(cp)
        if spans:
            for part in parts:
                cp.cuda.Device(part.device).synchronize()

    for _ in range(iters):
        upd.fill(0)
        mark("start")
        each(lambda part, f, r0, rows, nrm, lb: f["gnnd_sample"](
            ((part.rows + 3) // 4,), (128,), (n32, k32, p32, ids, flags, new_s, old_s, cnt, lb,
                                              np.int32(labels is not None), r0, rows)))
        mark("sample")
        each(lambda part, f, r0, rows, nrm, lb: f["gnnd_reverse"](
            ((part.rows * p + 255) // 256,), (256,), (n32, p32, new_s, old_s, cnt, r0, rows)))
        mark("reverse")
        each(lambda part, f, r0, rows, nrm, lb: f[cross_expr](
            (part.rows,), (nt,), (part.xd, n32, np.int32(dpad), k32, p32, new_s, old_s, cnt, keys, lb,
                                  np.int32(labels is not None), cand, np.int32(log_c), nrm, r0)))
        mark("cross")
        each(lambda part, f, r0, rows, nrm, lb: f["gnnd_merge"](
            ((part.rows + 3) // 4,), (128,), (n32, k32, ids, keys, flags, cand, np.int32(log_c), upd, r0, rows)))
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
            ids, keys, flags = resized((ids, keys, flags), target.stopper.width, alloc, parts)
            k32 = np.int32(ids.shape[1])
            if target.p != p:
                p, p32, s2 = target.p, np.int32(target.p), 2 * target.p
                cross_expr = cross_name(ctype, m, p, dpad, expand, labels is not None, gpu.use_tensor_cores())
                maxn, tr, tc = cross_shape(p)
                nt = (maxn // tr) * (2 * maxn // tc)
                for part in parts:
                    with cp.cuda.Device(part.device):
                        mod = compile_kernels((cross_expr,), system_atomics=spans)
                        kernels[part.device][cross_expr] = mod.get_function(cross_expr)
                new_s = alloc((n, s2), cp.int32)
                old_s = alloc((n, s2), cp.int32)
    out = {"iters_run": len(counts), "updates": counts}
    if target is not None:
        out["recall_target"] = target.stopper.report()
    if gpu.profile:
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
