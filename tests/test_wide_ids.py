"""Store-wide ids past 2^31 rows (issue 12, item 5): int32 while every id fits, int64 beyond
(bigknn/core/knn_graph.py id_dtype), through merges, exact search, the store, readout, export and ingest; stores whose
ids fit int32 stay int32. No test needs 2^31 real rows: shards sit at large offsets, or the rule's limit is
lowered for a whole build and ingest."""

from __future__ import annotations

import numpy as np
import pytest

import bigknn
import bigknn.core.knn_graph
from bigknn.backends.cpu import CpuBackend
from bigknn.core.errors import BadInput
from bigknn.formats import write_vectors
from bigknn.core.knn_graph import KnnGraph, ShardPart, id_dtype, merge_lists, shard_graph_to_global
from bigknn.core.params import GnndParams
from bigknn.operations.ingest import ingest
from bigknn.operations.verify import verify
from bigknn.core.progress import Reporter
from bigknn.shards import Manifest, ShardEntry, Store
from bigknn.shards.manifest import FORMAT_VERSION, WIDE_IDS_SINCE
from bigknn.core.synth import synth
from bigknn.core.metric import L2

from conftest import tree_hashes

BIG = 2**31 + 1000  # an offset whose ids do not fit int32
HUGE = BIG + 2**32  # ids that do not fit uint32 either, and share their low 32 bits with BIG's


def test_the_id_dtype_is_int32_while_every_id_fits():
    assert id_dtype(2**31) == np.int32  # ids 0 .. 2^31 - 1
    assert id_dtype(2**31 + 1) == np.int64


def test_shard_graph_to_global_widens_only_past_int32():
    local = np.array([[1, -1], [0, 1]], np.int32)
    keys = np.zeros((2, 2), np.float32)
    wide = shard_graph_to_global(KnnGraph(local.copy(), keys), BIG)
    assert wide.ids.dtype == np.int64 and wide.ids.tolist() == [[BIG + 1, -1], [BIG, BIG + 1]]
    narrow = shard_graph_to_global(KnnGraph(local.copy(), keys), 10)
    assert narrow.ids.dtype == np.int32 and narrow.ids.tolist() == [[11, -1], [10, 11]]


def test_merge_lists_orders_and_dedups_ids_past_int32():
    ids = np.array([[BIG + 5, HUGE + 5, BIG + 5, -1, 3]], np.int64)
    keys = np.array([[0.5, 0.1, 0.3, 0.0, 0.2]], np.float32)
    out_ids, out_keys = merge_lists(ids, keys, 4)
    assert out_ids.dtype == np.int64
    assert out_ids.tolist() == [[HUGE + 5, 3, BIG + 5, -1]]  # the repeat of BIG + 5 keeps its smaller key
    np.testing.assert_allclose(out_keys[0, :3], [0.1, 0.2, 0.3])


def test_exact_knn_ids_follow_the_offsets():
    x = synth(300, 8, seed=5)
    q = x[::30]
    narrow = CpuBackend().exact_knn(q, 5, L2, [(0, x[:100]), (100, x[100:])])
    wide = CpuBackend().exact_knn(q, 5, L2, [(0, x[:100]), (BIG - 100, x[100:])])
    assert narrow.ids.dtype == np.int32 and wide.ids.dtype == np.int64
    np.testing.assert_array_equal(np.where(wide.ids >= BIG - 100, wide.ids - BIG + 200, wide.ids), narrow.ids)


def test_ggm_past_int32_gives_the_same_merge_as_at_small_offsets():
    """Shards a at 2^31 + 1000 and b past 2^32 + 2^31 merge to exactly the lists they merge to at offsets 0
    and rows, ids shifted: nothing is cut to int32 (or uint32) on the way."""
    rows = 800
    x = synth(2 * rows, 16, seed=3)
    params = GnndParams(k=10)
    backend = CpuBackend()
    local = [backend.gnnd(x[i * rows:(i + 1) * rows], L2, params, seed=i) for i in range(2)]

    def merge(off_a: int, off_b: int) -> list[KnnGraph]:
        a, b = (ShardPart(off, x[i * rows:(i + 1) * rows], shard_graph_to_global(KnnGraph(g.ids.copy(), g.dists), off))
                for i, (off, g) in enumerate(zip((off_a, off_b), local)))
        return list(backend.ggm(a, b, L2, params, seed=3))

    small, wide = merge(0, rows), merge(BIG, HUGE)
    for s, w in zip(small, wide):
        assert s.ids.dtype == np.int32 and w.ids.dtype == np.int64
        assert (w.ids >= HUGE).any() and ((w.ids >= BIG) & (w.ids < HUGE)).any()
        back = np.where(w.ids >= HUGE, w.ids - HUGE + rows, np.where(w.ids >= BIG, w.ids - BIG, w.ids))
        np.testing.assert_array_equal(back, s.ids)
        np.testing.assert_array_equal(w.dists, s.dists)


