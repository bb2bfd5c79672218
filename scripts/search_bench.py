"""What scripts/bench_search.py and scripts/bench_search_api.py share: an input's held-out queries, the device's
name, the batch-by-batch timing of a search, and CAGRA's timed build and search, so both measure every tool
the same way."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from bigknn.formats import open_vectors

MIN_TIMED_S = 0.5  # batched searches are timed over at least this long (whole passes over the queries)
CAGRA_METRIC = {"l2": "sqeuclidean", "ip": "inner_product", "cosine": "inner_product"}  # cosine: rows unit length


def device_name(backend: str) -> str:
    """The GPU's name for the records ("cpu" on the CPU backend)."""
    if backend != "cuda":
        return "cpu"
    import cupy as cp

    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def held_out(path: str | Path, queries: int) -> tuple[np.ndarray, np.ndarray]:
    """(base rows, queries): the last ``queries`` rows of the file are the queries, not in the base set."""
    vf = open_vectors(path)
    return vf.read(0, vf.rows - queries), vf.read(vf.rows - queries, vf.rows)


def timed(search, q: np.ndarray, batch: int, limit_s: float) -> tuple[np.ndarray, float, int]:
    """(ids found, QPS, queries searched): ``search(queries)`` one batch a call after a warm-up call of a whole
    batch (a smaller one may take other kernels: CAGRA picks by batch size); one query a call stops after
    ``limit_s``. Batches of many queries pass over the queries again until MIN_TIMED_S have gone by (one pass of
    10K queries takes milliseconds: a single pass is mostly noise); the ids are the first pass's."""
    search(q[:batch])
    ids, done = [], 0
    t0 = time.perf_counter()
    while done < len(q) and (batch > 1 or time.perf_counter() - t0 < limit_s):
        ids.append(search(q[done:done + batch]))
        done += len(ids[-1])
    searched = done
    while batch > 1 and time.perf_counter() - t0 < MIN_TIMED_S:
        for b0 in range(0, len(q), batch):
            search(q[b0:b0 + batch])
        searched += len(q)
    return np.concatenate(ids), searched / (time.perf_counter() - t0), done


def cagra_build(xd, metric: str, degree: int, warm_rows: int | None) -> tuple[object, float]:
    """(CAGRA index of the device rows ``xd``, build seconds): its own nn_descent build at ``degree``, timed
    after a warm-up build of ``warm_rows`` rows (None: no warm-up, the kernels already loaded)."""
    import cupy as cp
    from cuvs.neighbors import cagra

    params = cagra.IndexParams(metric=CAGRA_METRIC[metric], graph_degree=degree,
                               intermediate_graph_degree=2 * degree, build_algo="nn_descent")
    if warm_rows is not None:
        cagra.build(params, xd[:warm_rows])
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    idx = cagra.build(params, xd)
    cp.cuda.Device().synchronize()
    return idx, time.perf_counter() - t0


def cagra_search(idx, itopk: int, k: int):
    """``search(queries) -> ids`` (int64, on the host, as bigknn returns them) of a CAGRA index at ``itopk``."""
    import cupy as cp
    from cuvs.neighbors import cagra

    sp = cagra.SearchParams(itopk_size=itopk)
    # cuVS returns a device_ndarray
    return lambda qq: cp.asnumpy(cp.asarray(cagra.search(sp, idx, cp.asarray(qq), k)[1])).astype(np.int64)
