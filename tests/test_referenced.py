"""``bigknn build --vectors reference``: the store reads the input file's rows instead of copying them
(bigknn/shards/referenced.py); a changed or moved input is refused in one line, never read as other rows."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bigknn.backends.cpu import CpuBackend
from bigknn.formats import write_vectors
from bigknn.core.params import GnndParams
from bigknn.operations.build import BuildRequest, build
from bigknn.operations.verify import verify
from bigknn.core.progress import Reporter
from bigknn.shards import Store
from bigknn.shards.arrays import tree_bytes
from bigknn.core.synth import synth

from conftest import assert_one_line_error, run_cli, run_json

ROWS, DIM, K, SHARD_ROWS = 6000, 16, 10, 1500


def _build(data, store, vectors: str, **kw) -> dict:
    return build(BuildRequest(input=data, store=store, shard_rows=SHARD_ROWS, params=GnndParams(k=K), seed=2,
                              vectors=vectors, **kw), [CpuBackend()], Reporter())


def _graphs(path) -> list:
    s = Store.open(path)
    return [s.read_graph(sh.id) for sh in s.manifest.shards]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One input, built with a copy and with a reference (default checkpoint policy)."""
    d = tmp_path_factory.mktemp("referenced")
    data = d / "x.fbin"
    write_vectors(data, synth(ROWS, DIM, seed=8))
    old = os.environ.pop("BIGKNN_CHECKPOINT_S", None)
    try:
        copy, ref = _build(data, d / "copy.knn", "copy"), _build(data, d / "ref.knn", "reference")
    finally:
        if old is not None:
            os.environ["BIGKNN_CHECKPOINT_S"] = old
    return {"dir": d, "data": data, "copy": copy, "ref": ref}


def test_a_referenced_store_has_the_copied_stores_graph_and_no_vectors(built):
    d = built["dir"]
    assert built["ref"]["merges_done"] == built["copy"]["merges_done"] == 6
    for a, b in zip(_graphs(d / "ref.knn"), _graphs(d / "copy.knn")):  # one CPU worker: the same run
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.dists, b.dists)
    store = Store.open(d / "ref.knn")
    assert not any((d / "ref.knn" / "shards" / str(s.id) / "vectors").exists() for s in store.manifest.shards)
    np.testing.assert_array_equal(store.read_vectors(1), Store.open(d / "copy.knn").read_vectors(1))
    rows = np.array([0, 1499, 1500, 5999, 3000])
    np.testing.assert_array_equal(store.vectors_of(rows), Store.open(d / "copy.knn").vectors_of(rows))
    # disk beyond the input: the final graph (k wide) + 10 %, every byte written counted
    graph = ROWS * K * (4 + 4)
    on_disk = tree_bytes(d / "ref.knn") - tree_bytes(d / "ref.knn" / ".readers") - (d / "ref.knn" / ".lock").stat().st_size
    assert graph <= on_disk <= built["ref"]["written_bytes"] <= 1.1 * graph, (on_disk, built["ref"]["written_bytes"])


def test_readers_and_verify_work_on_a_referenced_store(built):
    d = built["dir"]
    rec = run_json("eval", "recall", d / "ref.knn", "--backend", "cpu", "--sample", 500)
    assert rec["recall"] >= 0.95
    assert run_json("verify", d / "ref.knn")["ok"] is True
    code, _, _ = run_cli("export", d / "ref.knn", "-o", d / "g.ibin")
    assert code == 0 and (d / "g.ibin").stat().st_size > 0


def test_prune_search_and_ingest_on_a_referenced_store(built, tmp_path):
    """Every reader of rows works on a referenced store; an ingest adds copied shards beside referenced ones."""
    import shutil

    store = tmp_path / "ref.knn"
    shutil.copytree(built["dir"] / "ref.knn", store)
    assert run_json("prune", store, "--backend", "cpu", "--degree", 8)["rows"] == ROWS
    queries = tmp_path / "q.fbin"
    write_vectors(queries, synth(ROWS + 50, DIM, seed=8)[ROWS:])
    code, _, err = run_cli("search", store, "--queries", queries, "-o", tmp_path / "hits.ibin", "--backend", "cpu",
                           "--k", 5)
    assert code == 0, err
    more = tmp_path / "more.fbin"
    write_vectors(more, synth(ROWS + 1500, DIM, seed=8)[ROWS:])
    run_json("ingest", store, "--input", more, "--backend", "cpu")
    m = Store.open(store).manifest
    assert [s.source is None for s in m.shards] == [False] * 4 + [True]
    assert run_json("eval", "recall", store, "--backend", "cpu", "--sample", 500)["recall"] >= 0.95
    assert run_json("verify", store)["ok"] is True


def test_a_changed_or_moved_input_is_refused(tmp_path):
    data = tmp_path / "x.fbin"
    write_vectors(data, synth(ROWS, DIM, seed=8))
    _build(data, tmp_path / "ref.knn", "reference")
    st = data.stat()
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF  # one byte changed in place, its size and mtime put back: only the sha256 tells
    data.write_bytes(bytes(raw))
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    report = verify(Store.open(tmp_path / "ref.knn"))
    assert not report["ok"] and str(data) in report["damaged"][0]["file"] and "sha256" in report["damaged"][0]["problem"]
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))  # modified: refused by every reader of rows
    code, out, err = run_cli("eval", "recall", tmp_path / "ref.knn", "--backend", "cpu", "--sample", 100)
    assert "changed since" in assert_one_line_error(code, out, err, str(data))
    data.rename(tmp_path / "moved.fbin")
    code, out, err = run_cli("eval", "recall", tmp_path / "ref.knn", "--backend", "cpu", "--sample", 100)
    assert "missing" in assert_one_line_error(code, out, err, str(data))


@pytest.mark.parametrize("args, says", [(["--metric", "cosine"], "cosine"),
                                        (["--partition", "kmeans"], "--partition kmeans")])
def test_what_cannot_be_referenced_is_refused_before_anything_is_written(tmp_path, args, says):
    data = tmp_path / "x.fbin"
    write_vectors(data, synth(ROWS, DIM, seed=8))
    code, out, err = run_cli("build", data, "-o", tmp_path / "s.knn", "--vectors", "reference", "--backend", "cpu",
                             "--shard-rows", SHARD_ROWS, *args)
    assert says in assert_one_line_error(code, out, err, str(data))
    assert not (tmp_path / "s.knn").exists()


def test_an_interrupted_referenced_build_resumes(tmp_path, monkeypatch):
    """A build that fails after some merges were committed resumes from them, still referencing the input."""
    data = tmp_path / "x.fbin"
    write_vectors(data, synth(ROWS, DIM, seed=8))
    monkeypatch.setenv("BIGKNN_CHECKPOINT_S", "0")  # every merge committed
    calls = []
    real = CpuBackend.ggm

    def failing(self, *a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("interrupted")
        return real(self, *a, **kw)

    monkeypatch.setattr(CpuBackend, "ggm", failing)
    with pytest.raises(RuntimeError, match="interrupted"):
        _build(data, tmp_path / "ref.knn", "reference")
    m = Store.open(tmp_path / "ref.knn").manifest
    assert len(m.merged) == 2 and all(s.source is not None for s in m.shards)
    monkeypatch.setattr(CpuBackend, "ggm", real)
    out = _build(data, tmp_path / "ref.knn", "reference")
    assert out["resumed"] and out["merges_done"] == 6
    assert run_json("eval", "recall", tmp_path / "ref.knn", "--backend", "cpu", "--sample", 500)["recall"] >= 0.95
