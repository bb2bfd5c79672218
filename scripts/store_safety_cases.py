"""An adversarial pass over a store: links, hard links, permissions, a second file system, leases, the lock,
chunk checksums and environment variables. Each case sets up a copy of one small store, runs bigknn and checks
what must hold (a refusal naming the path, a file outside left byte-identical, damage reported); the table
printed is the one in docs/store-safety.md.

Permission cases drop the capabilities that let root ignore file modes (setpriv), so they mean the same run as
root or as a user; they are reported as not run where setpriv is missing.

    python scripts/store_safety_cases.py                 # every case, a Markdown table on stdout
    python scripts/store_safety_cases.py --only lock     # the cases whose name contains "lock"
    python scripts/store_safety_cases.py --json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
NOCAP = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", "--"]
SECOND_FS = Path("/dev/shm")  # tmpfs: another file system than the working directory's (checked below)
CASES: list[tuple[str, str, str, Callable[["Lab"], tuple[bool, str]]]] = []


def case(category: str, name: str, expected: str):
    def add(fn):
        CASES.append((category, name, expected, fn))
        return fn
    return add


class Lab:
    """One built store, copied fresh for each case, and the files a case needs."""

    def __init__(self, work: Path):
        self.work = work
        env = self.env()
        subprocess.run([sys.executable, "-m", "bigknn", "synth", work / "x.fbin", "--rows", "3000", "--dim", "16"],
                       env=env, check=True, capture_output=True)
        subprocess.run([sys.executable, "-m", "bigknn", "synth", work / "y.fbin", "--rows", "200", "--dim", "16",
                        "--seed", "2"], env=env, check=True, capture_output=True)
        subprocess.run([sys.executable, "-m", "bigknn", "build", work / "x.fbin", "-o", work / "base.knn", "--k", "5",
                        "--shard-rows", "1000", "--backend", "cpu", "--json"], env=env, check=True, capture_output=True)
        self.n = 0

    @staticmethod
    def env(**more: str) -> dict:
        e = {**os.environ, "PYTHONPATH": str(ROOT), "BIGKNN_CHECKPOINT_S": "0", **more}
        e.pop("BIGKNN_DEBUG", None)
        return e

    def run(self, *args: object, nocap: bool = False, env: dict | None = None) -> tuple[int, str, str]:
        cmd = [*(NOCAP if nocap else []), sys.executable, "-m", "bigknn", *map(str, args)]
        p = subprocess.run(cmd, env=env or self.env(), capture_output=True, text=True, timeout=600)
        return p.returncode, p.stdout, p.stderr

    @property
    def y(self) -> Path:
        """The 200 rows an ingest adds."""
        return self.work / "y.fbin"

    def ingest(self, store: Path, nocap: bool = False) -> tuple[int, str, str]:
        """``bigknn ingest STORE --input y.fbin`` on the CPU."""
        return self.run("ingest", store, "--input", self.y, "--backend", "cpu", nocap=nocap)

    def damage(self, store: Path, nocap: bool = False) -> tuple[int, list[dict]]:
        """``bigknn verify STORE --json``: (exit code, the damage it lists)."""
        code, out, _ = self.run("verify", store, "--json", nocap=nocap)
        return code, json.loads(out)["damaged"] if out else []

    def store(self, where: Path | None = None) -> Path:
        self.n += 1
        dest = (where or self.work) / f"s{self.n}.knn"
        shutil.copytree(self.work / "base.knn", dest, symlinks=True)
        return dest

    def victim(self, where: Path | None = None) -> Path:
        self.n += 1
        f = (where or self.work) / f"victim{self.n}.txt"
        f.write_text("precious")
        return f

    def outside(self) -> Path:
        """A user's directory of numbered directories and old files: what a writer's cleanup would remove."""
        self.n += 1
        d = self.work / f"mine{self.n}"
        for name in ("1", "2", "3"):
            (d / name).mkdir(parents=True)
            (d / name / "keep.txt").write_text("user data")
        (d / "old.json").write_text("{}")
        for f in d.rglob("*"):
            os.utime(f, (1e9, 1e9))
        return d


def digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(Path(path).rglob("*")) if Path(path).is_dir() else [Path(path)]:
        h.update(str(f).encode())
        if f.is_file():
            h.update(f.read_bytes())
    return h.hexdigest()


def manifest(store: Path) -> dict:
    return json.loads((store / "manifest.json").read_text())


def graph_dir(store: Path, shard: int) -> Path:
    return store / "shards" / str(shard) / "graph" / str(manifest(store)["shards"][shard]["graph"])


def refusal(code: int, err: str, *names: str, exit_code: int = 2) -> tuple[bool, str]:
    lines = err.strip().splitlines()
    ok = code == exit_code and len(lines) == 1 and all(n in err for n in names) and "Traceback" not in err
    return ok, f"exit {code}: {lines[-1][:150] if lines else '(no message)'}"


def ran(code: int, err: str) -> tuple[bool, str]:
    return code == 0, f"exit {code}" + (f": {err.strip().splitlines()[-1][:150]}" if code else "")


class Kept:
    """A file or directory whose bytes a case must leave as they were: ``note()`` says whether it did."""

    def __init__(self, path: Path, name: str = "target", unchanged: str = "untouched"):
        self.path, self.name, self.unchanged = path, name, unchanged
        self.before = digest(path)

    def holds(self) -> bool:
        return digest(self.path) == self.before

    def note(self) -> str:
        return f"{self.name} {self.unchanged}" if self.holds() else f"{self.name.upper()} CHANGED"

    def and_(self, result: tuple[bool, str]) -> tuple[bool, str]:
        """``result`` (a refusal's) and the bytes kept."""
        return result[0] and self.holds(), f"{result[1]}; {self.note()}"


# ---- symbolic links --------------------------------------------------------------------------------------
def link_case(rel: str, *args: str, directory: bool = False, expect_name: str | None = None,
              says: str = "symbolic link"):
    def fn(lab: Lab) -> tuple[bool, str]:
        s = lab.store()
        target = lab.outside() if directory else lab.victim()
        if rel == "manifest.json":  # a valid manifest behind the link: the writer gets as far as its lock
            target.write_bytes((s / rel).read_bytes())
        kept = Kept(target)
        p = s / rel
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        p.parent.mkdir(parents=True, exist_ok=True)
        p.symlink_to(target, target_is_directory=directory)
        code, _, err = lab.run(*[a.replace("STORE", str(s)).replace("Y", str(lab.y)) for a in args])
        return kept.and_(refusal(code, err, str(s / (expect_name or rel)), says))
    return fn


for rel, cmd, is_dir in [
    ("manifest.json", ("merge", "STORE"), False),
    ("zarr.json", ("merge", "STORE"), False),
    (".readers/4242-aaaaaaaaaaaa.json", ("merge", "STORE"), False),
    (".readers/4242-aaaaaaaaaaaa.json.tmp", ("merge", "STORE"), False),
    (".manifest.json.4242-0123abcd.tmp", ("merge", "STORE"), False),
    ("shards", ("merge", "STORE"), True),
    ("partition", ("ingest", "STORE", "--input", "Y", "--backend", "cpu"), True),
    ("shards/1/graph", ("verify", "STORE", "--repair"), True),
    ("shards/0/graph/99", ("ingest", "STORE", "--input", "Y", "--backend", "cpu"), True),
    ("search", ("prune", "STORE", "--backend", "cpu"), True),
]:
    case("symlink", f"`{rel}` a link to a user's {'directory' if is_dir else 'file'}; `bigknn {cmd[0]}`",
         "refused, exit 2, naming the link; the target untouched")(link_case(rel, *cmd, directory=is_dir))
# chunk trees are not walked by the lock-time check (bigknn/shards/safepaths.py check_store): a link there is read
# through, never written through, and its bytes are not the chunk's
case("symlink", "`shards/0/vectors/c/0/0` (inside a chunk tree) a link to a user's file; `bigknn merge`",
     "never written through: refused as damage, exit 2, naming the chunk; the target untouched")(
    link_case("shards/0/vectors/c/0/0", "merge", "STORE", says="damaged"))


@case("symlink", "`.lock` a dangling link (to a file that does not exist yet); `bigknn merge`",
      "refused, exit 2; no file created at the link's target")
def _(lab):
    s = lab.store()
    target = lab.work / f"created{lab.n}.txt"
    (s / ".lock").unlink()
    (s / ".lock").symlink_to(target)
    code, _, err = lab.run("merge", s)
    ok, now = refusal(code, err, str(s / ".lock"), "symbolic link")
    return ok and not target.exists(), now + ("" if not target.exists() else "; TARGET CREATED")


@case("symlink", "`shards/3` a dangling link (the shard an ingest writes next); `bigknn ingest`",
      "refused, exit 2; nothing created at the target")
def _(lab):
    s = lab.store()
    target = lab.work / f"nothing{lab.n}"
    (s / "shards" / "3").symlink_to(target, target_is_directory=True)
    code, _, err = lab.ingest(s)
    ok, now = refusal(code, err, str(s / "shards" / "3"), "symbolic link")
    return ok and not target.exists(), now


@case("symlink", "a link loop `shards/0/graph/98 -> 98`; `bigknn merge`", "refused, exit 2, naming it")
def _(lab):
    s = lab.store()
    (s / "shards/0/graph/98").symlink_to("98")
    code, _, err = lab.run("merge", s)
    return refusal(code, err, str(s / "shards/0/graph/98"), "symbolic link")


@case("symlink", "the store's own path is a link to the store (the user's choice); `bigknn ingest`, `verify`",
      "works: only links inside a store are refused")
def _(lab):
    s = lab.store()
    link = lab.work / f"alias{lab.n}.knn"
    link.symlink_to(s, target_is_directory=True)
    code, _, _ = lab.ingest(link)
    code2, _, _ = lab.run("verify", link)
    return code == 0 and code2 == 0, f"ingest exit {code}, verify exit {code2}"


@case("symlink", "export `-o` names a link to a user's file", "the link is replaced by the export; the file untouched")
def _(lab):
    kept = Kept(lab.victim())
    out = lab.work / f"link{lab.n}.npz"
    out.symlink_to(kept.path)
    code, _, _ = lab.run("export", lab.work / "base.knn", "-o", out)
    ok = code == 0 and not out.is_symlink() and kept.holds()
    return ok, f"exit {code}; {'link replaced' if not out.is_symlink() else 'still a link'}; {kept.note()}"


@case("symlink", "a drop folder's file is a link to a vector file elsewhere; `ingest --watch-dir`",
      "ingested (reading through a link writes nothing)")
def _(lab):
    s = lab.store()
    drop = lab.work / f"drop{lab.n}"
    drop.mkdir()
    (drop / "y.fbin").symlink_to(lab.y)
    code, out, _ = lab.run("ingest", s, "--watch-dir", drop, "--backend", "cpu", "--json")
    return code == 0 and json.loads(out)["rows_added"] == 200, f"exit {code}"


# ---- hard links ------------------------------------------------------------------------------------------
@case("hard link", "`.lock` a hard link to a user's file; `bigknn merge`", "refused, exit 2; the file untouched")
def _(lab):
    s, kept = lab.store(), Kept(lab.victim())
    (s / ".lock").unlink()
    os.link(kept.path, s / ".lock")
    code, _, err = lab.run("merge", s)
    return kept.and_(refusal(code, err, str(s / ".lock")))


@case("hard link", "a graph chunk hard-linked to a user's file; `ingest` (the version goes stale, is deleted)",
      "the store's name is removed, the user's file keeps its bytes")
def _(lab):
    s = lab.store()
    chunk = graph_dir(s, 0) / "ids" / "c" / "0" / "0"
    keep = lab.work / f"hard{lab.n}.bin"
    os.link(chunk, keep)
    kept = Kept(keep, "user's file", "intact")
    code, _, _ = lab.ingest(s)
    return code == 0 and kept.holds(), f"exit {code}; {kept.note()}"


@case("hard link", "a dead reader's lease hard-linked to a user's file; a writer commits",
      "the lease name is removed; the user's file keeps its bytes")
def _(lab):
    s, kept = lab.store(), Kept(lab.victim(), "file", "intact")
    (s / ".readers").mkdir(exist_ok=True)
    lease = s / ".readers" / "999999999-aaaaaaaaaaaa.json"
    os.link(kept.path, lease)
    os.utime(kept.path, (1e9, 1e9))  # not JSON: an opening reader's until it expires, which it has
    code, _, _ = lab.ingest(s)
    return code == 0 and kept.holds() and not lease.exists(), \
        f"exit {code}; lease {'removed' if not lease.exists() else 'kept'}; {kept.note()}"


@case("hard link", "`manifest.json` hard-linked to a user's copy; `ingest` commits",
      "the commit renames a new manifest in: the user's copy keeps the old one")
def _(lab):
    s = lab.store()
    copy = lab.work / f"manifest-copy{lab.n}.json"
    os.link(s / "manifest.json", copy)
    kept = Kept(copy)
    code, _, _ = lab.ingest(s)
    return code == 0 and kept.holds(), f"exit {code}"


@case("hard link", "the export target is a hard link to another file", "the other name keeps its bytes")
def _(lab):
    kept = Kept(lab.victim())
    out = lab.work / f"hl{lab.n}.npz"
    os.link(kept.path, out)
    code, _, _ = lab.run("export", lab.work / "base.knn", "-o", out)
    return code == 0 and kept.holds(), f"exit {code}"


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


# ---- the lock and leases ------------------------------------------------------------------------------------
HOLD = ("import sys, time; from bigknn.shards import WriterLock\n"
        "with WriterLock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)")


@contextmanager
def held(lab: Lab, store: Path) -> Iterator[None]:
    """Another process holds the store's writer lock until the block ends (then it is killed)."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(store)], env=lab.env(), stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        yield
    finally:
        p.kill()


@case("lock", "`.lock` deleted while a writer holds the store; a second `merge`", "busy, exit 75")
def _(lab):
    s = lab.store()
    with held(lab, s):
        (s / ".lock").unlink()
        code, _, err = lab.run("merge", s)
    return refusal(code, err, "another writer holds the store", exit_code=75)


@case("lock", "`.lock` replaced by a new file while a writer holds the store; a second `ingest`", "busy, exit 75")
def _(lab):
    s = lab.store()
    with held(lab, s):
        (s / ".lock").unlink()
        (s / ".lock").write_text("{}")
        code, _, err = lab.ingest(s)
    return refusal(code, err, "another writer holds the store", exit_code=75)


@case("lock", "the writer holding the lock is killed (SIGKILL); the next `merge`", "runs at once (exit 0)")
def _(lab):
    s = lab.store()
    with held(lab, s):
        pass
    time.sleep(0.2)
    code, _, err = lab.run("merge", s)
    return ran(code, err)


def lease_case(name: str, expected: str, info: dict, mtime_offset: float, kept: bool):
    def fn(lab):
        s = lab.store()
        (s / ".readers").mkdir(exist_ok=True)
        lease = s / ".readers" / f"{info.get('pid', 1)}-abcdefabcdef.json"
        lease.write_text(json.dumps(info))
        t = time.time() + mtime_offset
        os.utime(lease, (t, t))
        code, _, _ = lab.ingest(s)
        return code == 0 and lease.exists() == kept, f"exit {code}; lease {'kept' if lease.exists() else 'removed'}"
    case("lease", name, expected)(fn)


HOST = socket.gethostname()
lease_case("a lease of unparsable JSON (a reader writing it), fresh", "kept (an opening reader)", {}, 0, True)
lease_case("a lease of a live pid on this host without a start time (older bigknn), 1 h old",
           "removed: expired by age", {"pid": os.getpid(), "host": HOST, "graphs": None}, -3600, False)
lease_case("a lease naming pid 2^40 on this host", "removed: no such process", {"pid": 1 << 40, "host": HOST,
                                                                                 "graphs": None}, 0, False)
lease_case("a lease from another host refreshed now", "kept", {"pid": 7, "host": "elsewhere.example", "graphs": None},
           0, True)
lease_case("a lease from another host dated 1 day ahead", "removed, with a warning", {"pid": 7, "host": "else.example",
                                                                                      "graphs": None}, 86400, False)
lease_case("a lease from another host silent for 11 min", "removed: expired", {"pid": 7, "host": "else.example",
                                                                              "graphs": None}, -660, False)


@case("lease", "a directory named like a lease in `.readers`", "left alone (not a reader's file)")
def _(lab):
    s = lab.store()
    d = s / ".readers" / "4242-aaaaaaaaaaaa.json"
    d.mkdir(parents=True)
    code, _, _ = lab.ingest(s)
    return code == 0 and d.is_dir(), f"exit {code}"


# ---- checksums -------------------------------------------------------------------------------------------------
def swap_case(name: str, src: Callable[[Path], Path], dst: Callable[[Path], Path]):
    def fn(lab):
        s = lab.store()
        a, b = src(s), dst(s)
        if a.stat().st_size != b.stat().st_size:
            return False, "sizes differ: not a swap"
        shutil.copyfile(a, b)
        code, damage = lab.damage(s)
        return code == 1 and str(b) in [d["file"] for d in damage], f"exit {code}; {len(damage)} damaged"
    case("checksum", name, "damage: verify exit 1 naming the chunk")(fn)


swap_case("shard 1's vectors chunk copied over shard 0's", lambda s: s / "shards/1/vectors/c/0/0",
          lambda s: s / "shards/0/vectors/c/0/0")
swap_case("a graph's dists chunk copied over its ids chunk (same size)",
          lambda s: graph_dir(s, 0) / "dists/c/0/0", lambda s: graph_dir(s, 0) / "ids/c/0/0")
swap_case("shard 2's graph ids chunk copied over shard 1's", lambda s: graph_dir(s, 2) / "ids/c/0/0",
          lambda s: graph_dir(s, 1) / "ids/c/0/0")


@case("checksum", "a graph version's whole array directory copied over another shard's",
      "damage: the array's metadata was written for another place")
def _(lab):
    s = lab.store()
    dst = graph_dir(s, 0) / "ids"
    shutil.rmtree(dst)
    shutil.copytree(graph_dir(s, 1) / "ids", dst)
    code, damage = lab.damage(s)
    problems = [d["problem"] for d in damage]
    return code == 1 and any("another place" in p or "written for" in p for p in problems), f"exit {code}"


@case("checksum", "a store renamed (mv) and verified", "exit 0: places are relative to the store")
def _(lab):
    s = lab.store()
    moved = s.with_name(s.name + ".moved")
    s.rename(moved)
    code, _, err = lab.run("verify", moved)
    return ran(code, err)


@case("checksum", "a format-6 array's table of checksums cut short", "damage, exit 1")
def _(lab):
    s = lab.store()
    meta_path = s / "shards/0/vectors/zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["attributes"]["bigknn_chunks"]["crc32c"] = []
    meta_path.write_text(json.dumps(meta))
    code, _ = lab.damage(s)
    return code == 1, f"exit {code}"


# ---- environment ---------------------------------------------------------------------------------------------
for var, value in [("BIGKNN_LOG_EVERY_S", "1e309"), ("BIGKNN_CHECKPOINT_S", "nan"),
                   ("DASK_SCHEDULER_ADDRESS", "local:0")]:
    def fn(lab, var=var, value=value):
        code, _, err = lab.run("merge", lab.store(), env=lab.env(**{var: value}))
        return refusal(code, err, var if var != "DASK_SCHEDULER_ADDRESS" else "local:0")
    case("environment", f"{var}={value}", "refused, exit 2, naming it")(fn)


@case("environment", "BIGKNN_CHECKPOINT_S set but empty", "the default: works")
def _(lab):
    code, _, err = lab.run("merge", lab.store(), env=lab.env(BIGKNN_CHECKPOINT_S=""))
    return ran(code, err)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bigknn-cases-", dir=".") as tmp:
        lab = Lab(Path(tmp).resolve())
        for n, (category, name, expected, fn) in enumerate(CASES, 1):
            if args.only not in name:
                continue
            try:
                ok, now = fn(lab)
            except Exception as e:  # noqa: BLE001 - a case that breaks is reported, not hidden
                ok, now = False, f"case failed: {type(e).__name__}: {e}"[:200]
            rows.append({"n": n, "category": category, "case": name, "expected": expected, "now": now, "ok": ok})
            print(f"{'ok  ' if ok else 'FAIL'} {n}. {name}: {now}", file=sys.stderr)
        subprocess.run(["chmod", "-R", "u+rwx", tmp])
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| # | kind | case | expected | now | |\n|---|---|---|---|---|---|")
    for r in rows:
        cells = [str(r["n"]), r["category"], r["case"], r["expected"], r["now"].replace("|", "\\|"),
                 "pass" if r["ok"] else "**FAIL**"]
        print("| " + " | ".join(cells) + " |")
    passed = sum(r["ok"] for r in rows)
    print(f"\n{passed} of {len(rows)} cases pass.")


if __name__ == "__main__":
    main()
