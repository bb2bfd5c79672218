"""Cases: a store, or parts of it, on a second file system."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from store_safety.lab import SECOND_FS, Kept, Lab, case, ran, refusal


# ---- a second file system --------------------------------------------------------------------------------
def second_fs(lab: Lab) -> Path | None:
    if not SECOND_FS.is_dir() or os.stat(SECOND_FS).st_dev == os.stat(lab.work).st_dev:
        return None
    return Path(tempfile.mkdtemp(dir=SECOND_FS, prefix="bigknn-cases-"))


def fs_case(name: str, expected: str):
    def add(fn):
        def guarded(lab):
            other = second_fs(lab)
            if other is None:
                return False, f"not run: {SECOND_FS} is not another file system here"
            try:
                return fn(lab, other)
            finally:
                shutil.rmtree(other, ignore_errors=True)
        return case("second fs", name, expected)(guarded)
    return add


@fs_case("a store on tmpfs (/dev/shm): `ingest`, `verify`, two writers at once", "works; the second writer busy (75)")
def _(lab, other):
    s = lab.store(other)
    p = subprocess.Popen([sys.executable, "-m", "bigknn", "ingest", s, "--input", lab.y, "--backend", "cpu"],
                         env=lab.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.0)
    code2, _, err2 = lab.run("merge", s)
    code = p.wait()
    code3, _, _ = lab.run("verify", s)
    ok = code == 0 and code3 == 0 and code2 in (0, 75)
    return ok, f"ingest exit {code}, concurrent merge exit {code2}, verify exit {code3}"


@fs_case("a store on /work whose `.readers` links to a directory on tmpfs: `merge`", "refused, exit 2")
def _(lab, other):
    s = lab.store()
    shutil.rmtree(s / ".readers", ignore_errors=True)
    (s / ".readers").symlink_to(other, target_is_directory=True)
    (other / "4242-aaaaaaaaaaaa.json").write_text("{}")
    code, _, err = lab.run("merge", s)
    ok, now = refusal(code, err, str(s / ".readers"), "symbolic link")
    return ok and (other / "4242-aaaaaaaaaaaa.json").exists(), now


@fs_case("a store on tmpfs whose `shards/0/graph` links to /work: `ingest`", "refused, exit 2; /work untouched")
def _(lab, other):
    s = lab.store(other)
    kept = Kept(lab.outside())
    shutil.rmtree(s / "shards/0/graph")
    (s / "shards/0/graph").symlink_to(kept.path, target_is_directory=True)
    code, _, err = lab.ingest(s)
    return kept.and_(refusal(code, err, str(s / "shards/0/graph"), "symbolic link"))


@fs_case("a store copied (cp -a) from /work to tmpfs: `verify` (checksums bound to places inside the store)",
         "exit 0")
def _(lab, other):
    s = lab.store()
    dest = other / "moved.knn"
    subprocess.run(["cp", "-a", s, dest], check=True)
    code, _, err = lab.run("verify", dest)
    return ran(code, err)


@fs_case("export from a /work store to a file on tmpfs", "exit 0, the file whole (rename stays on one file system)")
def _(lab, other):
    code, _, _ = lab.run("export", lab.work / "base.knn", "-o", other / "g.npy", "--json")
    return code == 0 and (other / "g.npy").stat().st_size > 0 and not list(other.glob(".*.tmp")), f"exit {code}"


@fs_case("ingest an input on tmpfs into a /work store", "exit 0")
def _(lab, other):
    s = lab.store()
    shutil.copyfile(lab.y, other / "y.fbin")
    code, _, err = lab.run("ingest", s, "--input", other / "y.fbin", "--backend", "cpu")
    return ran(code, err)


@fs_case("`plan -o` a store path on tmpfs: the disk probe goes there", "exit 0, the probe measured on tmpfs")
def _(lab, other):
    code, out, err = lab.run("plan", lab.work / "x.fbin", "-o", other / "new.knn", "--store", lab.work / "base.knn",
                             "--backend", "cpu", "--json")
    source = json.loads(out)["assumptions"]["disk"]["source"] if code == 0 else err.strip()
    return code == 0 and str(other) in source, f"exit {code}: {source[:120]}"
