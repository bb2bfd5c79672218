"""Issue 38, a manifest field edited to another valid value: ``dim``, ``dtype``, ``metric`` and ``k`` are recorded
in the store's zarr.json when it is created; an edit of any of them is damage that ``bigknn verify`` names (exit 1,
the advice says what to put back), and every reader and writer refuses the store in one line naming the field
(exit 2), committing nothing on it. A store written before the record is read as before and gets it from its next
writer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bigknn.core.errors import BadInput
from bigknn.shards import Store, WriterLock, identity
from conftest import assert_one_line_error
from test_chunk_places import new_store

EDITS = [("dim", 9), ("dtype", "<f8"), ("metric", "ip"), ("k", 3)]  # each valid, each not what the store holds


@pytest.fixture
def store(tmp_path) -> Path:
    return new_store(tmp_path / "s.knn", np.random.default_rng(7)).path


def edit(store: Path, field: str, value: object) -> bytes:
    m = json.loads((store / "manifest.json").read_text())
    assert m[field] != value
    (store / "manifest.json").write_text(json.dumps(dict(m, **{field: value})))
    return (store / "manifest.json").read_bytes()


@pytest.mark.parametrize("field, value", EDITS)
def test_verify_names_an_edited_field_and_what_to_put_back(cli, store, field, value):
    built = json.loads((store / "manifest.json").read_text())[field]
    edit(store, field, value)
    code, out, _ = cli("verify", store, "--json")
    report = json.loads(out)
    assert code == 1 and not report["ok"]
    assert [(d["what"], d["file"]) for d in report["damaged"]] == [(f"manifest {field}", str(store / "manifest.json"))]
    assert f'"{field}": {json.dumps(built)}' in report["repair"][0]
    code, out, err = cli("verify", store, "--repair")
    assert code == 1 and f'"{field}": {json.dumps(built)}' in err


@pytest.mark.parametrize("field, value", EDITS)
def test_readers_and_writers_refuse_an_edited_field_in_one_line(cli, store, field, value):
    before = edit(store, field, value)
    for args in (("info", store), ("eval", "recall", store), ("merge", store, "--backend", "cpu"),
                 ("export", store, "-o", store.parent / "g.npz")):
        code, out, err = cli(*args)
        assert_one_line_error(code, out, err, str(store / "manifest.json"), f"{field} is {value!r}")
    with pytest.raises(BadInput, match=f"{field} is"):
        Store.open(store, pin=False)
    assert (store / "manifest.json").read_bytes() == before
    assert not (store.parent / "g.npz").exists()


def test_a_store_without_the_record_is_read_and_gets_it_from_its_next_writer(cli, store):
    meta_path = store / identity.GROUP
    meta = json.loads(meta_path.read_text())
    del meta["attributes"]["bigknn"][identity.KEY]
    meta_path.write_text(json.dumps(meta))
    edit(store, "metric", "cosine")  # an older store cannot tell: what its manifest says is what it is
    assert cli("verify", store)[0] == 0
    with WriterLock(store):
        writer = Store.open(store, pin=False)
        writer.commit()
        writer.close()
    assert identity.recorded(store) == {"dim": 8, "dtype": "<f4", "metric": "cosine", "k": 4}
    edit(store, "metric", "l2")
    assert cli("verify", store)[0] == 1


def test_without_the_record_dim_is_still_checked_against_the_vectors(store):
    meta = json.loads((store / identity.GROUP).read_text())
    del meta["attributes"]["bigknn"][identity.KEY]
    (store / identity.GROUP).write_text(json.dumps(meta))
    edit(store, "dim", 9)
    with pytest.raises(BadInput, match="dim is 9 but shard 0's vectors have 8 columns"):
        Store.open(store)
