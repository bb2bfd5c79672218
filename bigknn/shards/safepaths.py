"""Paths a writer touches inside a store, never reached through a link.

Anyone who can write a store's directory can plant a symbolic link where bigknn owns a name (``.lock``,
``.readers``, ``shards/0/graph``, ``search``): a writer that followed it would truncate, fill or delete files
outside the store with its own rights (root's, under the cron job). So:

* a writer refuses a store that holds a symbolic link (``check_store``, when it takes the lock; arrays' chunk
  trees are not walked, its docstring says why that is safe): bigknn never makes one, so one is planted or a
  mistake; the one-line error (exit 2) names it;
* every deletion and every rename opens the directories on its way with ``O_NOFOLLOW`` relative to the
  store's own descriptor (``owned_dir``), so a link planted after that check is not followed either;
* deletions match only names bigknn creates (``is_version``, the lease and temp-file patterns of their
  modules): a stray user file in a store is never removed.

The store's own path is the user's choice and may be a link; only what is inside is bigknn's.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from bigknn.core.errors import BadInput, disk_full_named

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
VERSION = re.compile(r"[0-9]{1,18}")  # graph and search version directories, shard directories


def is_version(name: str) -> bool:
    """Whether ``name`` is one bigknn gives a version (or shard) directory: digits only."""
    return VERSION.fullmatch(name) is not None


def link_refusal(path: Path) -> BadInput:
    return BadInput(path, "is a symbolic link inside the store; bigknn never makes one and never writes, "
                          "renames or deletes through one (remove it, or put what it points to in its place)")


CHUNK_TREE = "c"  # an array's chunk files, c/<i>/0, beside its zarr.json (bigknn/shards/chunks.py)


def check_store(store: Path) -> None:
    """Refuse (exit 2) a store that holds a symbolic link where a writer could follow one (run by every writer
    once it holds the lock: no other writer adds one meanwhile).

    One walk of the store's directories that reads each one's entries and their types (``scandir``: no ``stat``
    per file on file systems that report types) and does not enter arrays' chunk trees, so its cost follows the
    store's arrays, not its chunks. No write, rename or deletion follows a link all the same: files are opened
    with ``O_NOFOLLOW``, or created with ``O_EXCL`` and renamed into place (a link at the name is refused or
    replaced, never followed); every array is written into a directory made fresh just before (``fresh_dir``:
    the old tree removed through descriptors, links in it removed themselves), so nothing is ever written into
    an existing chunk tree; and deletions open every directory without following a link (``remove_tree``). A
    link inside a chunk tree is only ever read through, where its chunk's checksum for its place calls it damage.
    """
    folders = [Path(store)]
    while folders:
        folder = folders.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:
            continue  # gone meanwhile (a reader's lease directory), or unreadable: nothing is written there
        is_array = any(e.name == "zarr.json" for e in entries) and folder != Path(store)
        for entry in entries:
            if entry.is_symlink():
                raise link_refusal(Path(entry.path))
            if entry.is_dir(follow_symlinks=False) and not (is_array and entry.name == CHUNK_TREE):
                folders.append(Path(entry.path))


def open_dir(store: Path, rel: str | Path = "", create: bool = False) -> int:
    """A descriptor of the directory ``store/rel``, each part of ``rel`` opened without following a link
    (created first with ``create``). BadInput names a part that is a link; FileNotFoundError when missing,
    NotADirectoryError when a part is a file."""
    fd = os.open(store, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    done = Path(store)
    try:
        for part in Path(rel).parts:
            done = done / part
            try:
                child = _open_child(part, fd, create)
            except OSError:
                if _is_link(part, fd):
                    raise link_refusal(done) from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_child(name: str, dir_fd: int, create: bool) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
    try:
        os.mkdir(name, 0o777, dir_fd=dir_fd)
    except FileExistsError:
        pass  # made meanwhile (another reader)
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


@contextmanager
def owned_dir(store: Path, rel: str | Path = "", create: bool = False) -> Iterator[int]:
    """``open_dir`` as a block: the descriptor is closed after it."""
    fd = open_dir(store, rel, create)
    try:
        yield fd
    finally:
        os.close(fd)


def remove_tree(store: Path, rel: str | Path) -> None:
    """Delete the directory ``store/rel`` and everything in it, following no link on the way or inside (a
    link in its place is left alone); nothing happens when it is missing."""
    rel = Path(rel)
    try:
        with owned_dir(store, rel.parent) as parent:
            if _is_link(rel.name, parent):
                return
            shutil.rmtree(rel.name, ignore_errors=True, dir_fd=parent)
    except (FileNotFoundError, NotADirectoryError, BadInput):
        return  # nothing of ours to delete there


def fresh_dir(store: Path, rel: str | Path) -> None:
    """Make way for a new array at ``store/rel``: its parents created (none of them a link), whatever was at
    ``rel`` removed; BadInput when ``rel`` itself is a link (zarr's overwrite would empty its target)."""
    rel = Path(rel)
    try:
        with owned_dir(store, rel.parent, create=True) as parent:
            if _is_link(rel.name, parent):
                raise link_refusal(Path(store) / rel)
            shutil.rmtree(rel.name, ignore_errors=True, dir_fd=parent)
    except NotADirectoryError:
        raise BadInput(Path(store) / rel.parent, "holds a file where bigknn keeps a directory; the store is "
                                                 "damaged (run `bigknn verify`)") from None


@contextmanager
def new_file(store: Path, rel_dir: str | Path, name: str) -> Iterator[BinaryIO]:
    """A file ``store/rel_dir/name`` written whole or not at all, through descriptors only: the directory is
    opened (created) without following a link, the file written under a temporary name created there with
    ``O_EXCL | O_NOFOLLOW``, fsynced and renamed over ``name`` (a link at ``name`` is replaced, never followed)."""
    with owned_dir(store, rel_dir, create=True) as dir_fd, disk_full_named(Path(store) / rel_dir / name, None):
        tmp = f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dir_fd)
        try:
            with open(fd, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.fsync(dir_fd)
        except BaseException:
            remove_file(dir_fd, tmp)
            raise


def versions(store: Path, rel: str | Path) -> list[int]:
    """The version numbers of the version directories in ``store/rel`` (none when it is missing)."""
    try:
        with owned_dir(store, rel) as fd:
            return [int(name) for name in list_names(fd) if is_version(name)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def remove_file(dir_fd: int, name: str) -> None:
    """Unlink the plain file ``name`` of the directory ``dir_fd`` (a link is removed itself, never its target);
    a missing file or one we may not remove is left."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def list_names(dir_fd: int) -> list[str]:
    """Names in the directory ``dir_fd``."""
    return os.listdir(dir_fd)


def is_plain_file(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False
