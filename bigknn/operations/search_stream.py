"""``bigknn search``: a query file of any size searched batch by batch through one loaded index, each batch's
results written into the output as it finishes (an .ibin under a temporary name, renamed when every query is
done; a bad row or a failure leaves nothing under ``out``). The next block of queries is read on a thread
while the index searches this one, so the file's reading overlaps the searches."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np

from bigknn.core.errors import BadInput
from bigknn.formats import VectorFile, open_vectors, truth_writer
from bigknn.core.progress import reporter
from bigknn.algorithms.search_params import SearchPlan
from bigknn.operations.search_reports import SearchReport
from bigknn.operations.search import check_output, make_plan, procedure_for
from bigknn.shards.manifest import Manifest

if TYPE_CHECKING:
    from bigknn.operations.loaded_index import LoadedIndex

STREAM_BATCH = 10_000  # queries searched together where --batch is not given
READ_ROWS = 65_536  # rows read from the query file at a time (at least one batch)


def open_request(queries: Path, out: Path, m: Manifest, k: int, budget: float | None, batch: int | None,
                 procedure: str, seed: int) -> tuple[VectorFile, int, SearchPlan]:
    """(the query file, the batch, the plan), every one checked against the store (BadInput naming the first
    problem) before any work: ``bigknn search`` calls it before the index loads."""
    check_output(out)
    vf = open_vectors(queries)
    if vf.dim != m.dim:
        raise BadInput(queries, f"queries have dim {vf.dim}; the store's rows have dim {m.dim}")
    if vf.rows == 0:
        raise BadInput(queries, "holds no queries")
    batch = STREAM_BATCH if batch is None else batch
    if batch < 1:
        raise BadInput(f"--batch {batch}", "must be at least 1")
    return vf, batch, make_plan(procedure_for(procedure), budget, k, seed)


def search_file(index: LoadedIndex, queries: Path, out: Path, k: int, budget: float | None, batch: int | None,
                procedure: str, seed: int, progress: bool) -> SearchReport:
    """Search every row of ``queries`` in batches of ``batch`` (default STREAM_BATCH) and write ids and
    distances to ``out``; the report's QPS counts the searches only (not the reading and writing)."""
    m = index.manifest
    vf, batch, plan = open_request(queries, out, m, k, budget, batch, procedure, seed)
    read = -(-max(batch, READ_ROWS) // batch) * batch  # whole batches a read
    search_s, t0 = 0.0, time.perf_counter()
    with truth_writer(out, vf.rows, k) as (ids_out, dists_out), \
            reporter(progress).phase("search", vf.rows, "queries") as advance, \
            closing(_read_blocks(vf, read)) as blocks:  # a failed search ends the read ahead
        for r0, q in blocks:
            found = index.search_rows(q, str(queries), r0, k, budget, batch, procedure, seed)
            ids_out[r0:r0 + len(q)] = found.ids
            dists_out[r0:r0 + len(q)] = found.distances
            search_s += found.report.search_s
            advance(len(q))
    return SearchReport(store=index.store_path, queries=vf.rows, k=k, procedure=plan.procedure, budget=plan.budget,
                        batch=batch, qps=round(vf.rows / max(search_s, 1e-9), 1), search_s=round(search_s, 4),
                        backend=index.backend, out=str(out), wall_s=round(time.perf_counter() - t0, 4))


def _read_blocks(vf: VectorFile, read: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, the block's rows as read) for each ``read`` rows of ``vf``, in file order, each block read on
    a thread while the caller searches the block before it (the backend checks and prepares the rows: a bad
    row raises when its batch is reached, naming it)."""
    def block(r0: int) -> tuple[int, np.ndarray]:
        return r0, np.ascontiguousarray(vf.read(r0, min(r0 + read, vf.rows)))

    starts = list(range(0, vf.rows, read))
    with ThreadPoolExecutor(1, thread_name_prefix="query-read") as pool:
        ahead = pool.submit(block, starts[0])
        for after in [*starts[1:], None]:
            got = ahead.result()
            if after is not None:
                ahead = pool.submit(block, after)
            yield got
