"""Reader leases: a reader's claim on the graph versions it opened, so that no writer deletes them under it.

A lease is a file ``STORE/.readers/<pid>-<token>.json``: ``{"pid", "host", "boot", "start", "graphs"}``.
The protocol, which needs no lock between readers and the writer:

* a reader creates its lease with ``"graphs": null`` (opening: it pins every version) *before* it reads the
  manifest, then names the versions of the manifest it read;
* after each commit, the writer lists the leases and deletes no version a live lease names, and no version at
  all while a lease is opening. Either that listing sees the reader's lease, or the reader read the manifest
  after the commit and needs none of the versions the commit made stale. What a lease kept is deleted at a
  later commit, or when the writer closes the store.

Whether a lease is live asks no clock where it need not. On the writer's own host (same host name and boot)
the lease's process decides: live while a process with its pid *and its start time* runs (a reused pid is
another process), whatever the lease's age. A lease from another host is live while refreshed within
``EXPIRE_S``, its age measured on the file system's clock (the mtime of a file the writer creates there
now), never against the writer's own: hosts whose clocks disagree (NFS, Dask) agree on the file server's. A
lease dated more than ``SKEW_S`` ahead of that clock was stamped by hand or by a broken clock: it is reported
(a warning) and treated as expired, so it cannot hold back every deletion for ever. A live reader refreshes
its lease every ``REFRESH_S``. A reader that cannot write its lease (a read-only store, a link in the way)
reads without one: ``bigknn.shards.store_readers.read_store`` then starts its read again if a writer deletes a
version under it.

The writer removes only names readers create (``<pid>-<12 hex>.json`` and its ``.tmp``), and its own clock
probes, through the directory's descriptor (bigknn/shards/safepaths.py): never anything else put there.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import secrets
import socket
import threading
import time
from pathlib import Path

from bigknn.core.errors import BadInput
from bigknn.shards import safepaths

LEASE_DIR = ".readers"
SUFFIX = ".json"
REFRESH_S = 60.0  # a live reader on another host touches its lease this often
EXPIRE_S = 600.0  # a lease from another host untouched for this long (file system clock) is dead
SKEW_S = 120.0  # a lease dated further ahead of the file system's clock is from a wrong clock
LEASE_NAME = re.compile(r"[0-9]+-[0-9a-f]{12}\.json(\.tmp)?")
_PROBE = ".clock-{pid}-{token}"
PROBE_NAME = re.compile(r"\.clock-[0-9]+-[0-9a-f]{8}")
log = logging.getLogger("bigknn")


class Lease:
    """This process's lease on one store, from ``take`` to ``release``."""

    def __init__(self, folder_fd: int, name: str, path: Path):
        self.path = path
        self.name = name
        self.pid = os.getpid()
        self._start = start_time(self.pid)
        self._fd: int | None = folder_fd
        self._stop = threading.Event()
        self._refresher = threading.Thread(target=self._refresh, daemon=True, name="lease-refresh")

    @classmethod
    def take(cls, store_path: Path) -> "Lease | None":
        """An opening lease (pins every version) on the store; None when it cannot be written (read-only, or
        ``.readers`` is a link)."""
        name = f"{os.getpid()}-{secrets.token_hex(6)}{SUFFIX}"
        try:
            folder = safepaths.open_dir(Path(store_path), LEASE_DIR, create=True)
        except (OSError, BadInput):
            return None
        lease = cls(folder, name, Path(store_path) / LEASE_DIR / name)
        try:
            _write_new(folder, name, lease._content(None))
        except OSError:
            lease.release()
            return None
        lease._refresher.start()
        return lease

    def pin(self, graphs: dict[int, int]) -> bool:
        """Name the graph versions this reader opened (replacing the opening lease at once); False, with the
        lease released, when that cannot be written: the reader then reads without one."""
        tmp = self.name + ".tmp"
        try:
            _write_new(self._fd, tmp, self._content(graphs))
            os.replace(tmp, self.name, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        except (OSError, TypeError):  # TypeError: released already
            if self._fd is not None:
                safepaths.remove_file(self._fd, tmp)
            self.release()
            return False
        return True

    def held(self) -> bool:
        """Whether the lease file is still there (no writer removed it as dead)."""
        return self._fd is not None and safepaths.is_plain_file(self._fd, self.name)

    def release(self) -> None:
        """Remove the lease (idempotent; a forked child never removes its parent's)."""
        self._stop.set()
        if self._fd is None:
            return
        if os.getpid() == self.pid:
            safepaths.remove_file(self._fd, self.name)  # unwritable store: the writer's expiry takes care of it
            os.close(self._fd)
        self._fd = None

    def _content(self, graphs: dict[int, int] | None) -> bytes:
        return json.dumps({"pid": self.pid, "host": socket.gethostname(), "boot": boot_id(),
                           "start": self._start,
                           "graphs": None if graphs is None else {str(s): v for s, v in graphs.items()}}).encode()

    def _refresh(self) -> None:
        while not self._stop.wait(REFRESH_S):
            try:
                os.utime(self.name, dir_fd=self._fd, follow_symlinks=False)
            except (OSError, TypeError):
                pass  # removed (expired), unwritable or released: the reader's retry covers it


def pinned(store_path: Path) -> set[tuple[int, int]] | None:
    """(shard, version) pairs named by live leases; None while a live lease is still opening (then every
    version may be in use). Dead leases, and probes a killed writer left, are removed on the way."""
    try:
        folder = safepaths.open_dir(Path(store_path), LEASE_DIR)
    except (FileNotFoundError, NotADirectoryError):  # no reader could write a lease here
        return set()
    try:
        return _pinned(folder, Path(store_path) / LEASE_DIR)
    finally:
        os.close(folder)


def _pinned(folder: int, where: Path) -> set[tuple[int, int]] | None:
    names = safepaths.list_names(folder)
    now = _fs_now(folder)
    pins: set[tuple[int, int]] = set()
    opening = False
    for name in names:
        if PROBE_NAME.fullmatch(name):  # only this writer (it holds the lock) makes them: a killed one's
            safepaths.remove_file(folder, name)
            continue
        if not LEASE_NAME.fullmatch(name) or not safepaths.is_plain_file(folder, name):
            continue  # not a reader's: not ours to judge or remove
        try:
            mtime = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mtime
            info = _read(folder, name) if name.endswith(SUFFIX) else None
        except FileNotFoundError:
            continue  # released meanwhile
        except (OSError, ValueError):
            info = {}  # being written: opening
        if not _live(info, now - mtime, where / name):
            safepaths.remove_file(folder, name)
            continue
        if info is None:
            continue  # a temporary file of a lease being pinned
        graphs = info.get("graphs") if isinstance(info, dict) else None
        if not isinstance(graphs, dict):
            opening = True
            continue
        pins.update((int(s), v) for s, v in graphs.items() if isinstance(v, int) and str(s).isdigit())
    return None if opening else pins


def _live(info: dict | None, age: float, path: Path) -> bool:
    """Whether a lease (its content, None for a pin's temporary file) is a live reader's."""
    if age < -SKEW_S:
        log.warning("warning: %s is dated %.0f s ahead of the file system's clock (a wrong clock, or set by hand); "
                    "treated as expired", path, -age)
        return False
    if isinstance(info, dict) and info.get("host") == socket.gethostname():
        if not _alive(info.get("pid")):
            return False
        if info.get("boot") is not None and info.get("start") is not None:
            return info.get("boot") == boot_id() and info.get("start") == start_time(info["pid"])
    return age <= EXPIRE_S  # another host's, a lease of an older bigknn, or a temporary file


def _fs_now(folder: int) -> float:
    """The file system's clock now: the mtime of a file created in ``folder`` (removed at once)."""
    name = _PROBE.format(pid=os.getpid(), token=secrets.token_hex(4))
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                     dir_fd=folder)
    except OSError:
        return time.time()  # a read-only lease folder: this clock is all there is
    try:
        return os.fstat(fd).st_mtime
    finally:
        os.close(fd)
        safepaths.remove_file(folder, name)


def _read(folder: int, name: str) -> dict:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    with os.fdopen(fd, "rb") as f:
        return json.loads(f.read(65536))


def _write_new(folder: int, name: str, data: bytes) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


@functools.cache
def boot_id() -> str | None:
    """This boot of this host (Linux), so that a lease from before a reboot is not taken for a live one."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux): a pid reused by another process has
    another start time. None where that cannot be read."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
        return int(stat_line[stat_line.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    except OverflowError:
        return False
    return True
