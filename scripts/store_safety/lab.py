"""The store-safety cases' workbench: one small built store copied fresh for each case, the registry the
cases add themselves to (``case``), and the checks they share (a one-line refusal, bytes kept)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable


ROOT = Path(__file__).resolve().parents[2]  # the checkout
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
