"""Cases: file modes obeyed as by any user (root's override capabilities dropped with setpriv)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from store_safety.lab import Kept, case, graph_dir, ran, refusal


# ---- permissions (file modes obeyed as by any user) -----------------------------------------------------
def nocap_available() -> bool:
    return shutil.which("setpriv") is not None


def read_only(path: Path) -> None:
    subprocess.run(["chmod", "-R", "a-w", path], check=True)


def perm_case(name: str, expected: str):
    def add(fn):
        def guarded(lab):
            if not nocap_available():
                return False, "not run: setpriv missing"
            return fn(lab)
        return case("permission", name, expected)(guarded)
    return add


@perm_case("a read-only store: `info`, `eval recall` (readers cannot write a lease)", "both work (exit 0)")
def _(lab):
    s = lab.store()
    read_only(s)
    c1, _, _ = lab.run("info", s, nocap=True)
    c2, _, _ = lab.run("eval", "recall", s, "--sample", "200", "--k", "5", nocap=True)
    return c1 == 0 and c2 == 0, f"info exit {c1}, eval exit {c2}"


@perm_case("a read-only store: `merge`", "refused, exit 2, naming what cannot be written")
def _(lab):
    s = lab.store()
    read_only(s)
    code, _, err = lab.run("merge", s, nocap=True)
    return refusal(code, err, str(s), "cannot be written")


@perm_case("`.readers` not writable (mode 555): `eval recall` while it cannot lease", "works (exit 0)")
def _(lab):
    s = lab.store()
    (s / ".readers").mkdir(exist_ok=True)
    os.chmod(s / ".readers", 0o555)
    code, _, err = lab.run("eval", "recall", s, "--sample", "200", "--k", "5", nocap=True)
    return ran(code, err)


@perm_case("one chunk unreadable (mode 000): `verify`", "exit 1, the chunk listed among the damage")
def _(lab):
    s = lab.store()
    chunk = s / "shards/1/vectors/c/0/0"
    os.chmod(chunk, 0)
    code, damage = lab.damage(s, nocap=True)
    files = [d["file"] for d in damage]
    return code == 1 and str(chunk) in files, f"exit {code}; listed: {files[:2]}"


@perm_case("`manifest.json` unreadable (mode 000): `info`", "refused, exit 2, naming the manifest")
def _(lab):
    s = lab.store()
    os.chmod(s / "manifest.json", 0)
    code, _, err = lab.run("info", s, nocap=True)
    return refusal(code, err, str(s / "manifest.json"))


@perm_case("an array's `zarr.json` unreadable: `verify`", "exit 1, listed as damage")
def _(lab):
    s = lab.store()
    meta = graph_dir(s, 2) / "dists" / "zarr.json"
    os.chmod(meta, 0)
    code, damage = lab.damage(s, nocap=True)
    return code == 1 and str(meta) in [d["file"] for d in damage], f"exit {code}"


@perm_case("an input file unreadable (mode 000): `build`", "refused, exit 2, naming the file")
def _(lab):
    src = lab.work / f"unreadable{lab.n}.fbin"
    shutil.copyfile(lab.y, src)
    os.chmod(src, 0)
    code, _, err = lab.run("build", src, "-o", lab.work / f"u{lab.n}.knn", "--backend", "cpu", nocap=True)
    return refusal(code, err, str(src))


@perm_case("export into a directory without write permission", "refused, exit 2, naming the file asked for")
def _(lab):
    d = lab.work / f"ro{lab.n}"
    d.mkdir()
    os.chmod(d, 0o555)
    code, _, err = lab.run("export", lab.work / "base.knn", "-o", d / "g.npz", nocap=True)
    ok, now = refusal(code, err, str(d / "g.npz"))
    return ok and ".tmp" not in err, now


@perm_case("a drop folder without read permission: `ingest --watch-dir`", "refused, exit 2, naming the folder")
def _(lab):
    s = lab.store()
    d = lab.work / f"drop{lab.n}"
    d.mkdir()
    os.chmod(d, 0)
    code, _, err = lab.run("ingest", s, "--watch-dir", d, "--backend", "cpu", nocap=True)
    return refusal(code, err, str(d))


@perm_case("the store directory read-only but `.lock` writable: `ingest`",
           "refused, exit 2, one line naming the store; the manifest unchanged")
def _(lab):
    s = lab.store()
    kept = Kept(s / "manifest.json")
    os.chmod(s, 0o555)
    code, _, err = lab.ingest(s, nocap=True)
    os.chmod(s, 0o755)
    lines = err.strip().splitlines()
    ok = code == 2 and len(lines) == 1 and str(s) in err and kept.holds()
    return ok, f"exit {code}: {lines[-1][:150] if lines else ''}"
