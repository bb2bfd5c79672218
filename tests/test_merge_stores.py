"""``bigknn merge STORE OTHER...`` (issue 39, item 3): two stores built apart from the halves of one set, merged,
are as good as a build of the whole; ids and user ids follow STORE's rows; refusals write nothing; a merge killed
at any moment is finished by the same command; a reader opened before the merge keeps its version."""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import bigknn as bk
from bigknn.backends.cpu import CpuBackend
from bigknn.core.errors import BadInput
from bigknn.formats import write_vectors
from bigknn.core.knn_graph import EMPTY
from bigknn.core.params import GnndParams
from bigknn.operations.build import BuildRequest, build
from bigknn.operations.evaluate import recall
from bigknn.engine.accounting import Accounting
from bigknn.operations.merge_stores import _stage, merge_stores
from bigknn.core.progress import Reporter
from bigknn.shards import Store, user_ids
from bigknn.core.synth import synth

from conftest import assert_one_line_error

DIM, K, HALF, SHARD_ROWS = 24, 10, 3000, 1000
TARGET = 0.99  # the bar for the merged store, the bar a build of the whole reaches


def bigknn(*args: str) -> list[str]:
    return [sys.executable, "-m", "bigknn", *args]


def tree_digest(path: Path) -> dict:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file() and p.name != ".lock"}


def make_store(path: Path, x: np.ndarray, **kw) -> Path:
    src = path.with_suffix(".fbin")
    write_vectors(src, x)
    params = GnndParams(k=kw.pop("k", K))
    build(BuildRequest(input=src, store=path, shard_rows=kw.pop("shard_rows", SHARD_ROWS), params=params, **kw),
          [CpuBackend()], Reporter())
    return path


@pytest.fixture(scope="module")
def halves(tmp_path_factory) -> dict:
    """Two stores built apart from the two halves of one clustered set, and the set."""
    root = tmp_path_factory.mktemp("merge")
    x = synth(2 * HALF, DIM, seed=11)
    return {"root": root, "x": x, "a": make_store(root / "a.knn", x[:HALF]),
            "b": make_store(root / "b.knn", x[HALF:], seed=1)}


@pytest.fixture(scope="module")
def merged(halves) -> dict:
    """``a`` with ``b`` merged in, uninterrupted, and the merge's report."""
    store = halves["root"] / "merged.knn"
    shutil.copytree(halves["a"], store)
    report = merge_stores(store, [halves["b"]], [CpuBackend()], Reporter())
    return {"store": store, "report": report}


def copy_of(path: Path, where: Path) -> Path:
    shutil.copytree(path, where)
    return where


def union_recall(store: Path) -> float:
    """Exact recall@10 of a fixed sample of the whole merged set (bigknn's eval: brute force over every row)."""
    return recall(Store.open(store), CpuBackend(), sample=1000, k=10, seed=3)["recall"]


def check_graph(store: Path, x: np.ndarray) -> None:
    """Every row holds k distinct, non-self ids in [0, rows), and each stored distance is the distance to the
    row those ids name in the merged numbering (ids left unshifted would name other rows)."""
    s = Store.open(store)
    assert s.manifest.rows == len(x) and s.manifest.pending is None and s.manifest.complete
    for sh in s.manifest.shards:
        g = s.read_graph(sh.id)
        ids = g.ids[:, :K].astype(np.int64)
        own = np.arange(sh.offset, sh.offset + sh.rows)[:, None]
        assert (ids != EMPTY).all() and (ids >= 0).all() and (ids < len(x)).all()
        assert not (ids == own).any()
        srt = np.sort(ids, axis=1)
        assert not (srt[:, 1:] == srt[:, :-1]).any()
        d = ((x[own[:, 0]][:, None, :] - x[ids]) ** 2).sum(-1)
        np.testing.assert_allclose(g.dists[:, :K], d, rtol=1e-3, atol=1e-3)


def test_merged_store_is_as_good_as_a_build_of_the_whole(halves, merged):
    report, store = merged["report"], merged["store"]
    assert report["rows_added"] == HALF and report["rows"] == 2 * HALF and report["skipped"] == []
    assert report["merged"] == [str(halves["b"])]
    m = Store.open(store).manifest
    assert m.complete and m.merges_total == len(m.merged) == 6 * 5 // 2
    assert report["merges_run"] == 3 * 3  # only pairs across the stores: those within each were merged before
    assert [t["phase"] for t in report["timeline"]] == ["ggm"] * 9 and report["descents"]["ggm"]["count"] == 9
    assert all(t["stop"] and t["estimate"]["recall"] >= t["estimate"]["low"] for t in report["timeline"])
    s = Store.open(store)
    np.testing.assert_array_equal(s.vectors_of(np.arange(2 * HALF)), halves["x"])
    check_graph(store, halves["x"])
    assert union_recall(store) >= TARGET
    # the estimate measured before the merge stays, marked as one of fewer rows than the graph holds
    assert m.estimate is not None and m.estimate["graph_rows"] == HALF < m.rows


