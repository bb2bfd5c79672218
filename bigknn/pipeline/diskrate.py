"""Measured disk bandwidth for ``bigknn plan``: a build at scale is bound by its reads and writes, so the
plan must not rest on an assumed rate.

A temporary file is written (fsync'd: the time includes reaching the device), dropped from the page cache
(posix_fadvise DONTNEED, which clean pages honour), read back, and deleted. On a file system the page cache
cannot be bypassed on (tmpfs) the read rate is memory's, which is that file system's truth too.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

PROBE_BYTES = 256 << 20
BLOCK_BYTES = 16 << 20


def measure_disk(where: Path, nbytes: int = PROBE_BYTES) -> dict:
    """{"read_gbps", "write_gbps", "source"} of the file system holding ``where`` (a directory)."""
    block = os.urandom(BLOCK_BYTES)
    blocks = max(1, nbytes // BLOCK_BYTES)
    fd, name = tempfile.mkstemp(prefix=".bigknn-disk-", dir=where)
    try:
        t = time.perf_counter()
        for _ in range(blocks):
            os.write(fd, block)
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
            "source": f"measured in {Path(where).resolve()} ({total >> 20} MiB written, fsync'd, read uncached)"}
