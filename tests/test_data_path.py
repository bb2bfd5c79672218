"""The data path (design T8): a default build writes its vectors' copy and each shard's final graph (k wide)
once, and checkpoints cost at most CHECKPOINT_SHARE of the bytes; the summary counts every byte it wrote."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from bigknn.backends.cpu import CpuBackend
from bigknn.formats import write_vectors
from bigknn.core.knn_graph import EMPTY, KnnGraph, final_columns, widened
from bigknn.core.params import GnndParams
from bigknn.engine import writer as writer_module
from bigknn.engine.accounting import Accounting
from bigknn.operations.build import BuildRequest, build
from bigknn.operations.evaluate import recall
from bigknn.core.progress import Reporter
from bigknn.shards import Store
from bigknn.shards.arrays import tree_bytes
from bigknn.core.synth import synth

ROWS, DIM, K, SHARD_ROWS = 6000, 16, 10, 1500


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("datapath") / "x.fbin"
    write_vectors(path, synth(ROWS, DIM, seed=5))
    return path


def store_files_bytes(path) -> int:
    """Bytes of the store's files, but the writer's lock and readers' leases (not the build's output)."""
    return tree_bytes(path) - tree_bytes(path / ".readers") - sum(
        p.stat().st_size for p in path.glob(".lock*") if p.is_file())


def test_a_default_build_writes_vectors_and_final_graph_once(data, tmp_path, monkeypatch):
    """A multi-shard build whose cache holds every shard: bytes written (every one counted: at least what the
    store's files hold) <= the vectors + the final k-wide graph + 10 %; each graph is stored k wide and
    written once."""
    monkeypatch.delenv("BIGKNN_CHECKPOINT_S", raising=False)
    from bigknn.shards import store as store_module

    writes = []
    real = store_module.Store.write_graph
    monkeypatch.setattr(store_module.Store, "write_graph",
                        lambda self, sid, v, g: writes.append((sid, g.k)) or real(self, sid, v, g))
    out = build(BuildRequest(input=data, store=tmp_path / "s.knn", shard_rows=SHARD_ROWS, params=GnndParams(k=K)),
                [CpuBackend()], Reporter())
    assert out["shards"] == 4 and out["merges_done"] == 6
    assert sorted(writes) == [(sid, K) for sid in range(4)]  # once each, k columns (the lists are wider)
    assert GnndParams(k=K).width() > K
    vectors, graph = ROWS * DIM * 4, ROWS * K * (4 + 4)
    on_disk = store_files_bytes(tmp_path / "s.knn")
    assert on_disk >= vectors + graph
    assert on_disk <= out["written_bytes"] <= 1.1 * (vectors + graph), (on_disk, out["written_bytes"])
    store = Store.open(tmp_path / "s.knn")
    assert all(store.read_graph(s.id).k == K for s in store.manifest.shards)
    assert recall(store, CpuBackend(), sample=1000, k=K)["recall"] >= 0.95


def test_an_ingest_merges_the_k_wide_final_graphs(data, tmp_path, monkeypatch):
    """A store's final graphs are k wide; an ingest merges them (padded to the build's width) with new rows,
    and the result is as good as a build of all the rows."""
    from bigknn.operations.ingest import ingest

    monkeypatch.delenv("BIGKNN_CHECKPOINT_S", raising=False)
    more = tmp_path / "more.fbin"
    write_vectors(more, synth(ROWS + 1500, DIM, seed=5)[ROWS:])
    build(BuildRequest(input=data, store=tmp_path / "s.knn", shard_rows=SHARD_ROWS, params=GnndParams(k=K)),
          [CpuBackend()], Reporter())
    ingest(tmp_path / "s.knn", [more], [CpuBackend()], Reporter())
    store = Store.open(tmp_path / "s.knn")
    assert store.manifest.rows == ROWS + 1500 and len(store.manifest.shards) == 5
    assert recall(store, CpuBackend(), sample=1000, k=K)["recall"] >= 0.95


def test_widened_and_final_columns():
    g = KnnGraph(np.arange(12, dtype=np.int64).reshape(3, 4), np.arange(12, dtype=np.float32).reshape(3, 4))
    cut = final_columns(g, 2)
    assert cut.k == 2 and (cut.ids == g.ids[:, :2]).all()
    assert np.shares_memory(cut.ids, g.ids) and np.shares_memory(cut.dists, g.dists)  # views: the store copies chunks
    wide = widened(cut, 5)
    assert wide.k == 5 and wide.ids.dtype == np.int64
    assert (wide.ids[:, 2:] == EMPTY).all() and np.isinf(wide.dists[:, 2:]).all()
    assert (wide.dists[:, :2] == g.dists[:, :2]).all()
    assert widened(g, 3) is g and final_columns(g, 4) is g


def test_the_allowance_is_off_where_the_interval_is_set(monkeypatch):
    monkeypatch.delenv("BIGKNN_CHECKPOINT_S", raising=False)
    assert writer_module.checkpoint_allowance(1000) == int(1000 * writer_module.CHECKPOINT_SHARE)
    monkeypatch.setenv("BIGKNN_CHECKPOINT_S", "5")
    assert writer_module.checkpoint_allowance(1000) is None


class _Sink:
    """One dirty shard of ``size`` bytes, always; records what each write wrote."""

    def __init__(self, size: int):
        self.nbytes, self.writes = size, []

    def on_pressure(self, ask):
        pass

    def dirty(self):
        return [0]

    def size(self, sids):
        return self.nbytes * len(list(sids))

    def write(self, sids, final=frozenset()):
        self.writes.append((list(sids), set(final)))
        return {}, self.nbytes

    def accept(self, done):
        return done

    def written(self, done):
        pass

    def close(self):
        pass


class _NoStore:
    lock = threading.Lock()


def _checkpoints(monkeypatch, size: int, allowance: int | None) -> list:
    """The writes of a Writer whose clock runs at a short interval for a while, then closed."""
    monkeypatch.setattr(writer_module, "checkpoint_s", lambda: 0.01)
    sink = _Sink(size)
    w = writer_module.Writer(_NoStore(), None, Accounting(t0=time.perf_counter() - 1000), sink, allowance)
    w.gnnd_done(0)
    deadline = time.monotonic() + 10
    while not sink.writes and time.monotonic() < deadline and allowance is None:
        time.sleep(0.01)
    time.sleep(0.3)
    w.close(final=True)
    return sink.writes


def test_a_checkpoint_past_the_allowance_is_not_taken(monkeypatch):
    writes = _checkpoints(monkeypatch, size=100, allowance=99)
    assert writes == [([0], {0})]  # only close(), which writes the shard as final


def test_checkpoints_within_the_allowance_are_taken(monkeypatch):
    writes = _checkpoints(monkeypatch, size=100, allowance=250)
    checkpoints = [w for w in writes if not w[1]]
    assert len(checkpoints) == 2, writes  # 100 + 100 fit 250; a third would not
    assert writes[-1] == ([0], {0})


def test_checkpoints_without_allowance_follow_the_interval(monkeypatch):
    writes = _checkpoints(monkeypatch, size=10 ** 12, allowance=None)
    assert len([w for w in writes if not w[1]]) >= 1


def test_what_a_run_must_write_leaves_out_the_rows_it_references():
    """The checkpoint allowance is a share of what the run must write: with --vectors reference that is the final
    graphs alone (the rows are the input's), so that the disk beyond the input stays within graph + the share."""
    from bigknn.engine.pending import must_write
    from bigknn.shards import Manifest

    m = Manifest(dim=16, dtype="<f4", metric="l2", k=10, shard_rows=100, params=GnndParams(k=10), seed=0)
    graph = 10 * (m.id_dtype.itemsize + 4)
    assert must_write(m, graph_rows=300, copied_rows=0) == 300 * graph
    assert must_write(m, graph_rows=300, copied_rows=100) == 300 * graph + 100 * 16 * 4
