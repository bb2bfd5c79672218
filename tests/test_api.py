"""The Python API (bigknn.build / bigknn.open / Graph): arrays in, true distances out, scipy CSR, UMAP's
precomputed_knn layout, export by file name, ingest and recall, temporary stores cleaned up."""

from __future__ import annotations

import json
import tempfile

import numpy as np
import pytest
import scipy.sparse

import bigknn
from bigknn.core.synth import synth

from conftest import read_manifest, recall_at, run_cli, write_synth

ROWS, DIM, K, SHARD_ROWS = 3000, 16, 10, 1000  # three shards: GNND on each, then three GGM merges


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One multi-shard build from an in-memory float64 array into a kept store."""
    d = tmp_path_factory.mktemp("api")
    x = synth(ROWS, DIM, seed=3).astype(np.float64)
    g = bigknn.build(x, k=K, store=d / "s.knn", backend="cpu", shard_rows=SHARD_ROWS)
    return {"graph": g, "x": x, "store": d / "s.knn"}


def true_l2(x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    xd = np.asarray(x, np.float64)
    return np.sqrt(((xd[:, None, :] - xd[ids]) ** 2).sum(-1))


def test_build_gives_the_knn_graph_of_an_array_with_euclidean_distances(built):
    g, x = built["graph"], built["x"]
    ids, dist = g.neighbors()
    assert ids.shape == dist.shape == (ROWS, K) and ids.dtype == np.int32 and dist.dtype == np.float32
    assert not np.any(ids == np.arange(ROWS)[:, None]), "self listed without include_self"
    assert np.all(np.diff(dist, axis=1) >= 0), "distances not ascending"
    np.testing.assert_allclose(dist, true_l2(x, ids), rtol=1e-4, atol=1e-4)
    assert recall_at(ids, x, np.arange(ROWS), K) >= 0.97
    assert g.report.shards == 3 and g.report.merges_done == 3 and not g.report.resumed
    assert g.info.dtype == "<f4", "a float64 array is built as float32, what the backends compute in"


def test_open_reads_the_build_and_its_recall_estimate(built):
    g = bigknn.open(built["store"])
    assert g.report is None
    np.testing.assert_array_equal(g.neighbors().ids, built["graph"].neighbors().ids)
    info = g.info
    assert (info.rows, info.dim, info.k, info.metric, info.complete) == (ROWS, DIM, K, "l2", True)
    est = read_manifest(built["store"])["estimate"]
    assert info.recall_estimate == bigknn.RecallEstimate(**est)
    assert info.recall_estimate.target == 0.99 and info.recall_estimate.recall >= 0.99  # held out: low may be below
    assert info.to_dict()["recall_estimate"] == est


def test_neighbors_k_and_include_self(built):
    g = built["graph"]
    ids, dist = g.neighbors()
    ids3, dist3 = g.neighbors(k=3)
    np.testing.assert_array_equal(ids3, ids[:, :3])
    sids, sdist = g.neighbors(k=3, include_self=True)
    assert sids.shape == (ROWS, 4)
    np.testing.assert_array_equal(sids[:, 0], np.arange(ROWS))
    assert np.all(sdist[:, 0] == 0)
    np.testing.assert_array_equal(sids[:, 1:], ids3)
    np.testing.assert_array_equal(sdist[:, 1:], dist3)
    for bad in (0, K + 1):
        with pytest.raises(bigknn.BadInput, match="outside"):
            g.neighbors(k=bad)


def test_recall_is_a_typed_report(built):
    r = built["graph"].recall(sample=500, k=5, backend="cpu", seed=1)
    assert isinstance(r, bigknn.RecallReport)
    assert (r.sample, r.k, r.truth, r.backend) == (500, 5, "exact", "cpu")
    rows = np.sort(np.random.default_rng(1).choice(ROWS, 500, replace=False))
    mine = recall_at(built["graph"].neighbors().ids[rows], built["x"], rows, 5)
    assert abs(r.recall - mine) <= 1e-3


@pytest.mark.parametrize("metric", ["ip", "cosine"])
def test_ip_and_cosine_are_ascending_distances(metric):
    x = synth(1500, 8, seed=4)  # one shard, an exact graph: lists and values are checked against NumPy
    with bigknn.build(x, k=5, metric=metric, backend="cpu") as g:
        ids, dist = g.neighbors()
    xd = x.astype(np.float64)
    if metric == "cosine":
        xd /= np.linalg.norm(xd, axis=1, keepdims=True)
    want = 1.0 - np.einsum("ij,ikj->ik", xd, xd[ids])
    assert recall_at(ids, xd, np.arange(len(x)), 5, "ip") == 1.0, "not the largest inner products"
    assert np.all(np.diff(dist, axis=1) >= -1e-6), "distances not ascending"
    np.testing.assert_allclose(dist, want, rtol=1e-4, atol=1e-4)
    if metric == "ip":
        assert dist.min() < 0, "rows longer than 1 give negative ip distances (documented)"


def duplicated_rows() -> np.ndarray:
    x = synth(600, 8, seed=6)
    x[300:310] = x[:10]  # rows 300.. repeat rows 0..: their nearest neighbour is at distance 0
    return x


def test_to_scipy_keeps_zero_distances_as_explicit_entries():
    x = duplicated_rows()
    with bigknn.build(x, k=4, backend="cpu") as g:
        ids, dist = g.neighbors()
        m = g.to_scipy()
        ms = g.to_scipy(k=2, include_self=True)
    assert isinstance(m, scipy.sparse.csr_matrix) and m.shape == (600, 600)
    assert m.nnz == 600 * 4 and np.all(np.diff(m.indptr) == 4), "a zero distance was dropped"
    assert (m.data == 0).sum() == 20  # each of the 10 pairs, both ways
    for i in range(10):
        assert ids[i, 0] == 300 + i and ids[300 + i, 0] == i and dist[i, 0] == 0
    np.testing.assert_array_equal(m.indices.reshape(600, 4), ids)  # each row nearest first, as sklearn's
    np.testing.assert_array_equal(m.data.reshape(600, 4), dist)
    assert ms.nnz == 600 * 3 and np.all(ms.diagonal() == 0)
    np.testing.assert_array_equal(ms.indices.reshape(600, 3)[:, 0], np.arange(600))


def test_umap_knn_has_self_first_at_zero_then_the_neighbours(built):
    g = built["graph"]
    knn_ids, knn_dist = g.umap_knn(n_neighbors=5)
    ids, dist = g.neighbors(k=4)
    np.testing.assert_array_equal(knn_ids[:, 0], np.arange(ROWS))
    assert np.all(knn_dist[:, 0] == 0)
    np.testing.assert_array_equal(knn_ids[:, 1:], ids)
    np.testing.assert_array_equal(knn_dist[:, 1:], dist)
    assert g.umap_knn().ids.shape == (ROWS, K + 1)
    with pytest.raises(ValueError, match="n_neighbors"):
        g.umap_knn(K + 2)


def test_exact_neighbors_of_new_rows(built):
    g, x = built["graph"], built["x"]
    q = synth(50, DIM, seed=11)
    ids, dist = g.exact_neighbors(q, k=7, backend="cpu")
    d = np.sqrt(((q[:, None, :].astype(np.float64) - x[None]) ** 2).sum(-1))
    np.testing.assert_array_equal(ids, np.argsort(d, axis=1)[:, :7])
    np.testing.assert_allclose(dist, np.sort(d, axis=1)[:, :7], rtol=1e-4, atol=1e-4)


def test_export_format_follows_the_file_name(built, tmp_path):
    g = built["graph"]
    ids, dist = g.neighbors()
    r = g.export(tmp_path / "g.npz")
    assert r.format == "npz" and r.files == [str(tmp_path / "g.npz")]
    loaded = scipy.sparse.load_npz(tmp_path / "g.npz")
    assert (loaded != g.to_scipy()).nnz == 0 and loaded.nnz == ROWS * K
    r = g.export(tmp_path / "g.npy", include_self=True)
    assert r.format == "npy" and r.include_self
    np.testing.assert_array_equal(np.load(tmp_path / "g.npy"), g.neighbors(include_self=True).ids)
    np.testing.assert_array_equal(np.load(tmp_path / "g.dists.npy"), g.neighbors(include_self=True).distances)
    with pytest.raises(bigknn.BadInput, match="unknown export format"):
        g.export(tmp_path / "g.csv")
    assert not (tmp_path / "g.csv").exists()


def test_cli_export_npz_with_self_and_format_from_the_name(built, tmp_path):
    code, out, err = run_cli("export", built["store"], "-o", tmp_path / "g.npz", "--include-self", "--json")
    assert code == 0, err
    assert json.loads(out)["format"] == "npz"
    m = scipy.sparse.load_npz(tmp_path / "g.npz")
    assert m.nnz == ROWS * (K + 1) and np.all(m.diagonal() == 0)
    assert (m != built["graph"].to_scipy(include_self=True)).nnz == 0
    code, out, err = run_cli("export", built["store"], "-o", tmp_path / "g.ibin", "--format", "npz")
    assert code == 2 and "g.ibin" in err and not (tmp_path / "g.ibin").exists()


def test_a_temporary_store_is_removed_on_close(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    g = bigknn.build(synth(300, 4, seed=1), k=3, backend="cpu")
    assert g.path.is_dir() and g.path.parent.parent == tmp_path
    assert [p.name for p in g.path.parent.iterdir()] == [g.path.name], "the spilled array outlived the build"
    g.close()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="closed"):
        g.neighbors()


class Wrapped:
    """Something that is not an array but converts to one (a framework tensor, say)."""

    def __init__(self, x: np.ndarray):
        self.x = x

    def __array__(self, dtype=None, copy=None):
        return self.x


def test_array_likes_and_files_give_the_same_graph(tmp_path):
    x = synth(800, 6, seed=2)
    write_synth(tmp_path / "x.fbin", 800, 6, seed=2)
    graphs = [bigknn.build(data, k=4, backend="cpu") for data in (x, x.tolist(), Wrapped(x), tmp_path / "x.fbin")]
    first = graphs[0].neighbors()
    for g in graphs[1:]:
        np.testing.assert_array_equal(g.neighbors().ids, first.ids)
    assert graphs[3].info.inputs == [str(tmp_path / "x.fbin")]
    for g in graphs:
        g.close()


def test_an_array_is_spilled_block_by_block_exactly(tmp_path, monkeypatch):
    """The scratch .npy a build streams holds the array's values, cast where the dtype is not kept, whatever the
    blocks its threads write (here 7 rows a block, the last one short)."""
    import bigknn.operations.input_arrays as arrays

    monkeypatch.setattr(arrays, "SPILL_ROWS", 7)
    x = synth(101, 5, seed=3)
    for data, want in ((x, x), (x.astype(np.float64)[:, ::-1], x[:, ::-1]), (x.astype(np.float16), None)):
        got = np.load(arrays.spill(data, tmp_path / f"{data.dtype}-{id(data)}.npy"))
        np.testing.assert_array_equal(got, data.astype(got.dtype) if want is None else want)
        assert got.dtype == (np.float16 if data.dtype == np.float16 else np.float32)


def test_bad_arrays_are_refused_naming_the_problem(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    x = synth(400, 4, seed=1)
    x[123, 2] = np.nan
    with pytest.raises(bigknn.BadInput, match="array: row 123 holds NaN or Inf"):
        bigknn.build(x, k=3, backend="cpu")
    with pytest.raises(bigknn.BadInput, match=r"array: has shape \(400,\)"):
        bigknn.build(x[:, 0], k=3, backend="cpu")
    with pytest.raises(bigknn.BadInput, match="^array: k = 3 needs more than 3 rows"):
        bigknn.build(x[:3, :], k=3, backend="cpu")
    with pytest.raises(ValueError, match="unknown metric"):
        bigknn.build(x, metric="hamming")
    assert list(tmp_path.iterdir()) == [], "a refused build left files behind"


def test_an_array_is_never_built_into_an_existing_store(built):
    before = read_manifest(built["store"])
    with pytest.raises(bigknn.BadInput, match="exists"):
        bigknn.build(built["x"], k=K, store=built["store"], backend="cpu")
    assert read_manifest(built["store"]) == before


def test_a_file_build_reruns_as_a_resume(tmp_path):
    write_synth(tmp_path / "x.fbin", 700, 6, seed=8)
    first = bigknn.build(tmp_path / "x.fbin", k=4, store=tmp_path / "s.knn", backend="cpu")
    again = bigknn.build(str(tmp_path / "x.fbin"), k=4, store=tmp_path / "s.knn", backend="cpu")
    assert not first.report.resumed and again.report.resumed
    np.testing.assert_array_equal(first.neighbors().ids, again.neighbors().ids)


def test_ingest_an_array(tmp_path):
    x = synth(1600, 8, seed=9)
    g = bigknn.build(x[:1200], k=5, store=tmp_path / "s.knn", backend="cpu")
    r = g.ingest(x[1200:], backend="cpu")
    assert isinstance(r, bigknn.IngestReport) and (r.rows_added, r.rows) == (400, 1600)
    ids, _ = g.neighbors()
    assert ids.shape == (1600, 5)
    assert recall_at(ids, x, np.arange(1600), 5) >= 0.95
    assert bigknn.open(tmp_path / "s.knn").info.rows == 1600
    again = g.ingest(x[1200:], backend="cpu")
    assert again.rows_added == 0 and len(again.skipped) == 1, "the same rows were ingested twice"
