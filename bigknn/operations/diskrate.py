"""Measured disk bandwidth for ``bigknn plan``: a build at scale is bound by its reads and writes, so the
plan must not rest on an assumed rate.

A temporary file is written (fsync'd: the time includes reaching the device), dropped from the page cache
(posix_fadvise DONTNEED, which clean pages honour), read back, and deleted. On a file system the page cache
cannot be bypassed on (tmpfs) the read rate is memory's, which is that file system's truth too.
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
