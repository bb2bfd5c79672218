"""Issue 38, user-id parts bound to their place like every chunk: each part file (``user_ids/<first row>.i64``, or
``.utf8`` with ``.offsets``) ends in the crc32c of its name and bytes; a part edited, or swapped with another part,
is damage that reads raise and ``bigknn verify`` lists. Parts are written through the store's descriptors, never
through a link. Parts written before they were sealed are read, and sealed by the store's next writer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import bigknn
from bigknn.core.errors import BadInput, Damaged
from bigknn.shards import Store, WriterLock, identity, user_ids
from test_chunk_places import ROWS, new_store

INTS = [np.arange(ROWS) * 7 + 1, np.arange(ROWS) * 7 + 2]  # two shards' ids, one part each
STRINGS = [[f"doc-{i:03d}" for i in range(ROWS)], [f"doc-{ROWS + i:03d}" for i in range(ROWS)]]


def with_ids(tmp_path: Path, parts: list) -> Path:
    store = new_store(tmp_path / "s.knn", np.random.default_rng(11)).path
    for first, ids in zip((0, ROWS), parts):
        user_ids.write_part(store, first, "in.parquet", iter([pa.array(ids)]))
    return store


def part(store: Path, first: int, suffix: str) -> Path:
    return store / user_ids.DIR / f"{first:012d}{suffix}"


@pytest.mark.parametrize("parts, kind", [(INTS, user_ids.INT), (STRINGS, user_ids.STR)])
def test_parts_read_back_and_verify_clean(tmp_path, parts, kind):
    store = with_ids(tmp_path, parts)
    ids = user_ids.load(store, 2 * ROWS)
    assert ids.kind == kind and list(ids.take(np.arange(2 * ROWS))) == [*parts[0], *parts[1]]
    assert bigknn.verify(store)["ok"]


@pytest.mark.parametrize("suffix", [".i64", ".utf8", ".offsets"])
def test_swapped_parts_are_damage(tmp_path, suffix):
    store = with_ids(tmp_path, INTS if suffix == ".i64" else STRINGS)
    a, b = part(store, 0, suffix), part(store, ROWS, suffix)
    assert a.stat().st_size == b.stat().st_size
    a_bytes = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(a_bytes)
    with pytest.raises(Damaged, match="fails its checksum for user_ids/"):
        user_ids.load(store, 2 * ROWS)
    report = bigknn.verify(store)
    assert not report["ok"] and {str(a), str(b)} <= {d["file"] for d in report["damaged"]}


def test_an_edited_part_is_damage_and_names_the_file(tmp_path):
    store = with_ids(tmp_path, INTS)
    p = part(store, ROWS, ".i64")
    raw = bytearray(p.read_bytes())
    raw[0] ^= 1
    p.write_bytes(bytes(raw))
    with pytest.raises(Damaged, match=str(p)):
        user_ids.load(store, 2 * ROWS)
    assert [d["file"] for d in bigknn.verify(store)["damaged"]] == [str(p)]


def test_a_missing_part_is_damage(tmp_path):
    store = with_ids(tmp_path, INTS)
    part(store, 0, ".i64").unlink()
    damaged = bigknn.verify(store)["damaged"]
    assert [d["what"] for d in damaged] == ["user ids"] and "rows 0.." in damaged[0]["problem"]


def unsealed(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:-user_ids.TRAILER])


def test_parts_from_before_sealing_are_read_then_sealed_by_the_next_writer(tmp_path):
    store = with_ids(tmp_path, STRINGS)
    for p in (store / user_ids.DIR).iterdir():
        unsealed(p)
    meta = json.loads((store / identity.GROUP).read_text())
    del meta["attributes"]["bigknn"][identity.KEY]  # a store written before parts were sealed
    (store / identity.GROUP).write_text(json.dumps(meta))
    assert list(user_ids.load(store, 2 * ROWS).take(np.arange(3))) == STRINGS[0][:3]
    with WriterLock(store):
        writer = Store.open(store, pin=False)
        writer.commit()
        writer.close()
    assert all(p.read_bytes().endswith(user_ids.MAGIC) for p in (store / user_ids.DIR).iterdir())
    assert list(user_ids.load(store, 2 * ROWS).take(np.arange(3))) == STRINGS[0][:3]


def test_an_unsealed_part_in_a_sealed_store_is_damage(tmp_path):
    store = with_ids(tmp_path, INTS)
    unsealed(part(store, 0, ".i64"))
    with pytest.raises(Damaged, match="has no checksum"):
        user_ids.load(store, 2 * ROWS)


def test_a_part_is_never_written_through_a_link(tmp_path):
    store = new_store(tmp_path / "s.knn", np.random.default_rng(12)).path
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, store / user_ids.DIR)
    with pytest.raises(BadInput, match="symbolic link"):
        user_ids.write_part(store, 0, "in.parquet", iter([pa.array(INTS[0])]))
    assert not list(outside.iterdir())
    (store / user_ids.DIR).unlink()
    (store / user_ids.DIR).mkdir()
    target = tmp_path / "users-file"
    target.write_bytes(b"keep")
    os.symlink(target, part(store, 0, ".i64"))
    user_ids.write_part(store, 0, "in.parquet", iter([pa.array(INTS[0])]))
    assert target.read_bytes() == b"keep" and not part(store, 0, ".i64").is_symlink()
    user_ids.remove_part(store, 0)
    assert not part(store, 0, ".i64").exists()
