"""How much GPU memory a call may use, what GNND and GGM need of it, and how a call fits into it.

Bytes on the GPU (``gpu_mem_bytes`` caps the budget, else 92 % of free memory):

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
  (tc <= 65536, both picked from what is left of the budget; exact.py).
* host: the pinned staging buffers (2 x 96 MiB: calls, and uploads ahead) live as long as the backend
  object; allocating them costs ~0.3 s on the first large transfer (transfer.py).
* kept between calls (``resident.py``): a merge's output lists and both shards' vectors, and what ``stage``
  uploaded ahead for the next pair. They count against ``gpu_mem_bytes``, and a call drops the least
  recently used of them until its own working set fits (``plan_slots``).

Every call frees CuPy's memory pools at its end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from bigknn.backends.cuda.compile import MAX_P, padded_dim
from bigknn.backends.cuda.rows import HALF_MIN_DIM
from bigknn.core.human import human_bytes
from bigknn.core.params import GnndParams
from bigknn.algorithms.recall_target import MAX_WIDTH, WIDEN_STEP

if TYPE_CHECKING:
    from bigknn.backends.cuda.gpu import Gpu
    from bigknn.backends.cuda.resident import ResidentCopies

LOG_SLOTS = 7  # candidate slots per row (common.cuh MAX_SLOTS): 128; halved while the budget is short


def budget(gpu_mem_bytes: int | None, resident: ResidentCopies) -> int:
    """Device bytes one call may plan to use: 92 % of what is free (CuPy's pool included), and within the
    cap, less the copies kept between calls."""
    import cupy as cp

    pool = cp.get_default_memory_pool()
    free, _total = cp.cuda.runtime.memGetInfo()
    out = int((free + pool.free_bytes()) * 0.92)
    if gpu_mem_bytes is not None:  # copies kept between calls count against the cap too
        out = min(out, int(gpu_mem_bytes) - resident.nbytes())
    return out


def pool_state(gpu: Gpu) -> str:
    """What the device held when a call ran out of memory, for its warning: CuPy's pool in use and free (free
    bytes inside a chunk still partly in use cannot be given back, yet ``budget`` counts them), the driver's
    free bytes, the copies kept between calls and what the call planned (``gpu.last_need``)."""
    import cupy as cp

    pool = cp.get_default_memory_pool()
    free, _total = cp.cuda.runtime.memGetInfo()
    return (f"pool {human_bytes(pool.used_bytes())} in use and {human_bytes(pool.free_bytes())} free, "
            f"{human_bytes(free)} free on the device, {human_bytes(gpu.resident.nbytes())} of copies kept, "
            f"{human_bytes(gpu.last_need)} planned")


def gnnd_bytes(n: int, d: int, itemsize: int, k: int, p: int, slots: int = 64) -> int:
    """Device bytes gnnd needs (see the module docstring)."""
    dpad = padded_dim(d, itemsize)
    p = min(p, MAX_P)
    pad_copy = n * d * itemsize if dpad != d else 0
    return n * (dpad * itemsize + 9 * k + 16 * p + 20 + 8 * slots) + pad_copy + (1 << 20)


def ggm_bytes(n: int, d: int, itemsize: int, w: int, wo: int, p: int, slots: int = 64) -> int:
    """Device bytes ggm needs for n = na + nb rows: gnnd's working set, the old lists (wo wide, kept for
    the final merge), the merged output lists (w wide) and the labels."""
    return gnnd_bytes(n, d, itemsize, w, p, slots) + n * (8 * wo + 8 * w + 4)


def merge_bytes(shard_rows: int, dim: int, itemsize: int, params: GnndParams) -> int:
    """The MemoryModel of this backend (bigknn/backends/base.py): device bytes of one GGM of two shards of
    ``shard_rows`` rows, at its full candidate slots (a merge that must halve them converges slower), with the
    room ``_room`` adds."""
    n = 2 * shard_rows
    wide, halves = _room(n, dim, itemsize, params)
    return ggm_bytes(n, dim, itemsize, wide, params.width(), params.sample_count(wide), 1 << LOG_SLOTS) + halves


def whole_bytes(rows: int, dim: int, itemsize: int, params: GnndParams) -> int:
    """The MemoryModel of this backend: device bytes of one GNND of ``rows`` rows, as ``merge_bytes`` counts a
    merge's (full slots, the room ``_room`` adds)."""
    wide, halves = _room(rows, dim, itemsize, params)
    return gnnd_bytes(rows, dim, itemsize, wide, params.sample_count(wide), 1 << LOG_SLOTS) + halves


def spanning_bytes(rows: int, dim: int, itemsize: int, params: GnndParams, gpus: int) -> int:
    """The MemoryModel of this backend: device bytes on each of ``gpus`` GPUs of one GNND of ``rows`` rows whose
    lists span them (spanning.py): every GPU holds all the rows (and their half copy), and its share of the
    lists, samples and candidate slots, counted as ``whole_bytes`` counts them (one GPU: the same bytes)."""
    wide, halves = _room(rows, dim, itemsize, params)
    share = -(-rows // max(1, gpus))
    p, slots = params.sample_count(wide), 1 << LOG_SLOTS
    lists = gnnd_bytes(share, dim, itemsize, wide, p, slots) - gnnd_bytes(share, dim, itemsize, 0, 0, 0)
    return gnnd_bytes(rows, dim, itemsize, 0, 0, 0) + lists + halves


def _room(rows: int, dim: int, itemsize: int, params: GnndParams) -> tuple[int, int]:
    """(list width, extra bytes) a planned call of ``rows`` rows is sized for: lists one widening step wider
    when a recall target is set (a call that cannot widen at a stall ends below its target), and the
    half-precision copy wide float32 rows descend on."""
    w = params.width()
    wide = min(MAX_WIDTH, w + WIDEN_STEP) if params.recall > 0 else w
    halves = rows * dim * 2 if itemsize == 4 and dim >= HALF_MIN_DIM else 0
    return wide, halves


def plan_slots(gpu: Gpu, need: Callable[[int], int], width: int, what: str) -> tuple[int, int]:
    """(log2 of the candidate slots per row, device bytes) for a call needing ``need(slots)`` bytes with
    lists ``width`` wide: copies kept from earlier calls are dropped (least recently used first) while the
    most slots do not fit, then the slots halve down to 16; MemoryError, naming ``what``, when even that
    does not fit. The call's bytes become ``gpu.last_need`` under ``gpu.plan_lock``, which the uploads ahead
    take for their check and allocation: none of them takes what this call planned on (a 250M build's merge
    of two larger k-means shards ran out of memory beside uploads checked against the merge before it)."""
    with gpu.plan_lock:
        budget_now = gpu.budget()
        while need(1 << LOG_SLOTS) > budget_now and gpu.resident.drop_oldest():
            budget_now = gpu.budget()  # copies kept from earlier calls make room first
        log_c = LOG_SLOTS if width >= 16 else 5
        while log_c > 4 and need(1 << log_c) > budget_now:
            log_c -= 1
        total = need(1 << log_c)
        if total > budget_now:
            raise MemoryError(f"{what} needs {total / 2**30:.2f} GiB of GPU memory, "
                              f"budget {budget_now / 2**30:.2f} GiB: use smaller shards")
        gpu.last_need = total
    return log_c, total


def free_pools() -> None:
    import cupy as cp

    cp.get_default_memory_pool().free_all_blocks()
    cp.get_default_pinned_memory_pool().free_all_blocks()