def _manifest(shards: list[ShardEntry]) -> Manifest:
    m = Manifest(dim=4, dtype="<f4", metric="l2", k=3, shard_rows=2**31, params=GnndParams(), seed=0, shards=shards)
    m.hold_ids_of(m.rows)
    return m


def test_store_round_trips_ids_past_int32(tmp_path):
    """A store whose second shard starts at 2^31 (the first is never read): its graph is written as int64 and
    read back exactly, whole or by rows; the manifest says int64 and format 5."""
    store = Store.create(tmp_path / "s", _manifest([ShardEntry(0, 0, 2**31), ShardEntry(1, 2**31, 6)]))
    assert store.manifest.id_dtype == np.int64 and store.manifest.format >= WIDE_IDS_SINCE
    ids = np.array([[2**31 + 1, 5, -1], [HUGE, 2**31, 2**31 + 5]] * 3, np.int64)
    g = KnnGraph(ids, np.tile(np.float32([0.1, 0.2, np.inf]), (6, 1)))
    store.write_vectors(1, synth(6, 4, seed=1))
    store.write_graph(1, 1, g)
    assert store.array_meta("shards/1/graph/1/ids")["data_type"] == "int64"
    reopened = Store.open(tmp_path / "s", pin=False)
    assert reopened.manifest.id_dtype == np.int64
    np.testing.assert_array_equal(reopened.read_graph(1, 1).ids, ids)
    reopened.manifest.shards[1].graph = 1
    rows_ids, _ = reopened.read_graph_rows(1, np.array([1, 4]))
    np.testing.assert_array_equal(rows_ids, ids[[1, 4]])
    np.testing.assert_array_equal(reopened.vectors_of(np.array([2**31 + 2])), synth(6, 4, seed=1)[2:3])


def test_an_int32_store_refuses_ids_it_cannot_hold(tmp_path):
    store = Store.create(tmp_path / "s", _manifest([ShardEntry(0, 0, 6)]))
    assert store.manifest.id_dtype == np.int32 and store.manifest.format == FORMAT_VERSION
    g = KnnGraph(np.full((6, 3), BIG, np.int64), np.zeros((6, 3), np.float32))
    with pytest.raises(ValueError, match="past the store's int32 ids"):
        store.write_graph(0, 1, g)


def test_hold_ids_of_widens_once_and_never_narrows():
    m = _manifest([ShardEntry(0, 0, 10)])
    m.format = 2  # a store of before the wide ids
    m.hold_ids_of(2**31)
    assert (m.ids, m.format) == ("int32", 2)
    m.hold_ids_of(2**31 + 1)
    assert (m.ids, m.format) == ("int64", 5)
    m.hold_ids_of(10)
    assert (m.ids, m.format) == ("int64", 5)
    assert Manifest.from_json(m.to_json()).id_dtype == np.int64


def test_readers_follow_the_manifest_and_ibin_refuses_int64(tmp_path):
    """A store an ingest widened to int64 still holds int32 arrays it did not rewrite: readers widen them;
    .ibin (int32 ids by format) is refused in one line, .npy carries int64."""
    x = synth(400, 8, seed=2)
    with bigknn.build(x, k=5, store=tmp_path / "s", backend="cpu") as g:
        ids32, d32 = g.neighbors()
        g.export(tmp_path / "a.npy")
    assert ids32.dtype == np.int32 and np.load(tmp_path / "a.npy").dtype == np.int32
    store = Store.open(tmp_path / "s", pin=False)
    store.manifest.hold_ids_of(2**31 + 1)
    store.commit()
    with bigknn.open(tmp_path / "s") as g:
        ids64, d64 = g.neighbors(include_self=True)
        with pytest.raises(BadInput, match=r"int64 ids; \.ibin holds int32 ids"):
            g.export(tmp_path / "a.ibin")
        g.export(tmp_path / "b.npy")
    assert ids64.dtype == np.int64 and not (tmp_path / "a.ibin").exists()
    np.testing.assert_array_equal(ids64[:, 1:], ids32)
    np.testing.assert_array_equal(ids64[:, 0], np.arange(400))
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), ids32)
    assert np.load(tmp_path / "b.npy").dtype == np.int64
    assert verify(Store.open(tmp_path / "s", pin=False))["ok"]


