"""Error types that map to the CLI's exit codes (0 ok, 1 failure, 2 bad usage or input, 75 store
busy: another writer holds it, 128 + N for signal N)."""

from __future__ import annotations

import errno
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class BigknnError(Exception):
    """A failure while doing the work (exit code 1)."""

    exit_code = 1


class BadInput(BigknnError):
    """Bad input or usage (exit code 2); the message names the file and the problem in one line."""

    exit_code = 2

    def __init__(self, path: object, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class StoreBusy(BigknnError):
    """Another writer holds the store's lock (exit code 75, EX_TEMPFAIL: try again later)."""

    exit_code = 75


class DiskFull(BigknnError):
    """No space left for a write (exit code 1): the message names the file, the bytes the write needed and
    what is free, so the user knows how much to free before rerunning."""

    exit_code = 1

    def __init__(self, path: object, needed: int | None):
        self.path = str(path)
        need = f"needs {needed:,} bytes" if needed is not None else "needs more space"
        super().__init__(f"{self.path}: no space left on device (this write {need}, {free_bytes(Path(path)):,} "
                         "bytes free); free some space and rerun (a store keeps its last commit)")


class Interrupted(BaseException):
    """SIGINT or SIGTERM, raised in the main thread so that both unwind alike (context managers release the
    lock, temporary files are removed) and the CLI exits 128 + the signal number. A BaseException, like
    KeyboardInterrupt, so that no ``except Exception`` swallows it."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signum)


@contextmanager
def disk_full_named(path: object, needed: int | None) -> Iterator[None]:
    """Turn a full disk (ENOSPC, EDQUOT) inside the block into ``DiskFull`` naming ``path``: the OS error
    alone names no file (a ``write`` has none) and no size."""
    try:
        yield
    except OSError as e:
        if e.errno not in _DISK_FULL:
            raise
        raise DiskFull(path, needed) from None


def free_bytes(path: Path) -> int:
    """Free bytes on the file system holding ``path`` (its nearest existing ancestor)."""
    for p in (path, *path.absolute().parents):
        if p.exists():
            return shutil.disk_usage(p).free
    return 0


class Damaged(BigknnError):
    """A store file is missing or fails its checksum (exit 1): reads stop here, they never return zeros.
    ``where`` names the shard and array, ``file`` the file; ``bigknn verify`` lists every such file and what
    repairs it."""

    exit_code = 1

    def __init__(self, file: object, problem: str, where: str = ""):
        self.file = str(file)
        self.problem = problem
        self.where = where
        super().__init__(f"{where}: {self.file}: {problem}" if where else f"{self.file}: {problem}")
