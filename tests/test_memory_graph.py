"""Arrays that fit one shard are built in memory (bigknn/operations/build_in_memory.py, bigknn/memory_graph.py): no
spill, no store, no graph write; the same lists and estimate as the store path; every Graph method works."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
import scipy.sparse

import bigknn
from bigknn.operations import input_arrays as arrays
from bigknn.api import DEFAULTS
from bigknn.formats import file_sha256, open_vectors, read_truth, write_vectors
from bigknn.memory_graph import InMemoryGraph
from bigknn.shards import Store
from bigknn.core.synth import synth

K = 10
ROWS = 3000


def exact_top(x: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """Exact l2 top-k of ``rows`` among all of ``x``, self left out."""
    d = ((x[rows, None, :] - x[None, :, :]) ** 2).sum(axis=2)
    d[np.arange(len(rows)), rows] = np.inf
    return np.argsort(d, axis=1, kind="stable")[:, :k]


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return synth(ROWS, 16, seed=5)


@pytest.fixture(scope="module")
def graph(x):
    g = bigknn.build(x, k=K, backend="cpu", seed=3)
    yield g
    g.close()


def test_an_array_that_fits_writes_nothing(x, tmp_path, tmp_path_factory, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the in-memory build wrote a store or spilled the array")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(arrays, "spill", refuse)
    monkeypatch.setattr(Store, "create", refuse)
    g = bigknn.build(x, k=K, backend="cpu", seed=3)
    assert isinstance(g, InMemoryGraph)
    ids, dists = g.neighbors()
    info = g.info
    assert ids.shape == (ROWS, K) and info.store is None and info.disk_bytes == 0 and info.complete
    assert g.report.written_gb == 0.0 and g.report.store is None
    out = tmp_path_factory.mktemp("exports")
    for name in ("g.npy", "g.ibin", "g.npz"):
        assert g.export(out / name, include_self=name == "g.npz").store is None
    np.testing.assert_array_equal(np.load(out / "g.npy"), ids)
    np.testing.assert_array_equal(np.load(out / "g.dists.npy"), dists)
    np.testing.assert_array_equal(read_truth(out / "g.ibin")[0][:], ids)
    assert (scipy.sparse.load_npz(out / "g.npz") != g.to_scipy(include_self=True)).nnz == 0
    assert list(tmp_path.iterdir()) == [], "the in-memory build left files behind"


def test_the_same_lists_and_estimate_as_the_store_path(x, graph, tmp_path):
    stored = bigknn.build(x, k=K, backend="cpu", seed=3, store=tmp_path / "s.knn")
    assert not isinstance(stored, InMemoryGraph) and (tmp_path / "s.knn" / "manifest.json").is_file()
    np.testing.assert_array_equal(graph.neighbors().ids, stored.neighbors().ids)
    np.testing.assert_array_equal(graph.neighbors().distances, stored.neighbors().distances)
    assert graph.info.recall_estimate == stored.info.recall_estimate
    assert graph.report.recall_estimate == stored.report.recall_estimate
    stored.close()


def test_recall_meets_the_target_by_an_exact_check(x, graph):
    rows = np.random.default_rng(0).choice(ROWS, 600, replace=False)
    ids = graph.neighbors().ids[rows]
    truth = exact_top(x, rows, K)
    recall = np.mean([len(set(a) & set(b)) / K for a, b in zip(ids.tolist(), truth.tolist())])
    est = graph.info.recall_estimate
    assert recall >= est.target == DEFAULTS.recall
    assert est.rows > 0 and est.low <= est.recall <= est.high


def test_readers_answer_from_the_arrays(graph):
    ids, dists = graph.neighbors()
    assert (np.diff(dists, axis=1) >= 0).all() and not (ids == np.arange(ROWS)[:, None]).any()
    five = graph.neighbors(k=5, include_self=True)
    np.testing.assert_array_equal(five.ids[:, 0], np.arange(ROWS))
    np.testing.assert_array_equal(five.ids[:, 1:], ids[:, :5])
    m = graph.to_scipy()
    assert m.shape == (ROWS, ROWS) and m.nnz == ROWS * K
    np.testing.assert_array_equal(m.indices.reshape(ROWS, K), ids)
    knn = graph.umap_knn(n_neighbors=8)
    assert knn.ids.shape == (ROWS, 8) and float(knn.distances[:, 0].max()) == 0.0
    with pytest.raises(ValueError, match="n_neighbors must be 2..11"):
        graph.umap_knn(n_neighbors=12)
    degrees = graph.in_degrees()
    np.testing.assert_array_equal(degrees, np.bincount(ids.ravel(), minlength=ROWS))
    ids[:] = -5  # a copy: the graph is untouched
    assert (graph.neighbors().ids >= 0).all()


def test_save_makes_the_store_open_reads(graph, tmp_path):
    path = graph.save(tmp_path / "kept.knn")
    opened = bigknn.open(path)
    np.testing.assert_array_equal(opened.neighbors().ids, graph.neighbors().ids)
    np.testing.assert_array_equal(opened.neighbors().distances, graph.neighbors().distances)
    assert opened.info.recall_estimate == graph.info.recall_estimate and opened.info.complete
    with pytest.raises(bigknn.BadInput):
        graph.save(tmp_path / "kept.knn")  # never over another store


def test_store_methods_run_on_a_private_store(x):
    with bigknn.build(x, k=K, backend="cpu", seed=3) as g:
        ids, dists = g.neighbors()
        r = g.recall(sample=300, backend="cpu")
        assert r.recall >= 0.95 and g.info.store is None  # the arrays still answer info
        assert g.exact_neighbors(x[:20], k=1, backend="cpu").ids[:, 0].tolist() == list(range(20))
        g.prune(degree=8, backend="cpu")
        found = g.search(x[:50], k=1, backend="cpu")
        assert (found.ids[:, 0] == np.arange(50)).mean() >= 0.9
        private = g.path
        assert private.is_dir()
    assert not private.exists(), "the private store outlived close()"


def test_an_ingest_moves_the_graph_to_its_store(x):
    with bigknn.build(x[:2000], k=K, backend="cpu", seed=3) as g:
        g.ingest(x[2000:], backend="cpu")
        ids, _ = g.neighbors()
        assert ids.shape == (ROWS, K) and g.info.rows == ROWS and g.info.store is not None
        with pytest.raises(ValueError, match="grown past its arrays"):
            g.save("unused.knn")


def test_an_array_past_one_shard_takes_the_store_path(x):
    with bigknn.build(x, k=K, backend="cpu", shard_rows=1000) as g:
        assert not isinstance(g, InMemoryGraph) and g.info.shards == 3 and g.info.disk_bytes > 0


def test_dtypes_are_kept_as_a_store_keeps_them(x, graph, tmp_path):
    with bigknn.build(x.astype(np.float64), k=K, backend="cpu", seed=3) as g:
        assert g.info.dtype == "<f4"
        np.testing.assert_array_equal(g.neighbors().ids, graph.neighbors().ids)
    u8 = np.random.default_rng(1).integers(0, 255, size=(1500, 8), dtype=np.uint8)
    for metric in ("l2", "cosine"):
        with bigknn.build(u8, k=4, metric=metric, backend="cpu") as g, \
                bigknn.build(u8, k=4, metric=metric, backend="cpu", store=tmp_path / f"{metric}.knn") as stored:
            assert isinstance(g, InMemoryGraph) and g.info.dtype == stored.info.dtype
            np.testing.assert_array_equal(g.neighbors().ids, stored.neighbors().ids)
            np.testing.assert_array_equal(g.neighbors().distances, stored.neighbors().distances)


def test_bad_rows_are_refused_naming_the_array(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    y = synth(400, 4, seed=1)
    y[123, 2] = np.inf
    with pytest.raises(bigknn.BadInput, match="array: row 123 holds NaN or Inf"):
        bigknn.build(y, k=3, backend="cpu")
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_fits_is_read_once_and_built_in_memory(x, graph, tmp_path, monkeypatch):
    """A file whose rows make one shard, built without a store, is read once and built as its array is: no
    store written, the same lists, the file named in ``info.inputs``. ``save`` records its sha256, so an
    ingest of the same file into the saved store skips it; a file changed since the build keeps none."""
    path = tmp_path / "x.fbin"
    write_vectors(path, x)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    real_create = Store.create
    monkeypatch.setattr(Store, "create", lambda *a, **kw: pytest.fail("the in-memory build wrote a store"))
    with bigknn.build(path, k=K, backend="cpu", seed=3) as g:
        assert isinstance(g, InMemoryGraph) and g.info.inputs == [str(path.resolve())]
        assert g.report.written_gb == 0.0 and g.report.store is None and list(scratch.iterdir()) == []
        np.testing.assert_array_equal(g.neighbors().ids, graph.neighbors().ids)
        monkeypatch.setattr(Store, "create", real_create)
        saved = g.save(tmp_path / "saved.knn")
    m = Store.open(saved).manifest
    assert [i["sha256"] for i in m.inputs] == [file_sha256(open_vectors(path))]
    assert bigknn.open(saved).ingest(path, backend="cpu").skipped == [str(path)]
    with bigknn.build(path, k=K, backend="cpu", seed=3) as g:
        write_vectors(path, x[:-1])  # the file changes after it was read (its size too: mtimes can be coarse)
        assert Store.open(g.save(tmp_path / "changed.knn")).manifest.inputs[0]["sha256"] is None


def test_an_in_memory_build_on_several_workers_runs_one_gnnd_across_them(x, graph, tmp_path, monkeypatch):
    """Rows that make one shard on several GPUs are built by one GNND spanning them (Backend.spanning), as a store
    build's one-shard plan is, not on the first GPU alone; an array and a file alike. Stand-ins: CPU backends
    whose ``spanning`` gives a backend that records its calls."""
    from bigknn.backends.cpu import CpuBackend

    calls = []

    class Wide(CpuBackend):
        def gnnd(self, *args, **kwargs):
            calls.append("wide")
            return super().gnnd(*args, **kwargs)

    class Worker(CpuBackend):
        def spanning(self, others):
            return Wide()

        def gnnd(self, *args, **kwargs):
            calls.append("one")
            return super().gnnd(*args, **kwargs)

    monkeypatch.setattr(bigknn.api, "get_backends", lambda *args: [Worker(), Worker()])
    path = tmp_path / "x.fbin"
    write_vectors(path, x)
    for data in (x, path):
        calls.clear()
        with bigknn.build(data, k=K, seed=3) as g:
            assert isinstance(g, InMemoryGraph) and calls == ["wide"]
            np.testing.assert_array_equal(g.neighbors().ids, graph.neighbors().ids)


def test_bad_rows_of_a_file_are_refused_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    y = synth(400, 4, seed=1)
    y[123, 2] = np.nan
    path = tmp_path / "bad.fbin"
    write_vectors(path, y)
    with pytest.raises(bigknn.BadInput, match=f"{path}: row 123 holds NaN or Inf"):
        bigknn.build(path, k=3, backend="cpu")
    assert list(tmp_path.iterdir()) == [path]


@pytest.mark.gpu
@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_a_gpu_build_of_an_array_is_in_memory(cuda_backend, metric, tmp_path, monkeypatch):
    """The CUDA backend's in-memory build writes nothing and matches the store path's recall."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    y = synth(200_000, 48, seed=2)
    g = bigknn.build(y, k=K, metric=metric, backend="cuda", seed=4)
    assert isinstance(g, InMemoryGraph) and g.report.backend == "cuda" and list(tmp_path.iterdir()) == []
    stored = bigknn.build(y, k=K, metric=metric, backend="cuda", seed=4, store=tmp_path / "s.knn")
    got, want = g.recall(sample=5000, backend="cuda").recall, stored.recall(sample=5000, backend="cuda").recall
    est = g.info.recall_estimate
    assert got >= DEFAULTS.recall - 0.005 and abs(got - want) < 0.005 and est.target == DEFAULTS.recall
    g.close()
    stored.close()
