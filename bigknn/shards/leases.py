"""Reader leases: a reader's claim on the graph versions it opened, so that no writer deletes them under it.

A lease is a file ``STORE/.readers/<pid>-<token>.json``: ``{"pid", "host", "graphs": {shard: version}}``.
The protocol, which needs no lock between readers and the writer:

* a reader creates its lease with ``"graphs": null`` (opening: it pins every version) *before* it reads the
  manifest, then names the versions of the manifest it read;
* after each commit, the writer lists the leases and deletes no version a live lease names, and no version at
  all while a lease is opening. Either that listing sees the reader's lease, or the reader read the manifest
  after the commit and needs none of the versions the commit made stale. What a lease kept is deleted at a
  later commit, or when the writer closes the store.

A lease is dead (ignored and removed by the writer) when its process is gone on this host, or when it has
not been refreshed for ``EXPIRE_S`` (a reader on another host, a reused pid, a stopped process); a live reader
refreshes its lease every ``REFRESH_S``. A reader that cannot write its lease (a read-only store) reads
without one: ``bigknn.shards.store.read_store`` then starts its read again if a writer deletes a version
under it.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from pathlib import Path

LEASE_DIR = ".readers"
SUFFIX = ".json"
REFRESH_S = 60.0  # a live reader touches its lease this often
EXPIRE_S = 600.0  # a lease untouched for this long is dead, whatever its pid says


class Lease:
    """This process's lease on one store, from ``take`` to ``release``."""

    def __init__(self, path: Path):
        self.path = path
        self.pid = os.getpid()
        self._stop = threading.Event()
        self._refresher = threading.Thread(target=self._refresh, daemon=True, name="lease-refresh")

    @classmethod
    def take(cls, store_path: Path) -> "Lease | None":
        """An opening lease (pins every version) on the store; None when it cannot be written (read-only)."""
        folder = Path(store_path) / LEASE_DIR
        lease = cls(folder / f"{os.getpid()}-{secrets.token_hex(6)}{SUFFIX}")
        try:
            folder.mkdir(exist_ok=True)
            fd = os.open(lease.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, lease._content(None))
            finally:
                os.close(fd)
        except OSError:
            lease.release()
            return None
        lease._refresher.start()
        return lease

    def pin(self, graphs: dict[int, int]) -> bool:
        """Name the graph versions this reader opened (replacing the opening lease at once); False, with the
        lease released, when that cannot be written: the reader then reads without one."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_bytes(self._content(graphs))
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)
            self.release()
            return False
        return True

    def release(self) -> None:
        """Remove the lease (idempotent; a forked child never removes its parent's)."""
        self._stop.set()
        if os.getpid() == self.pid:
            try:
                self.path.unlink(missing_ok=True)
            except OSError:
                pass  # the store went read-only or away: the writer's expiry takes care of it

    def _content(self, graphs: dict[int, int] | None) -> bytes:
        return json.dumps({"pid": self.pid, "host": socket.gethostname(),
                           "graphs": None if graphs is None else {str(s): v for s, v in graphs.items()}}).encode()

    def _refresh(self) -> None:
        while not self._stop.wait(REFRESH_S):
            try:
                os.utime(self.path)
            except OSError:
                pass  # removed (expired) or unwritable: the reader's retry covers it


def pinned(store_path: Path) -> set[tuple[int, int]] | None:
    """(shard, version) pairs named by live leases; None while a live lease is still opening (then every
    version may be in use). Dead leases are removed on the way."""
    folder = Path(store_path) / LEASE_DIR
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):  # no reader could write a lease here
        return set()
    host, now = socket.gethostname(), time.time()
    pins: set[tuple[int, int]] = set()
    opening = False
    for entry in entries:
        try:
            age = now - entry.stat().st_mtime
            info = json.loads(Path(entry.path).read_bytes()) if entry.name.endswith(SUFFIX) else None
        except FileNotFoundError:
            continue  # released meanwhile
        except (OSError, ValueError):
            info = {}  # being written: opening
        if age > EXPIRE_S or (info is not None and info.get("host") == host and not _alive(info.get("pid"))):
            _remove(entry.path)
            continue
        if info is None:
            continue  # a temporary file of a lease being pinned
        graphs = info.get("graphs")
        if not isinstance(graphs, dict):
            opening = True
            continue
        pins.update((int(s), v) for s, v in graphs.items() if isinstance(v, int))
    return None if opening else pins


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # gone already, or not ours to remove: it stays expired
