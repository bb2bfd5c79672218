"""Issue 38, checksums bound to their place: a chunk copied over another array's chunk of the same size (a
mixed-up restore, a bad sync), or an older write's chunk put back, is damage that reads and ``bigknn verify``
report, though its own crc32c matches its bytes. Stores of formats 2-5 (a crc32c per chunk, no table) are
still read, and the next writer upgrades them to format 6."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bigknn.core.errors import Damaged
from bigknn.core.knn_graph import KnnGraph
from bigknn.shards import Manifest, ShardEntry, Store, WriterLock, checksums
from bigknn.shards.manifest import FORMAT_VERSION, PLACED_SINCE

DIM, ROWS, K = 8, 64, 4


def new_store(path: Path, rng) -> Store:
    """Two shards of the same shape (their chunks are the same size), graph version 1 of each committed."""
    store = Store.create(path, Manifest(dim=DIM, dtype="<f4", metric="l2", k=K, shard_rows=ROWS, params={}, seed=0))
    for sid in (0, 1):
        store.write_vectors(sid, rng.standard_normal((ROWS, DIM)).astype(np.float32))
        store.manifest.shards.append(ShardEntry(sid, sid * ROWS, ROWS))
        ids = rng.integers(0, 2 * ROWS, (ROWS, K)).astype(np.int32)
        store.write_graph(sid, 1, KnnGraph(ids, np.sort(rng.random((ROWS, K)).astype(np.float32), axis=1)))
        store.manifest.shards[sid].graph = 1
    store.commit()
    store.close()
    return store


def chunk(store: Path, array: str, i: int = 0) -> Path:
    return store / array / "c" / str(i) / "0"


@pytest.mark.parametrize("array", ["shards/{}/vectors", "shards/{}/graph/1/ids"])
def test_a_chunk_swapped_with_another_shards_is_damage(cli, tmp_path, array):
    store = new_store(tmp_path / "s.knn", np.random.default_rng(1)).path
    mine, theirs = chunk(store, array.format(0)), chunk(store, array.format(1))
    assert mine.stat().st_size == theirs.stat().st_size
    shutil.copyfile(theirs, mine)
    with pytest.raises(Damaged, match="another place"):
        s = Store.open(store)
        s.read_vectors(0) if "vectors" in array else s.read_graph(0)
    code, out, _ = cli("verify", store, "--json")
    assert code == 1
    assert str(mine) in {p["file"] for p in json.loads(out)["damaged"]}


def test_an_older_writes_chunk_put_back_is_damage(tmp_path):
    rng = np.random.default_rng(2)
    store = new_store(tmp_path / "s.knn", rng)
    writer = Store.open(store.path, pin=False)
    writer.write_vectors(5, rng.standard_normal((ROWS, DIM)).astype(np.float32))
    old = chunk(store.path, "shards/5/vectors").read_bytes()
    writer.write_vectors(5, rng.standard_normal((ROWS, DIM)).astype(np.float32))
    chunk(store.path, "shards/5/vectors").write_bytes(old)
    with pytest.raises(Damaged, match="older write"):
        writer._read_array("shards/5/vectors", "shard 5 vectors")


def test_an_array_copied_whole_over_another_is_damage(tmp_path):
    store = new_store(tmp_path / "s.knn", np.random.default_rng(3)).path
    shutil.rmtree(store / "shards/0/vectors")
    shutil.copytree(store / "shards/1/vectors", store / "shards/0/vectors")
    with pytest.raises(Damaged, match="written for shards/1/vectors"):
        Store.open(store).read_vectors(0)


def as_format_5(store: Path) -> None:
    """The store as bigknn wrote it before format 6: the same chunk files, no table of their checksums."""
    for meta_path in store.rglob("zarr.json"):
        meta = json.loads(meta_path.read_text())
        (meta.get("attributes") or {}).pop(checksums.TABLE, None)
        meta_path.write_text(json.dumps(meta))
    m = json.loads((store / "manifest.json").read_text())
    (store / "manifest.json").write_text(json.dumps(dict(m, format=5)))


def tables(store: Path) -> int:
    return sum(checksums.TABLE in (json.loads(p.read_text()).get("attributes") or {}) for p in store.rglob("zarr.json"))


def test_an_older_store_is_read_then_upgraded_by_the_next_writer(cli, tmp_path):
    rng = np.random.default_rng(4)
    store = new_store(tmp_path / "s.knn", rng).path
    want = Store.open(store).read_vectors(1)
    as_format_5(store)
    assert tables(store) == 0
    reader = Store.open(store)
    assert reader.manifest.format == 5 and np.array_equal(reader.read_vectors(1), want)
    assert cli("verify", store)[0] == 0
    with WriterLock(store):
        writer = Store.open(store, pin=False)
        writer.commit()
        writer.close()
    m = json.loads((store / "manifest.json").read_text())
    assert m["format"] == PLACED_SINCE == FORMAT_VERSION
    assert tables(store) == 6  # vectors, ids and dists of both shards
    shutil.copyfile(chunk(store, "shards/1/vectors"), chunk(store, "shards/0/vectors"))
    with pytest.raises(Damaged, match="another place"):
        Store.open(store).read_vectors(0)


def test_a_format_6_array_without_its_table_is_damage(tmp_path):
    store = new_store(tmp_path / "s.knn", np.random.default_rng(5)).path
    meta_path = store / "shards/0/vectors/zarr.json"
    meta = json.loads(meta_path.read_text())
    del meta["attributes"][checksums.TABLE]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(Damaged, match="lists no checksums"):
        Store.open(store).read_vectors(0)
