"""The cron job (scripts/cron/bigknn-ingest.sh) run as cron runs it: ``env -i PATH=/usr/bin:/bin`` plus the
variables a crontab sets, bigknn found through BIGKNN as crontab.example says. Whether a file is still being
written is decided by its mtime against BIGKNN_SETTLE_S, set far apart here, so no verdict depends on timing."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bigknn
from bigknn.formats import write_vectors
from bigknn.shards import WriterLock

from conftest import CLI_TIMEOUT_S

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "cron" / "bigknn-ingest.sh"
DIM, ROWS, NEW = 8, 600, 50
SETTLE_S = 3600
SETTLED = -2 * SETTLE_S  # an mtime this far in the past: settled


@pytest.fixture
def job(tmp_path) -> dict:
    """A finished store, an empty drop folder, and the cron environment that points the script at them."""
    rng = np.random.default_rng(7)
    store = tmp_path / "s.knn"
    bigknn.build(rng.normal(size=(ROWS, DIM)).astype(np.float32), k=5, store=store, backend="cpu").close()
    drop = tmp_path / "drop"
    drop.mkdir()
    env = {"PATH": "/usr/bin:/bin",  # cron's
           "BIGKNN": f"{sys.executable} -m bigknn",  # crontab.example's BIGKNN line, for this interpreter
           "PYTHONPATH": str(REPO),  # this checkout's bigknn, installed or not
           "BIGKNN_STORE": str(store), "BIGKNN_DROP": str(drop), "BIGKNN_LOG": str(tmp_path / "ingest.log"),
           "BIGKNN_SETTLE_S": str(SETTLE_S), "BIGKNN_BACKEND": "cpu", "BIGKNN_WAIT": "0",
           "BIGKNN_TRUST_WRITERS": "1"}  # tmp_path is under /tmp, which every user can write (the root check)
    return {"store": store, "drop": drop, "env": env, "log": tmp_path / "ingest.log", "rng": rng, "tmp": tmp_path}


def vectors(job: dict, name: str, dim: int = DIM, age_s: int = SETTLED, rows: int = NEW) -> Path:
    """A file of ``rows`` random rows in the drop folder, last modified ``age_s`` seconds from now."""
    path = job["drop"] / name
    write_vectors(path, job["rng"].normal(size=(rows, dim)).astype(np.float32))
    age(path, age_s)
    return path


def age(path: Path, age_s: int) -> None:
    t = os.stat(path).st_mtime + age_s
    os.utime(path, (t, t), follow_symlinks=False)


def run_cron(job: dict, **env: str) -> tuple[int, list[dict], str]:
    """The script's exit code, the log's records, its stderr."""
    variables = [f"{k}={v}" for k, v in {**job["env"], **env}.items()]
    proc = subprocess.run(["env", "-i", *variables, str(SCRIPT)], capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    log = job["log"].read_text() if job["log"].exists() else ""
    return proc.returncode, [json.loads(line) for line in log.splitlines()], proc.stderr


def store_rows(job: dict) -> int:
    proc = subprocess.run([sys.executable, "-m", "bigknn", "info", str(job["store"]), "--json"],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)["rows"]


def test_good_ingested_bad_rejected_growing_left(job):
    vectors(job, "good.fbin")
    vectors(job, "bad.fbin", dim=DIM + 1)
    vectors(job, "growing.fbin", age_s=0)  # modified just now: within the settle time
    code, records, err = run_cron(job)
    assert code == 3, err  # done, with a rejection to look at
    assert store_rows(job) == ROWS + NEW
    drop = job["drop"]
    assert not (drop / "bad.fbin").exists() and (drop / ".rejected" / "bad.fbin").is_file()
    reason = (drop / ".rejected" / "bad.fbin.reason").read_text()
    assert "bad.fbin" in reason and "dimension" in reason.lower()
    assert (drop / "growing.fbin").is_file() and (drop / "good.fbin").is_file()
    [record] = records
    assert record["exit"] == 3 and record["ingested"] == ["good.fbin"] and record["rows_added"] == NEW
    assert record["rows"] == ROWS + NEW and record["left"] == ["growing.fbin"]
    assert [r["file"] for r in record["rejected"]] == ["bad.fbin"] and record["rejected"][0]["reason"] == reason.strip()
    assert record["seconds"] > 0 and "error" not in record

    # the next run: nothing new; the ingested file is counted, not listed again
    code, records, err = run_cron(job)
    assert code == 0, err
    assert len(records) == 2
    second = records[1]
    assert second["ingested"] == [] and second["rejected"] == [] and second["left"] == ["growing.fbin"]
    assert second["already_ingested"] == 1 and "good.fbin" not in json.dumps(second)
    assert store_rows(job) == ROWS + NEW

    # once the growing file has settled, a run takes it (and, asked to, moves it to .done)
    age(drop / "growing.fbin", SETTLED)
    code, records, err = run_cron(job, BIGKNN_DONE="1")
    assert code == 0, err
    assert records[2]["ingested"] == ["growing.fbin"] and records[2]["left"] == []
    assert (drop / ".done" / "growing.fbin").is_file() and not (drop / "growing.fbin").exists()
    assert store_rows(job) == ROWS + 2 * NEW

    # without the job's list of ingested files, the store knows them (size and sha256): counted, not listed
    seen = Path(f"{job['store']}.ingested")
    seen.unlink()
    code, records, err = run_cron(job)
    assert code == 0, err
    assert records[3]["ingested"] == [] and records[3]["already_ingested"] == 1
    assert "good.fbin" in seen.read_text() and store_rows(job) == ROWS + 2 * NEW


def test_every_kind_of_bad_file_is_rejected_with_its_reason_and_links_are_not_followed(job):
    drop = job["drop"]
    x = job["rng"].normal(size=(NEW, DIM)).astype(np.float32)
    x[3, 2] = np.nan
    write_vectors(drop / "nan.fbin", x)
    vectors(job, "truncated.fbin")
    os.truncate(drop / "truncated.fbin", 8 + DIM * 4 * NEW // 2)
    (drop / "notes.txt").write_text("not vectors")
    odd = 'day "2" día.fbin'  # a name JSON escapes (bigknn's errors are JSON under --json)
    vectors(job, odd, dim=DIM + 1)
    outside = vectors(job, "outside.fbin")
    target = job["tmp"] / "outside.fbin"
    outside.rename(target)
    (drop / "link.fbin").symlink_to(target)
    (drop / ".rejected").mkdir()
    (drop / ".rejected" / "nan.fbin").write_text("an earlier rejected file of the same name")
    for p in ("nan.fbin", "truncated.fbin", "notes.txt", "link.fbin"):
        age(drop / p, SETTLED)
    target_bytes = target.read_bytes()

    code, [record], err = run_cron(job)
    assert code == 3, err
    reasons = {r["file"]: r["reason"] for r in record["rejected"]}
    assert set(reasons) == {"nan.fbin", "truncated.fbin", "notes.txt", "link.fbin", odd}
    assert reasons[odd].startswith(f"{drop / odd}: ") and (drop / ".rejected" / f"{odd}.reason").is_file()
    assert "nan" in reasons["nan.fbin"].lower()
    assert "truncated.fbin" in reasons["truncated.fbin"] and "notes.txt" in reasons["notes.txt"]
    assert "link" in reasons["link.fbin"]
    assert record["ingested"] == [] and store_rows(job) == ROWS
    rejected = drop / ".rejected"
    assert (rejected / "nan.fbin").read_text() == "an earlier rejected file of the same name"  # not replaced
    assert (rejected / "nan.fbin.1").is_file() and "nan" in (rejected / "nan.fbin.1.reason").read_text().lower()
    assert (rejected / "link.fbin").is_symlink() and target.read_bytes() == target_bytes
    assert sorted(p.name for p in drop.iterdir()) == [".rejected"]


def test_a_missing_bigknn_or_store_stops_the_run_before_any_file_moves(job):
    vectors(job, "good.fbin")
    code, [record], err = run_cron(job, BIGKNN="/nonexistent/venv/bin/bigknn")
    assert code == 78 and record["exit"] == 78
    assert "/nonexistent/venv/bin/bigknn" in record["error"] and "not found" in record["error"]
    assert json.loads(err.split("bigknn-ingest.sh: ", 1)[1]) == record  # cron mails the same line
    # a store bigknn refuses is no reason to reject the files
    missing = job["tmp"] / "missing.knn"
    code, records, err = run_cron(job, BIGKNN_STORE=str(missing))
    assert code == 2 and records[1]["exit"] == 2 and str(missing) in records[1]["error"], err
    assert records[1]["untried"] == ["good.fbin"] and records[1]["rejected"] == []
    assert sorted(p.name for p in job["drop"].iterdir()) == ["good.fbin"]


def test_an_overlapping_run_exits_75_and_moves_nothing(job):
    vectors(job, "good.fbin")
    vectors(job, "bad.fbin", dim=DIM + 1)
    with open(job["log"], "a") as held:  # another run of the job holds the drop folder
        fcntl.flock(held, fcntl.LOCK_EX)
        code, [record], _ = run_cron(job)
    assert code == 75 and record["exit"] == 75 and "another run" in record["error"]
    with WriterLock(job["store"], 0):  # another writer (a build, a merge, an ingest by hand) holds the store
        code, records, _ = run_cron(job)
    assert code == 75 and records[1]["exit"] == 75 and sorted(records[1]["untried"]) == ["bad.fbin", "good.fbin"]
    assert sorted(p.name for p in job["drop"].iterdir()) == ["bad.fbin", "good.fbin"]
    assert store_rows(job) == ROWS
