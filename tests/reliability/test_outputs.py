"""Issue 11, Deliver 4: every file a command writes for the user is written under a temporary name in its
directory, fsynced, then renamed, so a failed write leaves any previous file byte-identical."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from bigknn.cli import cli

from conftest import read_manifest, run_cli, run_json, write_synth

ROWS, DIM = 2000, 8


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("outputs")
    write_synth(d / "in.fbin", ROWS, DIM, seed=2)
    run_json("build", d / "in.fbin", "-o", d / "store", "--k", 5, "--shard-rows", 1000, "--backend", "cpu")
    return d / "store"


@pytest.fixture
def io_events(monkeypatch) -> list[tuple]:
    """Every os.fsync (with the path of its descriptor) and os.replace this process makes, in order."""
    events: list[tuple] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst, *args, **kwargs) -> None:
        events.append(("replace", os.fspath(src), os.fspath(dst)))
        real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def assert_written_atomically(events: list[tuple], final: Path) -> None:
    """``final`` came from a temporary file in its own directory that was fsynced before the rename, and
    the directory was fsynced after it."""
    final = final.resolve()
    renames = [i for i, e in enumerate(events) if e[0] == "replace" and Path(e[2]).resolve() == final]
    assert renames, f"{final.name} was not renamed into place (written in place?): {events}"
    i = renames[-1]
    tmp = Path(events[i][1]).resolve()
    assert tmp != final and tmp.parent == final.parent
    assert ("fsync", str(tmp)) in events[:i], f"{tmp.name} was not fsynced before its rename: {events}"
    assert ("fsync", str(final.parent)) in events[i + 1:], f"the directory was not fsynced after the rename: {events}"


@pytest.mark.parametrize("args,outputs", [
    (["export", "{store}", "-o", "{d}/g.ibin"], ["g.ibin"]),
    (["export", "{store}", "-o", "{d}/g.npy", "--format", "npy"], ["g.npy", "g.dists.npy"]),
    (["synth", "{d}/x.fbin", "--rows", "100", "--dim", "4"], ["x.fbin"]),
    (["synth", "{d}/x.npy", "--rows", "100", "--dim", "4"], ["x.npy"]),
])
def test_every_output_is_fsynced_then_renamed_into_place(store, tmp_path, io_events, args, outputs):
    cli.main([a.format(store=store, d=tmp_path) for a in args] + ["--json"], standalone_mode=False)
    for name in outputs:
        assert_written_atomically(io_events, tmp_path / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(outputs)  # no temporary file left


@pytest.mark.parametrize("fmt,names", [("npy", ["g.npy", "g.dists.npy"]), ("ibin", ["g.ibin"])])
def test_failed_export_leaves_the_previous_files_byte_identical(store, tmp_path, fmt, names):
    """Reproduction: a failed `export --format npy` destroyed the previous file (it was written in place).
    The ibin case passed before too (its writer already renamed); it guards the shared helper."""
    out = tmp_path / "out"
    out.mkdir()
    run_json("export", store, "-o", out / names[0], "--format", fmt)
    before = {n: (out / n).read_bytes() for n in names}
    damaged = tmp_path / "damaged"
    shutil.copytree(store, damaged)
    version = read_manifest(damaged)["shards"][1]["graph"]
    chunk = damaged / "shards" / "1" / "graph" / str(version) / "ids" / "c" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:100])  # shard 0 is exported, then reading shard 1 fails
    code, out_text, err = run_cli("export", damaged, "-o", out / names[0], "--format", fmt)
    assert code != 0 and "Traceback" not in err, err
    assert {n: (out / n).read_bytes() for n in names} == before
    assert sorted(p.name for p in out.iterdir()) == sorted(names)  # no temporary file left behind
