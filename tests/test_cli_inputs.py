"""The command line on bad input (docs/design.md reliability rules: one line naming the file, exit 2, nothing
written, a finished store left byte-identical), and `bigknn synth`'s rows (seeded, thread-independent,
continued with --first-row), as a user runs them (``python -m bigknn ...`` in a subprocess)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from bigknn.formats import open_vectors, write_vectors
from bigknn.core.synth import synth

from conftest import assert_one_line_error, run_cli, run_json, tree_hashes


# ---- bad inputs (docs/design.md reliability rules) --------------------------------------------
def make_bad_input(case: str, d: Path) -> Path:
    """Write one kind of bad input file into ``d``; return its path."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((300, 16)).astype(np.float32)
    if case == "truncated":
        p = d / "trunc.fbin"
        write_vectors(p, x)
        with open(p, "r+b") as f:
            f.truncate(p.stat().st_size - 37)
    elif case == "header_mismatch":
        p = d / "header.fbin"
        write_vectors(p, x)
        with open(p, "ab") as f:  # trailing bytes: the header says fewer rows than the file holds
            f.write(x[:3].tobytes())
    elif case in ("nan", "inf"):
        p = d / f"{case}row.fbin"
        x[123, 5] = np.nan if case == "nan" else -np.inf
        write_vectors(p, x)
    elif case == "k_too_big":
        p = d / "few.fbin"
        write_vectors(p, x[:10])
    elif case == "empty":
        p = d / "empty.fbin"
        p.write_bytes(b"")
    elif case == "unknown_ext":
        p = d / "vectors.txt"
        p.write_text("1 2 3\n")
    elif case == "missing":
        p = d / "missing.fbin"
    else:
        raise AssertionError(case)
    return p


BAD_CASES = ["truncated", "header_mismatch", "nan", "inf", "k_too_big", "empty", "unknown_ext", "missing"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_fresh_store(tmp_path, case):
    (tmp_path / "in").mkdir()
    bad = make_bad_input(case, tmp_path / "in")
    store = tmp_path / "store"
    code, out, err = run_cli("build", bad, "-o", store, "--k", 10, "--backend", "cpu")
    assert_one_line_error(code, out, err, bad.name)
    assert not store.exists(), f"{case}: a store directory was created"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("small")
    write_vectors(d / "base.fbin", synth(2000, 16, seed=3))
    run_json("build", d / "base.fbin", "-o", d / "store", "--k", 5, "--shard-rows", 1000, "--backend", "cpu")
    return d


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_leaves_a_finished_store_byte_identical(small_store, tmp_path, case):
    store = small_store / "store"
    bad = make_bad_input(case, tmp_path)
    before = tree_hashes(store)
    code, out, err = run_cli("build", bad, "-o", store, "--k", 10 if case == "k_too_big" else 5,
                             "--shard-rows", 1000, "--backend", "cpu")
    line = assert_one_line_error(code, out, err)
    assert bad.name in line or str(store) in line, line
    after = tree_hashes(store)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"{case}: files of the store changed: {changed}"


def test_changed_input_file_of_a_finished_store_is_refused_untouched(tmp_path, small_fbin):
    """The store's own input file, rewritten in place with a NaN row (same size): refused, store untouched."""
    data, x = small_fbin
    x = x.copy()
    run_json("build", data, "-o", tmp_path / "store", "--k", 5, "--shard-rows", 1000, "--backend", "cpu")
    before = tree_hashes(tmp_path / "store")
    x[77, 3] = np.nan
    time.sleep(0.01)
    write_vectors(data, x)
    code, out, err = run_cli("build", data, "-o", tmp_path / "store", "--k", 5, "--shard-rows", 1000,
                             "--backend", "cpu")
    assert_one_line_error(code, out, err)
    after = tree_hashes(tmp_path / "store")
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"files of the store changed: {changed}"


def test_synth_rows_do_not_depend_on_threads():
    from bigknn.core.synth import BLOCK_ROWS, synth_blocks

    rows = 2 * BLOCK_ROWS + 123  # a short last block
    one = np.concatenate(list(synth_blocks(rows, 8, seed=5, threads=1)))
    many = np.concatenate(list(synth_blocks(rows, 8, seed=5, threads=3)))
    assert one.shape == (rows, 8)
    np.testing.assert_array_equal(one, many)
    assert not np.array_equal(one, np.concatenate(list(synth_blocks(rows, 8, seed=6, threads=3))))


def test_nan_in_a_late_shard_stops_the_overlapped_build(tmp_path):
    """GNND already runs on the first shards when the sharding pass meets a NaN row in the last one: the
    build stops with the one-line error and exit 2, and leaves no store behind."""
    x = synth(6000, 16, seed=4)
    x[5500, 2] = np.nan
    bad = tmp_path / "late_nan.fbin"
    write_vectors(bad, x)
    store = tmp_path / "store"
    code, out, err = run_cli("build", bad, "-o", store, "--k", 10, "--shard-rows", 1000, "--backend", "cpu")
    line = assert_one_line_error(code, out, err, bad.name)
    assert "5500" in line, line
    assert not store.exists()


@pytest.mark.parametrize("first", [0, 1000, 65536, 65536 + 77])  # BLOCK_ROWS = 65536: on and off a border
def test_synth_first_row_continues_the_same_set(tmp_path, first):
    """``--first-row N`` writes rows N.. of the larger set: the tail of one longer stream, whatever N is,
    drawn from the same clusters as a file of N rows."""
    from bigknn.core.synth import synth_blocks

    rows = 2000
    longer = np.concatenate(list(synth_blocks(first + rows, 8, seed=5, threads=2)))
    tail = np.concatenate(list(synth_blocks(rows, 8, seed=5, threads=3, first_row=first)))
    assert tail.shape == (rows, 8)
    np.testing.assert_array_equal(tail, longer[first:])
    out = tmp_path / "new.fbin"
    res = run_json("synth", out, "--rows", rows, "--dim", 8, "--seed", 5, "--first-row", first)
    assert res["first_row"] == first
    np.testing.assert_array_equal(open_vectors(out).read(0, rows), longer[first:])
