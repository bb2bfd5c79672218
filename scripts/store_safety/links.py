"""Cases: symbolic and hard links inside a store, to files and directories outside it."""

from __future__ import annotations

import json
import os
import shutil

from store_safety.lab import Kept, Lab, case, graph_dir, refusal


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