def test_rows_of_the_other_store_keep_their_neighbours_offset(halves, merged):
    """The neighbours of b's rows that lie in b's half are, for the most part, those b's own graph had,
    renumbered by a's rows (a merge keeps what was found); unshifted, b's graph would name rows of a."""
    b, s = Store.open(halves["b"]), Store.open(merged["store"])
    before = np.concatenate([b.read_graph(sh.id).ids[:, :K] for sh in b.manifest.shards]).astype(np.int64) + HALF
    after = np.concatenate([s.read_graph(sh.id).ids[:, :K] for sh in s.manifest.shards[3:]]).astype(np.int64)
    in_b = [set(q[q >= HALF]) for q in after]
    kept = sum(len(set(p) & q) for p, q in zip(before, in_b)) / sum(len(q) for q in in_b)
    assert kept >= 0.9


def test_merging_again_is_a_noop_that_says_so(halves, merged, tmp_path):
    store = copy_of(merged["store"], tmp_path / "again.knn")
    before = tree_digest(store)
    run = subprocess.run(bigknn("merge", str(store), str(halves["b"]), "--backend", "cpu", "--json"),
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["skipped"] == [str(halves["b"])] and out["merged"] == [] and out["rows"] == 2 * HALF
    assert "already merged" in run.stderr
    assert tree_digest(store) == before


def test_user_ids_of_both_stores_are_carried(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    x = synth(1200, DIM, seed=12)
    stores = []
    for name, rows, first in (("ua", x[:700], 0), ("ub", x[700:], 700)):
        emb = pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), DIM)
        pq.write_table(pa.table({"doc": pa.array([f"doc-{first + i}" for i in range(len(rows))]), "emb": emb}),
                       tmp_path / f"{name}.parquet")
        stores.append(tmp_path / f"{name}.knn")
        bk.build(tmp_path / f"{name}.parquet", k=K, store=stores[-1], backend="cpu", shard_rows=400,
                 column="emb", id_column="doc").close()
    report = bk.merge(stores[0], others=[stores[1]], backend="cpu")
    assert report.rows == 1200
    ids = user_ids.require(stores[0], 1200)
    assert list(ids.take(np.array([0, 699, 700, 1199]))) == ["doc-0", "doc-699", "doc-700", "doc-1199"]
    with bk.open(stores[0]) as g:
        nbrs, _ = g.neighbors(ids="user")
    assert nbrs[1000, 0].startswith("doc-")


def test_a_partitioned_store_takes_a_contiguous_one(halves, tmp_path):
    """STORE built by k-means shards: the other store's rows come after its rows, every pair across is merged."""
    store = make_store(tmp_path / "km.knn", halves["x"][:HALF], partition="kmeans")
    report = merge_stores(store, [halves["b"]], [CpuBackend()], Reporter())
    m = Store.open(store).manifest
    assert report["rows"] == 2 * HALF and m.complete and m.partition_method == "kmeans"
    np.testing.assert_array_equal(Store.open(store).vectors_of(np.arange(HALF, 2 * HALF)), halves["x"][HALF:])
    assert union_recall(store) >= TARGET


@pytest.fixture(scope="module")
def odd_stores(halves) -> dict:
    """Small stores that differ from ``a`` in one field each, and one left pending."""
    root, x = halves["root"], synth(400, DIM, seed=13)
    stores = {"dim": make_store(root / "dim.knn", synth(400, DIM + 8, seed=13)),
              "metric": make_store(root / "metric.knn", x, metric="ip"),
              "k": make_store(root / "k.knn", x, k=5)}
    pending = copy_of(halves["a"], root / "pending.knn")
    m = Store.open(pending, pin=False)
    m.manifest.merged.pop()  # as a build killed before its last merge leaves it
    m.commit()
    stores["pending"] = pending
    return stores


@pytest.mark.parametrize("field", ["dim", "metric", "k", "pending"])
def test_a_store_that_differs_is_refused_and_nothing_is_written(halves, odd_stores, field, tmp_path):
    store = copy_of(halves["a"], tmp_path / "s.knn")
    before = tree_digest(store)
    run = subprocess.run(bigknn("merge", str(store), str(odd_stores[field]), "--backend", "cpu"),
                         capture_output=True, text=True)
    word = {"pending": "not finished"}.get(field, f"{field} ")
    assert_one_line_error(run.returncode, run.stdout, run.stderr, str(odd_stores[field]), word)
    assert tree_digest(store) == before


