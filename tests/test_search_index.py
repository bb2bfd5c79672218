"""A loaded search index (``Graph.search_index``, the one ``Graph.search`` keeps) on the CPU: loaded once and
searched many times with the results of a fresh load, freed by ``close()``, shared by threads, and a query file
streamed through it in batches (``bigknn search``) with the results of one search of the whole set.
tests/test_gpu_search_index.py mirrors these on the CUDA backend."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

import bigknn
import bigknn.operations.loaded_index as search_index
import bigknn.operations.search_stream as stream
from bigknn.core.errors import BadInput
from bigknn.formats import read_truth, write_vectors

from conftest import count_calls, pruned_store, run_json, search_set

ROWS, QUERIES, DIM = 1500, 60, 12


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    d = search_set(tmp_path_factory.mktemp("search-index"), seed=3, clusters=10, spread=2, dim=DIM, rows=ROWS,
                   queries=QUERIES)
    return {**d, "store": pruned_store(d["dir"] / "s.knn", d["x"], k=16, degree=16, shard_rows=700)}


@pytest.fixture
def loads(monkeypatch) -> list:
    """Every search-graph load a loaded index makes, counted."""
    return count_calls(monkeypatch, search_index, "load_index")


def test_a_second_search_reuses_the_loaded_index_and_finds_what_a_fresh_load_finds(data, loads):
    q = data["q"]
    with bigknn.open(data["store"]) as g:
        first = g.search(q, k=10, budget=32, backend="cpu")
        second = g.search(q, k=10, budget=32, backend="cpu")
        other_knobs = g.search(q[:5], k=5, budget=16, batch=2, backend="cpu")
        assert len(loads) == 1
    with bigknn.open(data["store"]) as fresh:
        again = fresh.search(q, k=10, budget=32, backend="cpu")
        with fresh.search_index(backend="cpu") as index:
            explicit = index.search(q, k=10, budget=32)
            one_by_one = [index.search(row, k=10, budget=32) for row in q[:8]]
    assert len(loads) == 3
    for found in (second, again, explicit):
        np.testing.assert_array_equal(found.ids, first.ids)
        np.testing.assert_array_equal(found.distances, first.distances)
    np.testing.assert_array_equal(np.concatenate([f.ids for f in one_by_one]), first.ids[:8])
    np.testing.assert_array_equal(other_knobs.ids, fresh_ids(data, q[:5], k=5, budget=16))


def fresh_ids(data, q, **knobs) -> np.ndarray:
    with bigknn.open(data["store"]) as g, g.search_index(backend="cpu") as index:
        return index.search(q, **knobs).ids


def test_a_new_search_graph_or_other_options_load_anew(data, loads, tmp_path):
    import shutil

    store = tmp_path / "s.knn"
    shutil.copytree(data["store"], store)
    with bigknn.open(store) as g:
        g.search(data["q"], k=10, budget=32, backend="cpu")
        g.search(data["q"], k=10, budget=32, backend="cpu", gpu_mem=1 << 30)  # other options: another load
        g.prune("rng", degree=8, backend="cpu")
        g.search(data["q"], k=10, budget=32, backend="cpu")
        assert len(loads) == 3
        kept = g._search_slot._loaded
        assert kept.entry.method == "rng" and kept.arrays.ids.shape[1] == 8  # the new graph, not the old index


def test_close_frees_the_index(data, monkeypatch):
    forgotten: list = []
    with bigknn.open(data["store"]) as g:
        index = g.search_index(backend="cpu")
        arrays = weakref.ref(index.arrays)
        monkeypatch.setattr(type(index._backend), "forget_index", lambda self, i: forgotten.append(i.rows))
        index.close()
        gc.collect()
        assert arrays() is None and index.closed and len(forgotten) == 1
        with pytest.raises(ValueError, match="closed"):
            index.search(data["q"])
        g.search(data["q"], backend="cpu")
        kept = weakref.ref(g._search_slot._loaded.arrays)
    gc.collect()
    assert kept() is None and len(forgotten) == 2  # Graph.close() closed the index search kept


@pytest.mark.parametrize("through", ["index", "graph"])
def test_threads_searching_at_once_find_what_one_thread_finds(data, through):
    q = data["q"]
    with bigknn.open(data["store"]) as g, g.search_index(backend="cpu") as index:
        search = index.search if through == "index" else (lambda qq, **kw: g.search(qq, backend="cpu", **kw))
        serial = [search(q[i::6], k=10, budget=24).ids for i in range(6)] + [search(q[i], k=10).ids for i in range(6)]
        parallel: list = [None] * 12
        start = threading.Barrier(12)

        def work(i: int) -> None:
            start.wait()
            parallel[i] = search(q[i::6], k=10, budget=24).ids if i < 6 else search(q[i - 6], k=10).ids

        threads = [threading.Thread(target=work, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for want, got in zip(serial, parallel):
        np.testing.assert_array_equal(got, want)


def test_a_query_file_streams_through_in_batches_with_the_results_of_one_search(data, monkeypatch, tmp_path):
    monkeypatch.setattr(stream, "READ_ROWS", 16)  # several reads of several batches, the last one short
    with bigknn.open(data["store"]) as g, g.search_index(backend="cpu") as index:
        whole = index.search(data["q"], k=10, budget=32)
        report = index.search_file(data["dir"] / "q.fbin", tmp_path / "found.ibin", k=10, budget=32, batch=5)
        via_graph = g.search(data["q"], k=10, budget=32, backend="cpu", out=tmp_path / "graph.ibin")
    ids, dists = read_truth(tmp_path / "found.ibin")
    np.testing.assert_array_equal(ids, whole.ids)
    np.testing.assert_array_equal(dists, whole.distances)
    np.testing.assert_array_equal(read_truth(tmp_path / "graph.ibin")[0], whole.ids)
    assert via_graph.report.out == str(tmp_path / "graph.ibin")
    assert report.queries == QUERIES and report.batch == 5 and report.wall_s >= report.search_s > 0
    cli = run_json("search", data["store"], "--queries", data["dir"] / "q.fbin", "-o", tmp_path / "cli.ibin",
                   "--budget", "32", "--batch", "7", "--backend", "cpu")
    np.testing.assert_array_equal(read_truth(tmp_path / "cli.ibin")[0], whole.ids)
    assert cli["queries"] == QUERIES and cli["batch"] == 7 and cli["out"] == str(tmp_path / "cli.ibin")


def test_the_next_block_of_queries_is_read_while_this_one_is_searched(data, monkeypatch, tmp_path):
    """The first block's search waits until the second block's read has begun: without the read ahead it never
    would (the wait gives up after a minute and the test fails)."""
    from bigknn.formats.read import VectorFile

    monkeypatch.setattr(stream, "READ_ROWS", 16)
    second_read = threading.Event()
    real_read = VectorFile.read

    def read(self, start, stop):
        if start == 16:
            second_read.set()
        return real_read(self, start, stop)

    monkeypatch.setattr(VectorFile, "read", read)
    waited = []
    with bigknn.open(data["store"]) as g, g.search_index(backend="cpu") as index:
        whole = index.search(data["q"], k=10, budget=32)
        real_search = index.search_rows

        def search(q, *args):
            if not waited:
                waited.append(second_read.wait(timeout=60))
            return real_search(q, *args)

        monkeypatch.setattr(index, "search_rows", search)
        index.search_file(data["dir"] / "q.fbin", tmp_path / "found.ibin", k=10, budget=32, batch=16)
    assert waited == [True]
    np.testing.assert_array_equal(read_truth(tmp_path / "found.ibin")[0], whole.ids)


def test_a_bad_row_late_in_the_file_leaves_nothing_written(data, monkeypatch, tmp_path):
    monkeypatch.setattr(stream, "READ_ROWS", 16)
    q = data["q"].copy()
    q[50, 3] = np.nan
    write_vectors(tmp_path / "bad.fbin", q)
    with bigknn.open(data["store"]) as g, g.search_index(backend="cpu") as index:
        with pytest.raises(BadInput, match=r"bad\.fbin: row 50 holds NaN"):
            index.search_file(tmp_path / "bad.fbin", tmp_path / "found.ibin", batch=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.fbin"]


@pytest.mark.parametrize("source", ["array", "file"])
def test_a_bad_query_in_a_later_batch_is_named_by_its_row(data, tmp_path, source):
    q = data["q"].copy()
    q[37, 1] = np.inf
    write_vectors(tmp_path / "bad.fbin", q)
    given, name = (q, "queries") if source == "array" else (tmp_path / "bad.fbin", str(tmp_path / "bad.fbin"))
    with bigknn.open(data["store"]) as g:
        with pytest.raises(BadInput, match=f"^{name}: row 37 holds NaN or Inf"):
            g.search(given, k=10, batch=16, backend="cpu")


def test_the_sweep_times_one_loaded_index(data, loads, tmp_path):
    with bigknn.open(data["store"]) as g:
        g.truth(data["q"], tmp_path / "gt.ibin", backend="cpu")
        sweep = g.search_sweep(data["q"], tmp_path / "gt.ibin", budgets=[10, 32], backend="cpu")
    assert len(loads) == 1 and [p.budget for p in sweep.points] == [10, 32]
    assert sweep.points[1].recall >= sweep.points[0].recall and sweep.points[1].recall >= 0.9


def test_a_query_file_is_checked_before_the_index_loads(data, loads, tmp_path):
    write_vectors(tmp_path / "q5.fbin", np.zeros((3, 5), np.float32))
    with bigknn.open(data["store"]) as g:
        with pytest.raises(BadInput, match="dim 5"):
            g.search_file(tmp_path / "q5.fbin", tmp_path / "o.ibin", backend="cpu")
        with pytest.raises(BadInput, match="--k 40"):
            g.search_file(data["dir"] / "q.fbin", tmp_path / "o.ibin", k=40, backend="cpu")
        report = g.search_file(data["dir"] / "q.fbin", tmp_path / "o.ibin", budget=32, batch=9, backend="cpu")
    assert len(loads) == 1 and report.queries == QUERIES
    np.testing.assert_array_equal(read_truth(tmp_path / "o.ibin")[0], fresh_ids(data, data["q"], budget=32))


def test_an_ingest_frees_the_kept_index_and_search_then_asks_for_a_prune(data, tmp_path):
    import shutil

    store = tmp_path / "s.knn"
    shutil.copytree(data["store"], store)
    with bigknn.open(store) as g:
        g.search(data["q"], backend="cpu")
        kept = weakref.ref(g._search_slot._loaded.arrays)
        g.ingest(data["q"], backend="cpu")
        gc.collect()
        assert kept() is None
        with pytest.raises(BadInput, match="bigknn prune"):
            g.search(data["q"], backend="cpu")
