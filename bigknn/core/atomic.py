"""Files that appear whole or not at all: the one way bigknn writes a file for the user or the manifest.

A file is written under a hidden temporary name in its own directory, fsynced, then renamed over the
target and the directory fsynced. A crash, a full disk or a refusal therefore leaves whatever was there
before byte-identical, and the temporary file is removed on any error (a SIGKILL can leave one behind: a
hidden ``.<name>.<pid>-<hex>.tmp``, never a half file under the real name).
"""

from __future__ import annotations

import errno
import os
import secrets
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator

from bigknn.core.errors import BadInput, disk_full_named

_NO_FALLOCATE = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)  # file systems without posix_fallocate


@contextmanager
def atomic_path(path: str | os.PathLike, size: int | None = None) -> Iterator[Path]:
    """Yield a fresh temporary path next to ``path``; when the block exits cleanly it is fsynced and
    renamed over ``path``. With ``size`` the temporary file is allocated to that many bytes first, so a
    full disk is reported before any work (and memory-mapped writes never meet one: that is a SIGBUS)."""
    path = Path(path)
    check_target(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with disk_full_named(path, size):
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise
                # the hidden temporary name means nothing to the user: name the file asked for
                raise BadInput(path, f"cannot be written ({e.strerror})") from None
            try:
                if size:
                    allocate(fd, size)
            finally:
                os.close(fd)
        with disk_full_named(path, size):  # the caller's writes: a full disk names the file asked for
            yield tmp
        with disk_full_named(path, size):
            _fsync(tmp, os.O_RDONLY)
            os.replace(tmp, path)
            _fsync(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except BaseException:
        with suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def check_target(path: Path) -> None:
    """Refuse (exit 2, nothing written) a target that is a directory or whose directory does not exist."""
    if path.is_dir():
        raise BadInput(path, "is a directory; name a file to write")
    if not path.parent.is_dir():
        problem = "is not a directory" if path.parent.exists() else "no such directory"
        raise BadInput(path.parent, f"{problem} (to write {path.name} in)")


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Replace ``path`` with ``data`` so that a reader (or a crash) sees the old or the new file, never a mix."""
    raw = data.encode() if isinstance(data, str) else data
    with atomic_path(path) as tmp, disk_full_named(path, len(raw)):
        tmp.write_bytes(raw)


def allocate(fd: int, size: int) -> None:
    """Give the open file ``fd`` ``size`` bytes on disk now (where the file system can), so a full disk is an
    error here and not a SIGBUS in a later memory-mapped write."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in _NO_FALLOCATE:
            raise
        os.ftruncate(fd, size)


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
