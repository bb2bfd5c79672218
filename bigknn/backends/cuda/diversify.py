"""Diversification of candidate lists on the GPU (prune.cu), the reference bigknn/backends/cpu/diversify.py, the
lists a prune builds from edges (bigknn/algorithms/edge_lists.py run on CuPy arrays), and a whole tsdg prune held on the
device (bigknn/algorithms/tsdg_whole.py). The table of rows stays on the device while the prune hands the same one again
(``VectorSource`` gives one table for the whole prune where the rows fit the host budget; kept.py) and half the
device budget holds it; otherwise each block of candidates gathers the rows it names from the host table,
mapped (mapped.py). Blocks of BLOCK_BYTES, or of half the budget where less."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from bigknn.backends.cuda.compile import compile_kernels, sync_check
from bigknn.backends.cuda.gpu import Gpu
from bigknn.backends.cuda.kept import KeptCopy
from bigknn.backends.cuda.mapped import mapped
from bigknn.backends.cpu import diversify as reference
from bigknn.core.metric import Metric
from bigknn.algorithms import tsdg_whole as whole
from bigknn.algorithms.edge_lists import EDGE_BYTES, MERGE_ENTRY_BYTES, verdict_columns
from bigknn.algorithms.edge_lists import nearest_lists as lists_of_edges
from bigknn.algorithms.search_params import NO_LAMBDA, DiversifyRule, PruneParams

THREADS = 256  # prune.cu DIV_THREADS: a block diversifies one row
BLOCK_BYTES = 256 << 20  # candidates, keys and results of one launch
RULES = {"rng": 0, "gd": 1}


def _uploader(gpu: Gpu):
    """KeptCopy's maker of the table's device copy, through the backend's pinned staging buffers: CuPy's asarray
    stages a large host array through a pinned buffer of its whole size, and allocating and freeing those
    (``free_pools``) cost ~0.5-1 s of a 740K x 384 prune (session 30's profile)."""
    return lambda table: (_device(gpu, np.ascontiguousarray(table, dtype=np.float32)),)


def _device(gpu: Gpu, host: np.ndarray):
    """A host array on the device, copied through the backend's staging buffers (transfer.py)."""
    return gpu.transfer.device_array(np.ascontiguousarray(host), {})


def nearest_lists(gpu: Gpu, rows: int, width: int, row: np.ndarray, ids: np.ndarray, keys: np.ndarray,
                  lists: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Backend.nearest_lists on the device: as many edges sorted at once as half the budget holds (all of
    them unless the GPU is capped), the merge with ``lists`` in blocks of rows of BLOCK_BYTES (its sort words
    and temporaries, about 40 bytes an entry)."""
    import cupy as cp

    m = 0 if lists is None else lists[0].shape[1]
    return lists_of_edges(cp, rows, width, row, ids, keys, lists, max(1, gpu.budget() // 2 // EDGE_BYTES),
                          max(1, BLOCK_BYTES // (MERGE_ENTRY_BYTES * (width + m))))


def reach_back(gpu: Gpu, kept: KeptCopy, table: np.ndarray, lists: np.ndarray, list_index: np.ndarray,
               x: np.ndarray, z: np.ndarray, z_ids: np.ndarray) -> np.ndarray:
    """Backend.reach_back: the reference's blocks run on the device where the table (kept there as for
    diversify), the lists and their table rows take at most half the budget (every request gathers rows from
    anywhere in them); otherwise on the host (bigknn/backends/cpu/diversify.py)."""
    import cupy as cp

    requests = x.nbytes + z.nbytes + z_ids.nbytes + len(x)
    held = (0 if kept.holds(table) else table.shape[0] * table.shape[1] * 4) + lists.nbytes + list_index.nbytes
    if len(x) == 0 or held + requests > gpu.budget() // 2:
        return reference.reach_back(table, lists, list_index, x, z, z_ids)
    (t,) = kept.of(table, _uploader(gpu))
    d_lists, d_index = cp.asarray(lists), cp.asarray(list_index)
    # the requests go up and the answers come back in one copy each: per block they cost ~1.7 ms of host
    # calls (500 blocks on a 1M rng prune)
    dx, dz, d_zids = cp.asarray(x), cp.asarray(z), cp.asarray(z_ids)
    out = cp.zeros(len(x), bool)
    step = reference.reach_back_step(lists.shape[1], table.shape[1], BLOCK_BYTES)
    for r0 in range(0, len(x), step):
        sl = slice(r0, r0 + step)
        out[sl] = reference.reach_back_block(cp, t, d_lists, d_index, dx[sl], dz[sl], d_zids[sl])
    return out.get()


def diversify_lists(gpu: Gpu, kept: KeptCopy, cands: np.ndarray, keys: np.ndarray, table: np.ndarray, metric: Metric,
                    rule: DiversifyRule, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Backend.diversify_lists: each block's verdict (prune.cu) turned into columns on the device, so that only
    the ``width`` columns kept (int32) and their factors (uint8) come back, not the (rows, c) verdict."""
    import cupy as cp

    rows, c = cands.shape
    cols, ranks = np.full((rows, width), -1, np.int32), np.full((rows, width), NO_LAMBDA, np.uint8)
    if rows == 0 or c == 0:
        return cols, ranks
    # the whole table stays on the device where half the budget holds it; otherwise the table stays on the
    # host, mapped, and each block gathers the rows its lists name from there (issue 15's capped prune)
    half_budget = gpu.budget() // 2
    whole = kept.holds(table) or 4 * table.shape[0] * table.shape[1] <= half_budget
    step = max(1, min(BLOCK_BYTES, half_budget) // (c * (12 if whole else 12 + 4 * table.shape[1])))
    with nullcontext(None) if whole else mapped(np.ascontiguousarray(table)) as host_rows:
        for r0 in range(0, rows, step):
            cd = _device(gpu, cands[r0:r0 + step].astype(np.int32, copy=False))
            if whole:
                (x,) = kept.of(table, _uploader(gpu))
            else:  # the block's lists' rows, in list order: row r's j-th candidate is row r * c + j
                x = host_rows[cp.maximum(cd, 0).ravel()].astype(cp.float32, copy=False)
                cd = cp.where(cd >= 0, cp.arange(cd.size, dtype=cp.int32).reshape(cd.shape), -1)
            kd = _device(gpu, keys[r0:r0 + step].astype(np.float32, copy=False))
            bc, br = _diversify_block(x, cd, kd, metric, rule, width)
            cols[r0:r0 + len(cd)], ranks[r0:r0 + len(cd)] = bc.get(), br.get()
    return cols, ranks


def _diversify_block(x, cands, keys, metric: Metric, rule: DiversifyRule, width: int) -> tuple:
    """One launch over device arrays (rows of table ``x``: int32 ``cands``, float32 ``keys``): the kept columns
    and their factors (lists.verdict_columns), on the device."""
    import cupy as cp

    m = metric.kernel_id
    name = f"diversify_kept<{m}, {RULES[rule.kind]}>" if rule.sequential else f"diversify_occlusion<{m}>"
    kernel = compile_kernels((name,)).get_function(name)
    n, c = cands.shape
    out = cp.empty((n, c), np.uint8 if rule.sequential else np.int32)
    args = (x, np.int32(x.shape[1]), cands, keys, np.int32(n), np.int32(c))
    kernel((n,), (THREADS,), args + ((np.float32(rule.alpha), out) if rule.sequential else (out,)))
    sync_check(cp)
    return verdict_columns(cp, out, cands >= 0, rule.sequential, width, NO_LAMBDA)


def prune_tsdg(gpu: Gpu, kept: KeptCopy, ids: np.ndarray, keys: np.ndarray, table: np.ndarray, metric: Metric,
               params: PruneParams) -> tuple[np.ndarray, np.ndarray, int]:
    """Backend.prune_tsdg: bigknn/algorithms/tsdg_whole.py on the device, the graph and the table uploaded once and only
    the search graph downloaded."""
    import cupy as cp

    (x,) = kept.of(table, _uploader(gpu))
    d_ids, d_keys = _device(gpu, ids), _device(gpu, keys.astype(np.float32, copy=False))

    def diversify(cands, ckeys, rule: DiversifyRule, width: int) -> tuple:
        rows, c = cands.shape
        cols = cp.full((rows, width), -1, cp.int32)
        ranks = cp.full((rows, width), NO_LAMBDA, cp.uint8)
        step = max(1, BLOCK_BYTES // (12 * max(1, c)))
        for r0 in range(0, rows if c else 0, step):
            sl = slice(r0, r0 + step)
            cols[sl], ranks[sl] = _diversify_block(x, cp.ascontiguousarray(cands[sl], dtype=cp.int32),
                                                   cp.ascontiguousarray(ckeys[sl]), metric, rule, width)
        return cols, ranks

    out, lambdas, edges = whole.tsdg(cp, d_ids, d_keys, params, diversify)
    return out.get(), lambdas.get(), edges