def _build_and_ingest(path, x: np.ndarray, first: int) -> tuple[Store, Store, np.ndarray]:
    """(the store after the build, after the ingest, the neighbours after it)."""
    with bigknn.build(x[:first], k=5, store=path, backend="cpu", shard_rows=200, seed=4) as g:
        pass
    built = Store.open(path, pin=False)
    with bigknn.open(path) as g:
        g.ingest(x[first:], backend="cpu")
        ids, _ = g.neighbors()
    return built, Store.open(path, pin=False), ids


def test_an_ingest_past_the_limit_switches_to_int64_and_changes_nothing_else(tmp_path, monkeypatch):
    """The same build and ingest twice: as is (int32 throughout), and with the rule's limit lowered between
    the build's rows and the ingest's total, so the ingest switches the store to int64 midway. The graphs
    are the same ids; only their dtype differs, in memory and on disk."""
    x = synth(700, 8, seed=6)
    plain_built, plain, plain_ids = _build_and_ingest(tmp_path / "plain", x, 500)
    monkeypatch.setattr(bigknn.core.knn_graph, "INT32_ROWS", 600)
    built, wide, wide_ids = _build_and_ingest(tmp_path / "wide", x, 500)
    assert (plain_built.manifest.ids, built.manifest.ids, plain.manifest.ids) == ("int32",) * 3
    assert wide.manifest.ids == "int64" and wide.manifest.format >= WIDE_IDS_SINCE
    assert plain_ids.dtype == np.int32 and wide_ids.dtype == np.int64
    np.testing.assert_array_equal(wide_ids, plain_ids)
    for s in wide.manifest.shards:  # every shard took part in a merge with the new rows: rewritten int64
        assert wide.array_meta(f"shards/{s.id}/graph/{s.graph}/ids")["data_type"] == "int64"


def test_the_cuda_backend_refuses_ids_past_int32_in_one_line():
    """Its kernels hold global ids as int32: past 2^31 rows it refuses rather than wrap (CPU-only check)."""
    from bigknn.backends.cuda.backend import _int32_blocks, _require_int32_ids

    _require_int32_ids(2**31)
    for args in ((2**31 + 1,), (10, np.dtype(np.int64))):
        with pytest.raises(BadInput, match="--backend cpu only"):
            _require_int32_ids(*args)
    with pytest.raises(BadInput, match="past 2\\^31 rows"):
        list(_int32_blocks([(0, np.zeros((5, 2))), (2**31 - 2, np.zeros((5, 2)))]))


def test_a_format_1_store_refuses_an_ingest_past_int32_and_keeps_its_bytes(tmp_path, monkeypatch):
    """int64 ids make a store format 5, which reads arrays without checksums as damage: a format-1 store
    (written before checksums) refuses the ingest that would cross the limit, in one line, before any
    write."""
    x = synth(700, 8, seed=6)
    with bigknn.build(x[:500], k=5, store=tmp_path / "s", backend="cpu", shard_rows=200, seed=4):
        pass
    store = Store.open(tmp_path / "s", pin=False)
    store.manifest.format = 1
    store.commit()
    write_vectors(tmp_path / "new.fbin", x[500:])
    before = tree_hashes(tmp_path / "s")
    monkeypatch.setattr(bigknn.core.knn_graph, "INT32_ROWS", 600)
    with pytest.raises(BadInput, match=r"new\.fbin: would take the store to 700 rows, past int32 ids"):
        ingest(tmp_path / "s", [tmp_path / "new.fbin"], [CpuBackend()], Reporter())
    assert tree_hashes(tmp_path / "s") == before