def test_the_same_store_or_a_missing_one_is_refused(halves, tmp_path):
    store = copy_of(halves["a"], tmp_path / "s.knn")
    before = tree_digest(store)
    with pytest.raises(BadInput, match="into itself"):
        merge_stores(store, [store], [CpuBackend()], Reporter())
    with pytest.raises(BadInput, match="twice"):
        merge_stores(store, [halves["b"], halves["b"]], [CpuBackend()], Reporter())
    with pytest.raises(BadInput, match="no such store"):
        merge_stores(store, [tmp_path / "nowhere.knn"], [CpuBackend()], Reporter())
    with pytest.raises(BadInput, match="already holds the rows"):  # a copy of itself: its rows twice
        merge_stores(store, [copy_of(halves["a"], tmp_path / "twin.knn")], [CpuBackend()], Reporter())
    assert tree_digest(store) == before
    run = subprocess.run(bigknn("merge", str(tmp_path / "nowhere.knn"), str(halves["b"]), "--backend", "cpu"),
                         capture_output=True, text=True)
    assert_one_line_error(run.returncode, run.stdout, run.stderr, "nowhere.knn", "no such store")
    assert not (tmp_path / "nowhere.knn").exists()


def test_a_reader_opened_before_the_merge_keeps_its_version(halves, tmp_path, caplog):
    store = copy_of(halves["a"], tmp_path / "s.knn")
    reader = Store.open(store)
    graphs = [reader.read_graph(sh.id) for sh in reader.manifest.shards]
    with caplog.at_level(logging.WARNING):
        merge_stores(store, [halves["b"]], [CpuBackend()], Reporter())
    assert f"measured on {HALF:,} rows, before the merge" in caplog.text  # the estimate is said to be the old one
    assert reader.manifest.rows == HALF
    for sh, g in zip(reader.manifest.shards, graphs):
        again = reader.read_graph(sh.id)
        np.testing.assert_array_equal(again.ids, g.ids)
        np.testing.assert_array_equal(again.dists, g.dists)
    assert Store.open(store).manifest.shards[0].graph != reader.manifest.shards[0].graph
    reader.close()


def test_a_staged_merge_is_finished_by_merge_store_alone(halves, tmp_path):
    """A merge killed after its copy was committed (pending) is finished by `bigknn merge STORE` as well; until
    then readers see the old store."""
    store = copy_of(halves["a"], tmp_path / "s.knn")
    s = Store.open(store, pin=False)
    _stage(s, [Store.open(halves["b"])], Reporter(), Accounting())
    assert Store.open(store).manifest.rows == HALF and Store.open(store).manifest.pending is not None
    report = bk.merge(store, backend="cpu")
    assert report.rows == 2 * HALF and report.merges_done == report.merges_total
    check_graph(store, halves["x"])


