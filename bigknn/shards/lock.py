"""The advisory writer lock: one writer at a time, readers never block.

``fcntl.flock`` on STORE/.lock: the kernel drops the lock when its process dies (even by SIGKILL), so a
lock left by a dead writer is simply free again. The file records pid, host and start time of the
holder, for the message a waiting writer prints.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from bigknn.errors import StoreBusy

POLL_S = 0.2
LOCK_NAME = ".lock"


class WriterLock:
    def __init__(self, store_path: Path, wait_s: float = 0.0):
        self.path = Path(store_path) / LOCK_NAME
        self.wait_s = wait_s
        self._fd: int | None = None

    def __enter__(self) -> "WriterLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = self._holder(fd)
                    os.close(fd)
                    raise StoreBusy(f"{self.path.parent}: another writer holds the store ({holder}); "
                                    f"gave up after {self.wait_s:g} s")
                time.sleep(POLL_S)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            info = json.loads(os.pread(fd, 4096, 0) or b"{}")
            return f"pid {info.get('pid')} on {info.get('host')} since {info.get('since')}"
        except ValueError:
            return "holder unknown"


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

