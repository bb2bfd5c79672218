"""Batch graph search on the GPU (search_keys.cu, search.cu): TSDG's two procedures, one warp per search (the large
procedure in small batches: a block of warps per query), step for step the NumPy reference
(bigknn/backends/cpu/graph_search.py), whose docstring states them. The search graph and its rows go to the device
once per ``SearchIndex`` (a sweep searches one index many times) and stay while it lives (kept.py); the queries go
batch by batch, each batch finished before the next starts (what batch-1 QPS means). Device arrays come from
CuPy's pool, which the backend keeps between searches (a loaded index's calls reuse its blocks). Each batch is
compared with the entry sample (a GEMM, then a warp a query keeps its nearest: bigknn/algorithms/search_index.py), and each
search starts from the sample row its number picks.
"""

from __future__ import annotations

import functools

import numpy as np

from bigknn.backends.cuda.compile import compile_kernels, sync_check
from bigknn.backends.cuda.gpu import Gpu
from bigknn.backends.cuda.kept import KeptCopy
from bigknn.core.knn_graph import EMPTY, KnnGraph, merge_lists
from bigknn.core.metric import Metric
from bigknn.formats import check_peaks, check_rows
from bigknn.algorithms.search_index import SearchIndex, entry_rows, host_queries
from bigknn.algorithms.search_params import PARENTS, SEARCH_K_MAX, SEEDS, SearchPlan

WARPS = 4  # queries a block where a warp searches a query
SHARED_BYTES = 48 << 10  # per block without the opt-in
TABLE_SLOTS = 2048  # the large procedure's table of rows computed (4,096 measured slower: fewer warps an SM)
QUERY_WARPS_PER_SM = 4  # batches of fewer queries than this per SM get a block of BLOCK_WARPS a query
BLOCK_WARPS = 8  # warps of such a block: they share the keys of a hop (results as with one warp; search.cu: <= 8)
TEAM = 8  # search_keys.cu: lanes that compute one key together
HELD_UNITS = 16  # search_keys.cu: float4 units a lane holds in registers at most (team_keys' VPL)
DEVICE_QUERY_ROWS = 256  # smaller batches are checked and prepared on the host: a launch and a copy back cost more