@pytest.mark.slow
def test_sigkill_at_random_moments_then_the_same_command_finishes(halves, tmp_path):
    """Kill a merge at a random moment of its run (seeded fractions of an uninterrupted run's length: before,
    during and after the copy and the merges), rerun the same command: the store is the merged one, as good as
    the uninterrupted merge; a reader in between sees the old store or the merged one, never a mix."""
    def command(store: Path) -> list[str]:
        return bigknn("merge", str(store), str(halves["b"]), "--backend", "cpu", "--json")

    whole = copy_of(halves["a"], tmp_path / "whole.knn")
    t0 = time.perf_counter()
    assert subprocess.run(command(whole), capture_output=True).returncode == 0
    length, want = time.perf_counter() - t0, union_recall(whole)
    for seed in (1, 2, 3, 4):
        store = copy_of(halves["a"], tmp_path / f"t{seed}.knn")
        proc = subprocess.Popen(command(store), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(random.Random(seed).uniform(0.1, 0.95) * length)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert Store.open(store).manifest.rows in (HALF, 2 * HALF)
        rerun = subprocess.run(command(store), capture_output=True, text=True)
        assert rerun.returncode == 0, rerun.stderr
        assert json.loads(rerun.stdout)["rows"] == 2 * HALF
        check_graph(store, halves["x"])
        assert abs(union_recall(store) - want) <= 0.003


def test_shifted_ids_keep_empty_slots_and_widen_past_int32():
    from bigknn.core.knn_graph import KnnGraph, shifted

    ids = np.array([[0, 5, EMPTY], [7, EMPTY, EMPTY]], np.int32)
    g = shifted(KnnGraph(ids.copy(), np.zeros((2, 3), np.float32)), 100, 108)
    assert g.ids.dtype == np.int32 and g.ids.tolist() == [[100, 105, EMPTY], [107, EMPTY, EMPTY]]
    far = 2**31 + 10  # ids of a merged store past int32: int64, shifted exactly
    g = shifted(KnnGraph(ids.copy(), np.zeros((2, 3), np.float32)), far, far + 8)
    assert g.ids.dtype == np.int64 and g.ids.tolist() == [[far, far + 5, EMPTY], [far + 7, EMPTY, EMPTY]]


@pytest.mark.parametrize("links", [True, False])
def test_the_other_stores_rows_are_linked_where_the_file_system_allows(tmp_path, monkeypatch, links):
    """On one file system the merged store's new shards are hard links to the other store's checked chunk
    files (no row copied); where links are refused (another device) the rows are copied. Either way both stores
    verify clean, the other is left as it was, and the merged store keeps its rows once the other is deleted."""
    import errno
    import os

    from bigknn.operations.verify import verify

    x = synth(1200, DIM, seed=5)
    a = make_store(tmp_path / "a.knn", x[:600], shard_rows=300)
    b = make_store(tmp_path / "b.knn", x[600:], shard_rows=300)
    if not links:
        real = os.link

        def refuse(src, dst, **kwargs):  # the chunk links (into a directory descriptor); the store's own are kept
            if "dst_dir_fd" in kwargs:
                raise OSError(errno.EXDEV, "Invalid cross-device link")
            return real(src, dst, **kwargs)

        monkeypatch.setattr(os, "link", refuse)
    before = tree_digest(b)
    report = merge_stores(a, [b], [CpuBackend()], Reporter())
    assert report["shards_linked"] == (2 if links else 0)
    for k in range(2):
        src = sorted(p for p in (b / "shards" / str(k) / "vectors" / "c").rglob("0") if p.is_file())
        dst = sorted(p for p in (a / "shards" / str(2 + k) / "vectors" / "c").rglob("0") if p.is_file())
        assert len(src) == len(dst) > 0
        assert all((p.stat().st_ino == q.stat().st_ino) == links for p, q in zip(src, dst))
    assert tree_digest(b) == before and verify(Store.open(b))["ok"] and verify(Store.open(a))["ok"]
    shutil.rmtree(b)
    np.testing.assert_array_equal(Store.open(a).vectors_of(np.arange(1200)), x)
    assert verify(Store.open(a))["ok"]


def test_a_damaged_chunk_of_the_other_store_stops_the_merge_naming_it(tmp_path):
    """Linking checks every chunk first, as a copy's read does: a flipped byte in the other store's rows is
    refused, naming that file, and nothing of it is linked."""
    from bigknn.core.errors import Damaged

    x = synth(1200, DIM, seed=6)
    a = make_store(tmp_path / "a.knn", x[:600], shard_rows=600)
    b = make_store(tmp_path / "b.knn", x[600:], shard_rows=600)
    chunk = sorted(p for p in (b / "shards" / "0" / "vectors" / "c").rglob("0") if p.is_file())[0]
    raw = bytearray(chunk.read_bytes())
    raw[5] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    with pytest.raises(Damaged) as err:
        merge_stores(a, [b], [CpuBackend()], Reporter())
    assert str(chunk) in str(err.value)
    assert not list((a / "shards").glob("1/vectors/c/*/0"))  # a copy's read would have failed as early


def test_a_link_among_the_other_stores_chunk_files_is_copied_through_not_linked(tmp_path):
    """A hard link to a symbolic link would put that link inside STORE: such a shard's rows are copied."""
    x = synth(1200, DIM, seed=7)
    a = make_store(tmp_path / "a.knn", x[:600], shard_rows=600)
    b = make_store(tmp_path / "b.knn", x[600:], shard_rows=600)
    chunk = sorted(p for p in (b / "shards" / "0" / "vectors" / "c").rglob("0") if p.is_file())[0]
    moved = tmp_path / "elsewhere"
    shutil.copyfile(chunk, moved)
    chunk.unlink()
    chunk.symlink_to(moved)
    report = merge_stores(a, [b], [CpuBackend()], Reporter())
    assert report["shards_linked"] == 0
    assert not any(p.is_symlink() for p in (a / "shards").rglob("*"))
    np.testing.assert_array_equal(Store.open(a).vectors_of(np.arange(1200)), x)
