"""Issue 11, Deliver 1: a store is created only in a new path or an empty directory, and a refused build takes
back exactly what it created: never a user's directory, never the files next to the store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import bigknn
from bigknn.formats import write_vectors
from bigknn.core.synth import synth

from conftest import assert_one_line_error, run_cli, run_json, tree_hashes

ROWS, DIM, BAD_ROW = 2000, 8, 1500
BUILD = ("--k", 5, "--shard-rows", 1000, "--backend", "cpu")


def good_input(path: Path) -> Path:
    write_vectors(path, synth(ROWS, DIM, seed=1))
    return path


def late_nan_input(path: Path) -> Path:
    """NaN in the last shard: the build has created its store before the sharding pass meets the row."""
    x = synth(ROWS, DIM, seed=1)
    x[BAD_ROW, 3] = np.nan
    write_vectors(path, x)
    return path


def listing(d: Path) -> tuple[list[str], dict[str, str]]:
    """Every name under ``d`` (hidden ones included) and the bytes of every file."""
    return sorted(str(p.relative_to(d)) for p in d.rglob("*")), tree_hashes(d)


@pytest.mark.parametrize("make_input", [good_input, late_nan_input])
def test_build_into_a_directory_holding_other_files_is_refused_untouched(tmp_path, make_input):
    """Reproduction: `mkdir mydir; echo precious > mydir/thesis.txt; bigknn build nan.fbin -o mydir` deleted
    mydir; with a valid input the store's files were written among the user's."""
    data = make_input(tmp_path / "in.fbin")
    mydir = tmp_path / "mydir"
    mydir.mkdir()
    (mydir / "thesis.txt").write_text("precious\n")
    (mydir / "notes").mkdir()
    (mydir / "notes" / "a.md").write_text("more\n")
    before = listing(mydir)
    code, out, err = run_cli("build", data, "-o", mydir, *BUILD)
    assert listing(mydir) == before  # no .lock, no zarr.json: nothing touched
    line = assert_one_line_error(code, out, err, str(mydir))
    assert "not empty" in line


@pytest.mark.parametrize("make_input", [good_input, late_nan_input])
def test_build_into_the_working_directory_with_files_is_refused(tmp_path, make_input):
    """Reproduction: `-o .` emptied the working directory, the input file included."""
    make_input(tmp_path / "in.fbin")
    (tmp_path / "keep.txt").write_text("mine\n")
    before = listing(tmp_path)
    code, out, err = run_cli("build", "in.fbin", "-o", ".", *BUILD, cwd=tmp_path)
    assert listing(tmp_path) == before
    line = assert_one_line_error(code, out, err)
    assert line.startswith("bigknn: error: .: is not empty"), line


def test_build_onto_an_existing_file_is_refused(tmp_path):
    data = good_input(tmp_path / "in.fbin")
    target = tmp_path / "report.pdf"
    target.write_bytes(b"%PDF precious")
    code, out, err = run_cli("build", data, "-o", target, *BUILD)
    line = assert_one_line_error(code, out, err, str(target))
    assert "not a directory" in line
    assert target.read_bytes() == b"%PDF precious"


def test_refused_build_in_an_empty_directory_leaves_it_there_and_empty(tmp_path):
    """The directory existed before the run: only the entries the run created go."""
    data = late_nan_input(tmp_path / "in.fbin")
    store = tmp_path / "empty"
    store.mkdir()
    code, out, err = run_cli("build", data, "-o", store, *BUILD)
    assert_one_line_error(code, out, err, "in.fbin", f"row {BAD_ROW}")
    assert store.is_dir() and list(store.iterdir()) == []


def test_refused_build_removes_the_parent_directories_it_created(tmp_path):
    """Through the API, which creates a store's missing parents (the CLI refuses -o in a missing directory)."""
    data = late_nan_input(tmp_path / "in.fbin")
    with pytest.raises(bigknn.BadInput, match="in.fbin"):
        bigknn.build(data, k=5, store=tmp_path / "a" / "b" / "store", backend="cpu")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.fbin"]
    code, out, err = run_cli("build", data, "-o", tmp_path / "a" / "b" / "store", *BUILD)
    assert_one_line_error(code, out, err, str(tmp_path / "a"), "does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.fbin"]


def test_build_in_an_empty_directory_and_its_rerun_still_work(tmp_path):
    """Regression guard (passes on the old code too): an empty directory takes a store, and rerunning the
    command on the finished store resumes it (a no-op) instead of being refused as non-empty."""
    data = good_input(tmp_path / "in.fbin")
    store = tmp_path / "empty"
    store.mkdir()
    first = run_json("build", data, "-o", store, *BUILD)
    assert first["resumed"] is False and first["merges_done"] == first["merges_total"] == 1
    again = run_json("build", data, "-o", store, *BUILD)
    assert again["resumed"] is True and again["merges_done"] == 1