def units_per_lane(dim: int, half: bool = False) -> int:
    """search_keys.cu team_keys' VPL: the 16-byte units of a row (4 floats, or 8 halves for a half walk) each lane
    of a team loads, where rows are whole units and that fits the registers; 0 (a loop) otherwise."""
    per_unit = 8 if half else 4
    units = -(-dim // (per_unit * TEAM))
    return units if dim % per_unit == 0 and units <= HELD_UNITS else 0


def table_bits(width: int, deg: int) -> int:
    """log2 of the slots of the large procedure's table of computed rows for a search list of ``width``: at
    least twice what a hop can hold (the list, then PARENTS lists of neighbours), so that it never fills up."""
    slots = max(TABLE_SLOTS, 2 * (width + PARENTS * deg))
    return (slots - 1).bit_length()


def large_floats(dim: int, deg: int, width: int) -> int:
    """Shared memory of one large-batch search (search.cu's layout), in 4-byte words."""
    wpad = -(-width // 32) * 32
    return dim + 2 * wpad + wpad // 4 + PARENTS * (2 * max(deg, 32) + 2) + 2 + (1 << table_bits(width, deg))


@functools.cache
def _processors(device: int) -> int:
    """The device's streaming multiprocessors, asked once: CuPy's ``attributes`` queries every attribute, and
    batch-1 searches call graph_search once a query."""
    import cupy as cp

    return int(cp.cuda.Device(device).attributes["MultiProcessorCount"])


def _upload(index: SearchIndex) -> tuple:
    import cupy as cp

    walk = None if index.walk is None else (cp.asarray(index.walk[0]).view(cp.uint16), index.walk[1])
    return (cp.asarray(np.ascontiguousarray(index.vectors, dtype=np.float32)),
            cp.asarray(np.ascontiguousarray(index.ids, dtype=np.int32)),
            cp.asarray(np.ascontiguousarray(index.lambdas, dtype=np.uint8)),
            {},  # the entry sample of each seed searched: (ids, rows), made once (batch-1 calls pay nothing)
            walk)  # the half rows the large procedure walks, and their scale (SearchIndex.walk), or None


def _entry_sample(index: SearchIndex, x, samples: dict, seed: int) -> tuple:
    """(ids, rows, squared norms) of the seed's entry rows (algorithms/search_index.py entry_rows) on the device, made once
    per index and seed."""
    import cupy as cp

    if seed not in samples:
        ids = cp.asarray(entry_rows(index, seed))
        rows = x[ids]
        samples[seed] = (ids.astype(cp.int32), rows, (rows * rows).sum(axis=1, dtype=cp.float32))
    return samples[seed]


def nearest_entries(sample: tuple, queries, metric: Metric):
    """algorithms/search_index.py nearest_entries on the device: one GEMM, then a warp a query keeps the nearest SEEDS
    (search_keys.cu entry_nearest) instead of sorting each query's whole row of keys (10K x 4,096 words a batch).
    (nq, min(SEEDS, sample rows)) int32 ids, nearest first."""
    import cupy as cp

    ids, rows, norms = sample
    dots = queries @ rows.T
    nq, s = dots.shape
    w = min(SEEDS, s)
    out = cp.empty((nq, w), cp.int32)
    if nq:
        name = f"entry_nearest<{metric.kernel_id}>"
        compile_kernels((name,)).get_function(name)((-(-nq // WARPS),), (32 * WARPS,), (
            dots, norms, np.int32(s), np.int32(nq), ids, np.int32(w), out))
    return out


def searched_queries(rows: np.ndarray, metric: Metric, name: str, first_row: int):
    """The Backend's ``searched_queries`` on the device: the rows go up as they are (made float32 there), a warp
    a row finds its largest magnitude and (cosine) scales it to unit length in place (search_keys.cu query_rows), and
    only the peaks come back for the host's check (bigknn/formats/read.py check_peaks, the one place rows are judged).
    A batch of fewer than DEVICE_QUERY_ROWS (one query a call) is prepared on the host as the CPU backend does."""
    import cupy as cp

    if len(rows) < DEVICE_QUERY_ROWS:
        return host_queries(rows, metric, name, first_row)
    if rows.dtype != np.float32:  # judged as given (a float64 row may overflow float32), then searched as float32
        check_rows(name, first_row, rows)
    q = cp.asarray(rows).astype(cp.float32, copy=False)  # up in their own dtype (uint8: a quarter of the bytes)
    nq, dim = q.shape
    peak = cp.empty(nq, cp.float32)
    if nq:
        module = compile_kernels((f"entry_nearest<{metric.kernel_id}>",))  # nearest_entries' module: no compile
        module.get_function("query_rows")((-(-nq // WARPS),), (32 * WARPS,), (
            q, np.int32(nq), np.int32(dim), np.int32(metric.normalised), peak))
    check_peaks(name, first_row, rows, peak.get())  # reads only rows whose peak could overflow
    return q


def graph_search(gpu: Gpu, kept: KeptCopy, index: SearchIndex, queries, plan: SearchPlan,
                 batch: int) -> KnnGraph:
    import cupy as cp

    m = index.metric.kernel_id
    x, edges, lambdas, samples, walk = kept.of(index, _upload)
    n, dim = x.shape
    deg = edges.shape[1]
    width = plan.list_length
    if plan.procedure == "large":  # per_query: shared bytes; a block of warps a query in small batches
        per_query = 4 * large_floats(dim, deg, width)
        if per_query > SHARED_BYTES:
            raise ValueError(f"rows of {dim} dims are too wide for the search kernels' shared memory")
        qw = BLOCK_WARPS if batch < QUERY_WARPS_PER_SM * _processors(cp.cuda.Device().id) else 1  # warm-ups too
        warps = qw if qw > 1 else min(WARPS, SHARED_BYTES // per_query)
        queries_per_block = 1 if qw > 1 else warps
        half = walk is not None
        name = f"graph_search_large<{m}, {qw}, {units_per_lane(dim, half)}, {'true' if half else 'false'}>"
    else:
        per_query = 4 * (dim + 128)
        warps = min(WARPS, SHARED_BYTES // per_query)
        if warps < 1:
            raise ValueError(f"rows of {dim} dims are too wide for the search kernels' shared memory")
        name = f"graph_search_small<{m}>"
    kernel = compile_kernels((name,)).get_function(name)
    sample = _entry_sample(index, x, samples, plan.seed)
    ids_out, keys_out, work = [], [], []
    for b0 in range(0, len(queries), batch):
        q = cp.ascontiguousarray(cp.asarray(queries[b0:b0 + batch], dtype=cp.float32))  # host rows or device
        starts = nearest_entries(sample, q, index.metric)
        nq = q.shape[0]
        common = (x, np.int64(n), np.int32(dim), edges, lambdas, np.int32(deg), q, starts, np.int32(starts.shape[1]))
        if plan.procedure == "large":
            found = cp.empty((2, nq, plan.k), cp.int32)  # ids, then keys' bits: one copy back (a batch-1 call
            oi, ok = found[0], found[1].view(cp.float32)  # pays one synchronising copy, not two)
            ow = cp.empty((nq, 2), cp.int32)  # per query: rows whose keys it computed, hops
            kernel((-(-nq // queries_per_block),), (32 * warps,), common + (
                np.int32(nq), np.int32(plan.k), np.int32(width), np.int32(PARENTS), np.int32(plan.lambda_visit),
                np.int32(plan.hops), np.int32(table_bits(width, deg)), oi, ok, ow,
                walk[0] if half else x, np.float32(walk[1] if half else 1.0)),
                shared_mem=queries_per_block * per_query)
            sync_check(cp)
            if gpu.profile:
                work.append(ow.get())
            got = found.get()
            ids_out.append(got[0])
            keys_out.append(got[1].view(np.float32))
        else:
            t0 = plan.searches
            ns = nq * t0
            oi = cp.empty((ns, SEARCH_K_MAX), cp.int32)
            ok = cp.empty((ns, SEARCH_K_MAX), cp.float32)
            kernel((-(-ns // warps),), (32 * warps,), common + (
                np.int32(ns), np.int32(t0), np.int32(plan.lambda_visit), np.int32(plan.hops),
                oi, ok), shared_mem=warps * per_query)
            sync_check(cp)
            lists = (nq, t0 * SEARCH_K_MAX)
            ids, keys = merge_lists(oi.get().reshape(lists).astype(np.int64), ok.get().reshape(lists), plan.k)
            ids_out.append(np.where(np.isinf(keys), EMPTY, ids).astype(np.int32))
            keys_out.append(keys)
    if work:  # profiled: what the large procedure did per query, beside the kernel times of the other calls
        w = np.concatenate(work)
        gpu.last_stats = {"rows_computed_per_query": float(w[:, 0].mean()), "hops_per_query": float(w[:, 1].mean())}
    if not ids_out:
        return KnnGraph(np.empty((0, plan.k), np.int32), np.empty((0, plan.k), np.float32))
    return KnnGraph(np.concatenate(ids_out), np.concatenate(keys_out))
