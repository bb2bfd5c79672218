"""Measured disk bandwidth for ``bigknn plan``: a build at scale is bound by its reads and writes, so the
plan must not rest on an assumed rate.

A temporary file is written (fsync'd: the time includes reaching the device), dropped from the page cache
(posix_fadvise DONTNEED, which clean pages honour), read back, and deleted. On a file system the page cache
cannot be bypassed on (tmpfs) the read rate is memory's, which is that file system's truth too.

A build's last graph write ends when the page cache holds it, not the disk: the writes' pace before the fsync
(``cache_write_gbps``) and how many bytes the kernel buffers before a writer waits (``dirty_bytes``) let the
plan price that write as the build meets it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from bigknn.core.errors import BadInput

PROBE_BYTES = 256 << 20
BLOCK_BYTES = 16 << 20


def measure_disk(where: Path, nbytes: int = PROBE_BYTES) -> dict:
    """{"read_gbps", "write_gbps", "source"} of the file system holding ``where`` (a directory). The probe
    takes at most a quarter of the free space; BadInput (naming ``where``) where even one block does not fit
    or the file cannot be written."""
    try:
        free = shutil.disk_usage(where).free
        blocks = min(max(1, nbytes // BLOCK_BYTES), free // 4 // BLOCK_BYTES)
        if blocks < 1:
            raise BadInput(where, f"has {free >> 20} MiB free, too little to measure the disk's rate; give "
                                  "--disk-gbps, or -o on the file system the store will go to")
        fd, name = tempfile.mkstemp(prefix=".bigknn-disk-", dir=where)
    except OSError as e:
        raise BadInput(where, f"cannot measure the disk's rate here ({e.strerror}); give --disk-gbps, or -o on "
                              "the file system the store will go to") from None
    block = os.urandom(BLOCK_BYTES)
    try:
        t = time.perf_counter()
        for _ in range(blocks):
            os.write(fd, block)
        cached_s = time.perf_counter() - t
        os.fsync(fd)
        write_s = time.perf_counter() - t
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.lseek(fd, 0, os.SEEK_SET)
        t = time.perf_counter()
        while os.read(fd, BLOCK_BYTES):
            pass
        read_s = time.perf_counter() - t
    finally:
        os.close(fd)
        os.unlink(name)
    total = blocks * BLOCK_BYTES
    return {"read_gbps": round(total / read_s / 1e9, 2), "write_gbps": round(total / write_s / 1e9, 2),
            "cache_write_gbps": round(total / max(cached_s, 1e-9) / 1e9, 2), "dirty_bytes": dirty_limit(),
            "source": f"measured in {Path(where).resolve()} ({total >> 20} MiB written, fsync'd, read uncached)"}


def dirty_limit(vm: Path = Path("/proc/sys/vm"), meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Bytes of writes Linux buffers in the page cache before a writer waits for the disk: ``vm.dirty_bytes``
    where set, else ``vm.dirty_ratio`` percent of the memory available. None where unknown (not Linux)."""
    try:
        fixed = int((vm / "dirty_bytes").read_text())
        if fixed > 0:
            return fixed
        ratio = int((vm / "dirty_ratio").read_text())
        available = next(int(line.split()[1]) * 1024 for line in meminfo.read_text().splitlines()
                         if line.startswith("MemAvailable:"))
    except (OSError, ValueError, StopIteration):
        return None
    return available * ratio // 100


def final_write_s(nbytes: float, disk: dict) -> float:
    """Seconds a build's last write of ``nbytes`` holds its end: up to ``dirty_bytes`` at the page cache's pace
    (the kernel writes them out after the build returns), the rest at the disk's; the disk's alone where either
    is unknown (``--disk-gbps``)."""
    cache_gbps, room = disk.get("cache_write_gbps"), disk.get("dirty_bytes")
    if not cache_gbps or not room:
        return nbytes / (disk["write_gbps"] * 1e9)
    held = min(nbytes, room)
    return held / (cache_gbps * 1e9) + (nbytes - held) / (disk["write_gbps"] * 1e9)
