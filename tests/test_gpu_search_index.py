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
from bigknn.formats import read_truth, write_vectors

pytestmark = pytest.mark.gpu

ROWS, QUERIES, DIM = 3000, 200, 32


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("gpu-search-index")
    rng = np.random.default_rng(4)
    centres = rng.normal(size=(12, DIM)) * 2
    x = (centres[rng.integers(0, 12, ROWS)] + rng.normal(size=(ROWS, DIM))).astype(np.float32)
    q = (centres[rng.integers(0, 12, QUERIES)] + rng.normal(size=(QUERIES, DIM))).astype(np.float32)
    write_vectors(d / "q.fbin", q)
    with bigknn.build(x, k=32, store=d / "s.knn", backend="cpu", shard_rows=1100) as g:
        g.prune(degree=24, backend="cpu")
    return {"dir": d, "store": d / "s.knn", "q": q}


@pytest.fixture
def counts(monkeypatch) -> dict:
    """Search-graph loads and device uploads, counted."""
    seen = {"loads": 0, "uploads": 0}
    load, upload = search_index.load_index, cuda_search._upload

    def counted_load(*args, **kwargs):
        seen["loads"] += 1
        return load(*args, **kwargs)

    def counted_upload(*args, **kwargs):
        seen["uploads"] += 1
        return upload(*args, **kwargs)

    monkeypatch.setattr(search_index, "load_index", counted_load)
    monkeypatch.setattr(cuda_search, "_upload", counted_upload)
    return seen


def test_a_second_search_reuses_the_device_copy_and_finds_what_a_fresh_load_finds(cuda_backend, data, counts):
    q = data["q"]
    with bigknn.open(data["store"]) as g:
        first = g.search(q, k=10, budget=64, backend="cuda")
        second = g.search(q, k=10, budget=64, backend="cuda")
        singles = [g.search(row, k=10, budget=64, backend="cuda").ids for row in q[:10]]
        assert counts == {"loads": 1, "uploads": 1}
    with bigknn.open(data["store"]) as g, g.search_index(backend="cuda") as index:
        fresh = index.search(q, k=10, budget=64)
    assert counts == {"loads": 2, "uploads": 2}
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
