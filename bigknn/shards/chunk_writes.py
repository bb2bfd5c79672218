"""Writes of the store's direct-access zarr arrays (bigknn/shards/chunks.py has the layout and the reads): an
array's chunk files written in full with their checksums, an array taken from another store by hard links, and
the table of chunk checksums an older array is given. Array metadata is always written by zarr."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import BinaryIO

import numpy as np

from bigknn.core.atomic import write_atomic
from bigknn.core.errors import Damaged
from bigknn.shards import checksums, safepaths
from bigknn.shards.chunks import PIECE_BYTES, check, chunk_path, layout, metadata, read_chunk, run_all


def _write_all(f: BinaryIO, data: np.ndarray) -> None:
    view, done = memoryview(data).cast("B"), 0
    while done < view.nbytes:
        done += f.write(view[done:])


def write_array(array_dir: Path, data: np.ndarray, place: str | None = None) -> bool:
    """Write all of ``data`` as the chunk files of the array whose metadata zarr just created at
    ``array_dir`` (each chunk written in full, the edge chunk padded with the fill value, then its checksum,
    as zarr does); False, writing nothing, when the layout is not one this module handles (write it with zarr).
    ``place`` (the array's path in its store): its zarr.json then lists each chunk's checksum for that place."""
    array_dir = Path(array_dir)
    lay = layout(array_dir)
    if lay is None:
        return False
    if tuple(data.shape) != (lay.rows, lay.width):
        raise ValueError(f"{array_dir}: data of shape {data.shape} for an array of shape {(lay.rows, lay.width)}")
    crcs = [0] * lay.chunks

    def write(i: int) -> None:
        lo, hi = i * lay.chunk_rows, min(lay.rows, (i + 1) * lay.chunk_rows)
        parts = [np.ascontiguousarray(data[lo:hi], dtype=lay.dtype)]  # per chunk, on the writer threads
        if hi - lo < lay.chunk_rows:
            parts.append(np.full((lay.chunk_rows - (hi - lo), lay.width), lay.fill, dtype=lay.dtype))
        path = chunk_path(array_dir, i)
        path.parent.mkdir(parents=True, exist_ok=True)
        crc = 0
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        with open(fd, "wb", buffering=0) as f:
            for part in parts:
                flat = part.reshape(-1).view(np.uint8)
                for start in range(0, flat.size, PIECE_BYTES):
                    piece = flat[start:start + PIECE_BYTES]
                    if lay.checksum:
                        crc = checksums.extend(crc, piece)
                    _write_all(f, piece)
            if lay.checksum:
                _write_all(f, np.frombuffer(checksums.encode(crc), dtype=np.uint8))
        crcs[i] = crc

    run_all([lambda i=i: write(i) for i in range(lay.chunks)])
    if place is not None and lay.checksum:
        _write_table(array_dir, place, crcs)
    return True


LINK_REFUSED = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES}  # link_array: copy instead


def link_array(src_dir: Path, store: Path, place: str) -> bool:
    """Make ``store/place`` the array at ``src_dir`` (another store's, bound to its own place) without copying
    its bytes: a hard link to each of its chunk files, and a zarr.json listing the same checksums for
    ``place``. Every source chunk is read and checked against its checksum first (the Damaged of the first
    bad one is raised, as a copy's read would). False, leaving nothing at ``place``, where the source is not a
    checksummed array with its table (an older store), or the file system refuses the links (another
    device, no hard links): the caller copies. The files then have two names; a later writer of either store
    writes new files and removes only names of its own."""
    src_dir = Path(src_dir)
    lay = layout(src_dir)
    if lay is None or not lay.checksum or lay.table is None:
        return False
    damage = check(src_dir, contents=True)
    if damage:
        raise damage[0]
    sources = [chunk_path(src_dir, i) for i in range(lay.chunks)]
    if not all(stat.S_ISREG(os.lstat(p).st_mode) for p in sources):  # a link in the other store: its bytes
        return False  # are copied (a hard link to a link would put that link in this store)
    safepaths.fresh_dir(store, place)
    try:
        for i, source in enumerate(sources):
            with safepaths.owned_dir(store, f"{place}/c/{i}", create=True) as fd:
                os.link(source, "0", dst_dir_fd=fd, follow_symlinks=False)
    except OSError as e:
        safepaths.remove_tree(store, place)
        if e.errno in LINK_REFUSED:
            return False
        raise
    except BaseException:  # interrupted: none of the links stay
        safepaths.remove_tree(store, place)
        raise
    meta = checksums.with_table(metadata(src_dir), place, list(lay.table))
    with safepaths.new_file(store, place, "zarr.json") as f:
        f.write(json.dumps(meta).encode())
    return True


def add_table(array_dir: Path, place: str) -> bool:
    """List in the array's zarr.json the checksum of each of its chunks for ``place`` (upgrading an array
    written before format 6): each chunk is read and checked first. False, changing nothing, for an array
    this module does not handle, one without checksums, or one with a damaged chunk (it stays damage)."""
    array_dir = Path(array_dir)
    try:
        lay = layout(array_dir)
    except Damaged:
        return False
    if lay is None or not lay.checksum:
        return False
    if lay.table is not None:
        return True
    crcs = []
    buf = np.empty((lay.chunk_rows, lay.width), dtype=lay.dtype)
    try:
        for i in range(lay.chunks):
            lo, hi = i * lay.chunk_rows, min(lay.rows, (i + 1) * lay.chunk_rows)
            crcs.append(read_chunk(array_dir, lay, i, lo, hi, buf[:hi - lo]))
    except Damaged:
        return False
    _write_table(array_dir, place, crcs)
    return True


def _write_table(array_dir: Path, place: str, crcs: list[int]) -> None:
    write_atomic(array_dir / "zarr.json", json.dumps(checksums.with_table(metadata(array_dir), place, crcs)))
