"""Diversification of candidate lists on the GPU (prune.cu), the reference bigknn/backends/cpu/prune.py, and the
lists a prune builds from edges (bigknn/search/lists.py run on CuPy arrays). The
table of rows stays on the device while the prune hands the same one again (``VectorSource`` gives one table
for the whole prune where the rows fit the host budget; kept.py) and half the device budget holds it;
otherwise each block of candidates takes the rows it names. Blocks of BLOCK_BYTES."""

from __future__ import annotations

import numpy as np

from bigknn.backends.cuda.compile import compile_kernels, kernel_metric, sync_check
from bigknn.backends.cuda.gpu import Gpu
from bigknn.backends.cuda.kept import KeptCopy
from bigknn.backends.cpu import prune as reference
from bigknn.search.lists import edge_lists, merge_rows, verdict_columns
from bigknn.search.params import NO_LAMBDA, DiversifyRule

WARPS = 4  # prune.cu: __launch_bounds__(128)
BLOCK_BYTES = 256 << 20  # candidates, keys and results of one launch
RULES = {"rng": 0, "gd": 1}


def _upload(table: np.ndarray) -> tuple:
    import cupy as cp

    return (cp.asarray(np.ascontiguousarray(table, dtype=np.float32)),)


def nearest_lists(gpu: Gpu, rows: int, width: int, row: np.ndarray, ids: np.ndarray, keys: np.ndarray,
                  lists: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Backend.nearest_lists on the device: the edges sorted at once, the merge with ``lists`` in blocks of
    rows of BLOCK_BYTES (its sort words and temporaries, about 40 bytes an entry)."""
    import cupy as cp

    e_ids, e_keys = edge_lists(cp, rows, width, cp.asarray(row), cp.asarray(ids), cp.asarray(keys))
    if lists is None:
        return e_ids.get(), e_keys.get()
    out_ids, out_keys = np.empty((rows, width), np.int64), np.empty((rows, width), np.float32)
    step = max(1, BLOCK_BYTES // (40 * (width + lists[0].shape[1])))
    for r0 in range(0, rows, step):
        sl = slice(r0, r0 + step)
        i, k = merge_rows(cp, cp.concatenate([cp.asarray(lists[0][sl], dtype=cp.int64), e_ids[sl]], axis=1),
                          cp.concatenate([cp.asarray(lists[1][sl], dtype=cp.float32), e_keys[sl]], axis=1), width)
        out_ids[sl], out_keys[sl] = i.get(), k.get()
    return out_ids, out_keys


def reach_back(gpu: Gpu, kept: KeptCopy, table: np.ndarray, lists: np.ndarray, list_index: np.ndarray,
               x: np.ndarray, z: np.ndarray, z_ids: np.ndarray) -> np.ndarray:
    """Backend.reach_back: the reference's blocks run on the device where the table (kept there as for
    diversify), the lists and their table rows take at most half the budget (every request gathers rows from
    anywhere in them); otherwise on the host (bigknn/backends/cpu/prune.py)."""
    import cupy as cp

    requests = x.nbytes + z.nbytes + z_ids.nbytes + len(x)
    held = (0 if kept.holds(table) else table.shape[0] * table.shape[1] * 4) + lists.nbytes + list_index.nbytes
    if len(x) == 0 or held + requests > gpu.budget() // 2:
        return reference.reach_back(table, lists, list_index, x, z, z_ids)
    (t,) = kept.of(table, _upload)
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


def diversify_lists(gpu: Gpu, kept: KeptCopy, cands: np.ndarray, keys: np.ndarray, table: np.ndarray, metric: str,
                    rule: DiversifyRule, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Backend.diversify_lists: each block's verdict (prune.cu) turned into columns on the device, so that only
    the ``width`` columns kept (int32) and their factors (uint8) come back, not the (rows, c) verdict."""
    import cupy as cp

    m = kernel_metric(metric)
    rows, c = cands.shape
    cols, ranks = np.full((rows, width), -1, np.int32), np.full((rows, width), NO_LAMBDA, np.uint8)
    if rows == 0 or c == 0:
        return cols, ranks
    # the whole table stays on the device where half the budget holds it; otherwise each block gets the rows
    # it names (a GPU capped below the data: issue 15's out-of-core prune)
    whole = kept.holds(table) or 4 * table.shape[0] * table.shape[1] <= gpu.budget() // 2
    name = f"diversify_kept<{m}, {RULES[rule.kind]}>" if rule.sequential else f"diversify_occlusion<{m}>"
    kernel = compile_kernels((name,)).get_function(name)
    step = max(1, BLOCK_BYTES // (c * (12 if whole else 12 + 4 * table.shape[1])))
    for r0 in range(0, rows, step):
        block = cands[r0:r0 + step]
        if whole:
            (x,) = kept.of(table, _upload)
        else:
            used = np.unique(block[block >= 0])
            x = cp.asarray(np.ascontiguousarray(table[used], dtype=np.float32))
            block = np.where(block >= 0, np.searchsorted(used, block), -1)
        cd = cp.asarray(np.ascontiguousarray(block, dtype=np.int32))
        kd = cp.asarray(np.ascontiguousarray(keys[r0:r0 + step], dtype=np.float32))
        n = cd.shape[0]
        od = cp.empty((n, c), np.uint8 if rule.sequential else np.int32)
        grid = (-(-n // WARPS),)
        if rule.sequential:
            kernel(grid, (32 * WARPS,), (x, np.int32(x.shape[1]), cd, kd, np.int32(n), np.int32(c),
                                         np.float32(rule.alpha), od), shared_mem=WARPS * c * 4)
        else:
            kernel(grid, (32 * WARPS,), (x, np.int32(x.shape[1]), cd, kd, np.int32(n), np.int32(c), od))
        sync_check(cp)
        bc, br = verdict_columns(cp, od, cd >= 0, rule.sequential, width, NO_LAMBDA)
        cols[r0:r0 + n], ranks[r0:r0 + n] = bc.get(), br.get()
    return cols, ranks
