"""Issue 42, item 4: every --help option says what it does, and every --help example runs as written on small
data (a newcomer copies them). Each example runs in a fresh directory holding the small files its help
assumes the reader has (their data, a finished store), minus what the example itself makes; a file an example
reads that is not the reader's own must be made by an earlier example of the same help. The few examples that
need what no test machine has are listed, each with its reason."""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

from bigknn.cli.app import cli
from bigknn.formats import write_vectors
from bigknn.core.synth import synth

ROWS, DIM = 2000, 96  # the examples' queries are made with --dim 96
# what a reader brings: their data, and the finished, pruned store the quick start made
USER_FILES = ("data.fbin", "emb.npy", "day1.fbin", "day2.fbin", "big.fbin", "data.knn", "t2.knn",
              "parts/*.npy", "embeddings/", "2026-11-28.parquet", "emb.knn")  # the last two: a Parquet dataset's
BIG_FILES = ("deep10m.fbin", "deep1b.fbin")  # the reader's too, read only by examples NOT_HERE
NOT_HERE = {  # an example's text -> why it cannot run on a test machine
    "--gpus all": "needs GPUs",
    "--scheduler tcp://": "needs a running Dask cluster",
    "/shared/": "a path on a shared file system",
    "/srv/drop": "a drop folder another program fills",
    "--rows 100000:110000": "the quick start's 100,000 rows and an ingest after them",
}


def commands(cmd: click.Command = cli, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    found = [(path, cmd)]
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            found += commands(sub, path + (name,))
    return found


def examples(cmd: click.Command) -> list[str]:
    """The command lines of a help text's example block, comments cut."""
    text = cmd.help or ""
    block = text.split("Examples:")[-1] if "Examples:" in text else text.split("Quick start:")[-1]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip().startswith("bigknn ")]


ALL = [(" ".join(path) or "bigknn", i, line) for path, cmd in commands() for i, line in enumerate(examples(cmd))]


def outputs(argv: list[str]) -> set[str]:
    """Files a command line writes: -o's, synth's OUT."""
    made = {argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-o", "--output")}
    if argv[:1] == ["synth"]:
        made.add(argv[1])
    return made


@pytest.mark.parametrize("path,cmd", commands(), ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_every_option_is_described(path, cmd):
    bare = [p.opts for p in cmd.params if isinstance(p, click.Option) and not (p.help or "").strip()]
    assert not bare, f"bigknn {' '.join(path)}: options without help: {bare}"


def test_every_command_has_examples():
    missing = [" ".join(p) for p, c in commands() if p and not isinstance(c, click.Group) and not examples(c)]
    assert not missing, missing


def test_every_file_an_example_reads_is_the_readers_or_made_by_an_earlier_example():
    for path, cmd in commands():
        made: set[str] = set()
        for line in examples(cmd):
            if any(text in line for text in NOT_HERE):
                continue
            for part in line.split("&&"):
                argv = shlex.split(part.split("|")[0])[1:]
                reads = {a for a in argv if Path(a).suffix in (".fbin", ".ibin", ".npy", ".u8bin", ".knn")
                         and a not in outputs(argv)}
                unknown = reads - made - set(USER_FILES) - set(BIG_FILES)
                assert not unknown, f"bigknn {' '.join(path)} --help: {line!r} reads {unknown}, which no example makes"
                made |= outputs(argv)


@pytest.fixture(scope="module")
def readers_files(tmp_path_factory) -> Path:
    """The small files the examples assume the reader has."""
    d = tmp_path_factory.mktemp("reader")
    x = synth(ROWS, DIM, seed=5)
    write_vectors(d / "data.fbin", x)
    write_vectors(d / "big.fbin", x)
    np.save(d / "emb.npy", x)
    write_vectors(d / "day1.fbin", synth(100, DIM, seed=6))
    write_vectors(d / "day2.fbin", synth(100, DIM, seed=7))
    runner = CliRunner()
    for argv in (["build", "data.fbin", "-o", "data.knn", "-k", "32", "--shard-rows", "1000", "--backend", "cpu"],
                 ["prune", "data.knn"],
                 ["synth", "q.fbin", "--rows", "1000", "--dim", "96", "--seed", "1"],
                 ["truth", "data.knn", "--queries", "q.fbin", "-o", "gt.ibin"],
                 ["truth", "data.knn", "--queries", "data.fbin", "--k", "11", "-o", "rows_gt.ibin"],
                 ["synth", "new.fbin", "--rows", "100", "--dim", "96", "--first-row", str(ROWS)]):
        result = _invoke(runner, argv, d)
        assert result.exit_code == 0, (argv, result.output)
    shutil.copytree(d / "data.knn", d / "t2.knn")
    (d / "parts").mkdir()
    for i in range(2):
        np.save(d / "parts" / f"part-{i}.npy", x[i * ROWS // 2:(i + 1) * ROWS // 2])
    _parquet(d / "embeddings" / "part-0.parquet", x, 0)
    _parquet(d / "2026-11-28.parquet", synth(100, DIM, seed=8), ROWS)
    result = _invoke(runner, ["build", "embeddings", "-o", "emb.knn", "-k", "32", "--column", "emb",
                              "--id-column", "doc_id", "--backend", "cpu"], d)
    assert result.exit_code == 0, result.output
    assert _invoke(runner, ["prune", "emb.knn"], d).exit_code == 0
    return d


def _parquet(path: Path, x: np.ndarray, first: int) -> None:
    """A Parquet file as embedding pipelines write them: a float32 fixed-size list column and string ids."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(exist_ok=True)
    emb = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])
    ids = pa.array([f"doc-{first + i}" for i in range(len(x))])
    pq.write_table(pa.table({"doc_id": ids, "emb": emb}), path)


def _invoke(runner: CliRunner, argv: list[str], where: Path):
    """``bigknn ARGV`` run in this process (the kernels compile once) in the directory ``where``."""
    old = os.getcwd()
    os.chdir(where)
    try:
        return runner.invoke(cli, argv, catch_exceptions=True)
    finally:
        os.chdir(old)


@pytest.mark.parametrize("where,index,line", ALL, ids=[f"{w}-{i}" for w, i, _ in ALL])
def test_every_example_runs_as_written(where, index, line, readers_files, tmp_path):
    reason = next((why for text, why in NOT_HERE.items() if text in line), None)
    if reason is not None:
        return  # listed in NOT_HERE with its reason: not a silent skip
    runner = CliRunner()
    for part in line.split("&&"):
        command, _, jq = part.partition("|")
        argv = shlex.split(command)[1:]
        work = tmp_path / "work"
        if not work.exists():
            shutil.copytree(readers_files, work)
            for made in outputs(argv):  # what the example makes is not there before it
                target = work / made
                shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        result = _invoke(runner, argv, work)
        assert result.exit_code == 0, f"{line!r}: exit {result.exit_code}\n{result.output}\n{result.exception!r}"
        if jq.strip():  # `| jq .key`: the JSON object has that key
            key = jq.split(".")[-1].strip()
            assert key in json.loads(result.stdout), (line, result.stdout)
