"""tests/test_search_index.py on the CUDA backend: a loaded index keeps its device copy between calls (no reload,
no new upload), finds what a fresh load finds, frees the device memory on ``close()``, serves threads, and
streams a query file with the results of one search. Run with ``pytest -m gpu tests/test_gpu_search_index.py``."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import bigknn
import bigknn.backends.cuda.graph_search as cuda_search
import bigknn.operations.loaded_index as search_index
import bigknn.operations.search_stream as stream
from bigknn.formats import read_truth

from conftest import count_calls, pruned_store, search_set

pytestmark = pytest.mark.gpu

ROWS, QUERIES, DIM = 3000, 200, 32


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    d = search_set(tmp_path_factory.mktemp("gpu-search-index"), seed=4, clusters=12, spread=2, dim=DIM, rows=ROWS,
                   queries=QUERIES)
    return {**d, "store": pruned_store(d["dir"] / "s.knn", d["x"], k=32, degree=24, shard_rows=1100)}


@pytest.fixture
def counts(monkeypatch) -> dict:
    """Search-graph loads and device uploads, each call recorded."""
    return {"loads": count_calls(monkeypatch, search_index, "load_index"),
            "uploads": count_calls(monkeypatch, cuda_search, "_upload")}


def test_a_second_search_reuses_the_device_copy_and_finds_what_a_fresh_load_finds(cuda_backend, data, counts):
    q = data["q"]
    with bigknn.open(data["store"]) as g:
        first = g.search(q, k=10, budget=64, backend="cuda")
        second = g.search(q, k=10, budget=64, backend="cuda")
        singles = [g.search(row, k=10, budget=64, backend="cuda").ids for row in q[:10]]
        assert (len(counts["loads"]), len(counts["uploads"])) == (1, 1)
    with bigknn.open(data["store"]) as g, g.search_index(backend="cuda") as index:
        fresh = index.search(q, k=10, budget=64)
    assert (len(counts["loads"]), len(counts["uploads"])) == (2, 2)
    for found in (second, fresh):
        np.testing.assert_array_equal(found.ids, first.ids)
        np.testing.assert_array_equal(found.distances, first.distances)
    np.testing.assert_array_equal(np.concatenate(singles), first.ids[:10])


def test_close_gives_the_device_memory_back(cuda_backend, data):
    import cupy as cp

    pool = cp.get_default_memory_pool()
    with bigknn.open(data["store"]) as g:
        index = g.search_index(backend="cuda")
        index.search(data["q"], k=10)
        a = index.arrays
        index_bytes = a.rows * (a.vectors.shape[1] * 4 + a.ids.shape[1] * 5)  # float32 rows, int32 ids, uint8 factors
        used, held = pool.used_bytes(), pool.total_bytes()
        backend = index._backend
        index.close()
        del a
        assert backend._search_index.arrays == ()
        # let go: the pool can reuse the index's bytes at once; whether it hands them back to the driver depends on
        # whether other live arrays share their arena, so only "not grown" is asserted of the pool's total
        assert used - pool.used_bytes() >= index_bytes and pool.total_bytes() <= held
        g.search(data["q"], backend="cuda")
        slot_backend = g._search_slot._loaded._backend
    assert slot_backend._search_index.arrays == ()  # Graph.close() closed the index search kept


def test_threads_searching_at_once_find_what_one_thread_finds(cuda_backend, data):
    q = data["q"]
    with bigknn.open(data["store"]) as g, g.search_index(backend="cuda") as index:
        serial = [index.search(q[i::8], k=10).ids for i in range(8)] + [index.search(q[i], k=10).ids for i in range(8)]
        parallel: list = [None] * 16
        start = threading.Barrier(16)

        def work(i: int) -> None:
            start.wait()
            parallel[i] = index.search(q[i::8], k=10).ids if i < 8 else g.search(q[i - 8], k=10, backend="cuda").ids

        threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for want, got in zip(serial, parallel):
        np.testing.assert_array_equal(got, want)


def test_a_query_file_streams_through_in_batches_with_the_results_of_one_search(cuda_backend, data, monkeypatch,
                                                                                 tmp_path):
    monkeypatch.setattr(stream, "READ_ROWS", 64)
    with bigknn.open(data["store"]) as g, g.search_index(backend="cuda") as index:
        whole = index.search(data["q"], k=10, batch=7)
        index.search_file(data["dir"] / "q.fbin", tmp_path / "found.ibin", k=10, batch=7)
    ids, dists = read_truth(tmp_path / "found.ibin")
    np.testing.assert_array_equal(ids, whole.ids)
    np.testing.assert_array_equal(dists, whole.distances)
