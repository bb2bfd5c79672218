"""The advisory writer lock: one writer at a time, readers never block.

``fcntl.flock`` on the store's directory itself, and on STORE/.lock: the kernel drops both when their
process dies (even by SIGKILL), so a lock left by a dead writer is simply free again. The directory's lock is
the one that counts: deleting or replacing ``.lock`` while a writer runs does not let a second writer in
(a lock on a file can be defeated so, since a new ``.lock`` is a new file). ``.lock`` is still locked, for
bigknn versions that lock only it, and records pid, host and start time of the holder for the message a
waiting writer prints. It is opened without following a link and must be a plain file with no other name
(a hard link to a user's file would have the writer overwrite that file); where the file system cannot lock
a directory (some network file systems), the lock on ``.lock`` alone is taken.

Once it holds the lock, a writer refuses a store holding a symbolic link (bigknn/shards/safepaths.py) and
removes the temporary manifest files a killed writer left.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import socket
import stat
import time
from pathlib import Path

from bigknn.core.errors import BadInput, StoreBusy
from bigknn.shards import safepaths

POLL_S = 0.2
LOCK_NAME = ".lock"
# what atomic.py names a manifest being written (``.manifest.json.<pid>-<hex>.tmp``): left only by a kill
_MANIFEST_TMP = re.compile(r"\.manifest\.json\.[0-9]+-[0-9a-f]{8}\.tmp")


class WriterLock:
    def __init__(self, store_path: Path, wait_s: float = 0.0):
        self.path = Path(store_path) / LOCK_NAME
        self.wait_s = wait_s
        self._fds: list[int] = []

    def __enter__(self) -> "WriterLock":
        store = self.path.parent
        try:
            store.mkdir(parents=True, exist_ok=True)
            dir_fd = os.open(store, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise BadInput(store, f"cannot be opened for writing ({e.strerror})") from None
        try:
            file_fd = self._open_lock_file(dir_fd)
        except PermissionError as e:
            os.close(dir_fd)
            raise BadInput(self.path, f"cannot be written ({e.strerror}): a writer needs write access to the "
                                      "store") from None
        except BaseException:
            os.close(dir_fd)
            raise
        self._fds = [dir_fd, file_fd]
        try:
            self._acquire(dir_fd, file_fd)
            os.ftruncate(file_fd, 0)
            os.pwrite(file_fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                           "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode(), 0)
            safepaths.check_store(store)
            _remove_manifest_leftovers(dir_fd)
            _check_writable(dir_fd, store)
        except BaseException:
            self._release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._release()

    def _open_lock_file(self, dir_fd: int) -> int:
        try:
            fd = os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise safepaths.link_refusal(self.path) from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            raise BadInput(self.path, f"is not a plain file of the store's own ({st.st_nlink} names link to it); "
                                      "bigknn would overwrite it: remove it")
        return fd

    def _acquire(self, dir_fd: int, file_fd: int) -> None:
        deadline = time.monotonic() + self.wait_s
        while True:
            held = []
            try:
                for fd in (dir_fd, file_fd):
                    if _try_lock(fd):
                        held.append(fd)
                return
            except BlockingIOError:
                for fd in held:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            if time.monotonic() >= deadline:
                raise StoreBusy(f"{self.path.parent}: another writer holds the store ({self._holder(file_fd)}); "
                                f"gave up after {self.wait_s:g} s")
            time.sleep(POLL_S)

    def _release(self) -> None:
        for fd in self._fds:
            os.close(fd)  # closing drops the flock
        self._fds = []

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except ValueError:
            info = {}
        if not isinstance(info, dict) or "pid" not in info:
            return f"holder unknown: {LOCK_NAME} was removed or replaced while it held the store"
        return f"pid {info.get('pid')} on {info.get('host')} since {info.get('since')}"


def _try_lock(fd: int) -> bool:
    """Lock ``fd`` exclusively without waiting: True when locked, False where the file system cannot lock it
    (a directory on some network file systems); BlockingIOError when another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        raise
    except OSError as e:
        if e.errno in (errno.ENOLCK, errno.EBADF, errno.EINVAL, errno.EOPNOTSUPP) and stat.S_ISDIR(os.fstat(fd).st_mode):
            return False
        raise


def _check_writable(dir_fd: int, store: Path) -> None:
    """Refuse (exit 2) a store directory this writer cannot add files to (read-only, no permission) before any
    work, rather than fail at its first array with the name of a temporary file: the probe is named as a
    manifest temp file, so a kill in between leaves what the next writer removes."""
    name = f".manifest.json.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dir_fd))
    except OSError as e:
        raise BadInput(store, f"cannot be written ({e.strerror}): a writer needs write access to the store") from None
    safepaths.remove_file(dir_fd, name)


def _remove_manifest_leftovers(dir_fd: int) -> None:
    for name in safepaths.list_names(dir_fd):
        if _MANIFEST_TMP.fullmatch(name) and safepaths.is_plain_file(dir_fd, name):
            safepaths.remove_file(dir_fd, name)



def running_writer(store_path: Path) -> int | None:
    """The pid of the writer now holding ``store_path``'s lock on this host, read without taking the lock
    (a reader must never make a starting writer fail its non-blocking flock): the pid the lock file names,
    if that process lives and the kernel lists a lock on the file (/proc/locks, where there is one)."""
    path = Path(store_path) / LOCK_NAME
    try:
        info = json.loads(path.read_bytes() or b"{}")
        inode = path.stat().st_ino
    except (OSError, ValueError):
        return None
    pid = info.get("pid")
    if not isinstance(pid, int) or info.get("host") != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    try:
        locks = Path("/proc/locks").read_text()
    except OSError:
        return pid
    return pid if any(line.split()[5].endswith(f":{inode}") for line in locks.splitlines()
                      if len(line.split()) > 5 and line.split()[1] == "FLOCK") else None

