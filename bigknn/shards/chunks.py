"""Direct reads and writes of the store's uncompressed zarr v3 row-chunked arrays, every chunk checked against
its checksum in the same pass over its bytes.

zarr reads an uncompressed chunk at about 0.6 GB/s per thread even from the page cache: it copies every
chunk twice and holds the GIL in its codec pipeline. The store's arrays are 2-D, chunked by rows at full
width, with a little-endian ``bytes`` codec followed by the ``crc32c`` checksum codec (bigknn/shards/checksums.py),
so chunk ``i`` is the file ``<array>/c/<i>/0`` holding ``chunk_rows`` rows in C order (the last chunk padded to
full size with the fill value), then the 4-byte checksum of those bytes. Every chunk of a checksummed array is
written, so a missing chunk file is damage, as is one of the wrong size or checksum: reads raise ``Damaged``
naming the file, never return zeros. (Arrays of format-1 stores have no checksum codec; in those a chunk zarr did
not write because it was all fill value is simply missing and reads as the fill value, as zarr reads it.)

This module moves those bytes straight between the files and numpy arrays, one copy, with the GIL released,
several chunks in flight; a large array read whole lands in huge pages (core/hostmem.filled_once): the first
touch of fresh 4 KiB pages costs as much as the copy and the checksum. It only ever handles arrays whose
``zarr.json`` says exactly that layout; for anything else it declines (``None``/``False``) and the caller uses
zarr, which stays the reference. Array metadata is always written by zarr. The writes are in chunk_writes.py.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

import numpy as np

from bigknn.core.hostmem import filled_once
from bigknn.core.errors import Damaged
from bigknn.shards import checksums

Buffer = Callable[[tuple[int, int], np.dtype], np.ndarray]  # (shape, dtype) -> an array to read into (read_rows)
CHUNKS_IN_FLIGHT = 4  # chunk reads or writes in flight within one array read or write
PIECE_BYTES = 1 << 20  # checksummed right after it is read or before it is written, while in the CPU cache

# zarr v3 data type names with a plain numpy equivalent (little-endian on disk)
_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "float32", "float64"}
_FLOAT_NAMES = {"NaN", "Infinity", "-Infinity"}  # JSON spellings of special float fill values


@dataclass(frozen=True)
class _Layout:
    rows: int
    width: int
    chunk_rows: int
    dtype: np.dtype
    fill: np.generic
    checksum: bool  # each chunk file ends in its crc32c
    table: tuple[int, ...] | None = None  # each chunk's crc32c as zarr.json lists it for this place (format 6)

    @property
    def row_bytes(self) -> int:
        return self.width * self.dtype.itemsize

    @property
    def file_bytes(self) -> int:
        """Size of every chunk file."""
        return self.chunk_rows * self.row_bytes + (checksums.SIZE if self.checksum else 0)

    @property
    def chunks(self) -> int:
        return -(-self.rows // self.chunk_rows)


def metadata(array_dir: Path) -> dict:
    """The array's zarr.json; Damaged when it is missing or not a JSON object."""
    meta_path = Path(array_dir) / "zarr.json"
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise Damaged(meta_path, "array missing (no zarr.json)") from None
    except (OSError, ValueError) as e:
        raise Damaged(meta_path, f"array metadata unreadable ({e})") from None
    if not isinstance(meta, dict):
        raise Damaged(meta_path, "array metadata is not a JSON object")
    return meta


def layout(array_dir: Path) -> _Layout | None:
    """The array's layout if its metadata allows direct chunk access, else None; Damaged if it has no metadata,
    or a table of chunk checksums written for another place (bigknn/shards/checksums.py)."""
    meta = metadata(array_dir)
    lay = _plain_layout(meta)
    if lay is None or not lay.checksum:
        return lay
    return dataclasses.replace(lay, table=checksums.table(meta, array_dir, lay.chunks))


def _plain_layout(meta: dict) -> _Layout | None:
    if sys.byteorder != "little":
        return None
    try:
        if meta.get("zarr_format") != 3 or meta.get("node_type") != "array" or meta.get("storage_transformers"):
            return None
        name = meta["data_type"]
        if name not in _DTYPES:
            return None
        dtype = np.dtype(name).newbyteorder("<")
        codecs = meta["codecs"]
        checksum = checksums.present(meta)
        if len(codecs) != 1 + checksum or codecs[0].get("name") != "bytes":
            return None
        endian = (codecs[0].get("configuration") or {}).get("endian")
        if endian != "little" and not (endian is None and dtype.itemsize == 1):
            return None
        key = meta["chunk_key_encoding"]
        if key.get("name") != "default" or (key.get("configuration") or {}).get("separator", "/") != "/":
            return None
        grid = meta["chunk_grid"]
        if grid.get("name") != "regular":
            return None
        shape, chunks = meta["shape"], grid["configuration"]["chunk_shape"]
        if len(shape) != 2 or len(chunks) != 2 or chunks[1] != shape[1] or min(chunks) < 1:
            return None
        fill = meta["fill_value"]
        if isinstance(fill, str):
            if dtype.kind != "f" or fill not in _FLOAT_NAMES:  # e.g. a hex bit pattern
                return None
        elif isinstance(fill, bool) or not isinstance(fill, int if dtype.kind in "iu" else (int, float)):
            return None
        return _Layout(int(shape[0]), int(shape[1]), int(chunks[0]), dtype, dtype.type(fill), checksum)
    except (KeyError, TypeError, AttributeError, ValueError, OverflowError):
        return None


def chunk_path(array_dir: Path, i: int) -> Path:
    return array_dir / "c" / str(i) / "0"


def run_all(tasks: list[Callable[[], None]]) -> None:
    """Run the tasks with up to CHUNKS_IN_FLIGHT at once; the first exception is raised."""
    if len(tasks) <= 1:
        for task in tasks:
            task()
        return
    with ThreadPoolExecutor(min(CHUNKS_IN_FLIGHT, len(tasks))) as pool:
        for future in [pool.submit(task) for task in tasks]:
            future.result()


def _read_into(f: BinaryIO, dest: np.ndarray | bytearray) -> None:
    view, done = memoryview(dest).cast("B"), 0
    while done < view.nbytes:
        n = f.readinto(view[done:])
        if not n:
            raise Damaged(f.name, "chunk file is shorter than its array's metadata says")
        done += n


def _read_checked(f: BinaryIO, dest: np.ndarray, crc: int) -> int:
    """Fill ``dest`` (C-contiguous) from ``f``, returning ``crc`` extended over its bytes: piece by piece, each
    checksummed while it is still in the CPU cache."""
    flat = dest.reshape(-1).view(np.uint8)
    for lo in range(0, flat.size, PIECE_BYTES):
        piece = flat[lo:lo + PIECE_BYTES]
        _read_into(f, piece)
        crc = checksums.extend(crc, piece)
    return crc


def _skim(f: BinaryIO, nbytes: int, crc: int) -> int:
    """Read ``nbytes`` the caller does not want, returning ``crc`` extended over them."""
    block = np.empty(min(nbytes, PIECE_BYTES), dtype=np.uint8)
    while nbytes > 0:
        part = block[:nbytes]
        crc = _read_checked(f, part, crc)
        nbytes -= part.size
    return crc


def read_chunk(array_dir: Path, lay: _Layout, i: int, lo: int, hi: int, dest: np.ndarray) -> int | None:
    """Array rows [lo, hi), all inside chunk ``i``, into ``dest``; the whole chunk is checked against its checksum
    (and the one its place lists); returns that checksum (None for an array without checksums)."""
    path = chunk_path(array_dir, i)
    try:
        f = open(path, "rb", buffering=0)
    except FileNotFoundError:
        if lay.checksum:
            raise Damaged(path, "chunk file missing") from None
        dest.fill(lay.fill)  # zarr did not write it: all fill value
        return None
    except OSError as e:  # a directory in its place, no permission: listed by verify like any damage
        raise Damaged(path, f"chunk file unreadable ({e.strerror or e})") from None
    try:
        return _read_open_chunk(f, path, lay, i, lo, hi, dest)
    except OSError as e:
        raise Damaged(path, f"chunk file unreadable ({e.strerror or e})") from None


def _read_open_chunk(f: BinaryIO, path: Path, lay: _Layout, i: int, lo: int, hi: int, dest: np.ndarray) -> int | None:
    first = i * lay.chunk_rows
    with f:
        if not lay.checksum:
            f.seek((lo - first) * lay.row_bytes)
            _read_into(f, dest)
            return None
        size = os.fstat(f.fileno()).st_size
        if size != lay.file_bytes:
            raise Damaged(path, f"chunk file has {size} bytes; its array's metadata says {lay.file_bytes}")
        crc = _skim(f, (lo - first) * lay.row_bytes, 0)
        crc = _read_checked(f, dest, crc)
        crc = _skim(f, (first + lay.chunk_rows - hi) * lay.row_bytes, crc)
        stored = bytearray(checksums.SIZE)
        _read_into(f, stored)
    if crc != checksums.decode(bytes(stored)):
        raise Damaged(path, "checksum mismatch: the chunk's bytes are not the ones written")
    if lay.table is not None and crc != lay.table[i]:
        raise Damaged(path, "chunk from another place or an older write: its checksum is not the one its array "
                            "lists for it")
    return crc


def _direct_layout(array_dir: Path, require_checksums: bool, require_places: bool = False) -> _Layout | None:
    """The layout for direct reads (None: read with zarr); an array without checksums where they are required
    (a format-2 store), or without its table of them where that is (format 6), is damage."""
    lay = layout(array_dir)
    if lay is not None and require_checksums and not lay.checksum:
        raise Damaged(array_dir / "zarr.json", "array has no chunk checksums")
    if lay is not None and require_places and lay.checksum and lay.table is None:
        raise Damaged(array_dir / "zarr.json", "array lists no checksums of its chunks for its place")
    return lay


def read_rows(array_dir: Path, start: int = 0, stop: int | None = None,
              require_checksums: bool = False, require_places: bool = False,
              buffer: Buffer | None = None) -> np.ndarray | None:
    """Rows ``[start:stop]`` (Python slice semantics) of the array at ``array_dir``, read straight from its
    chunk files and checked against their checksums; None when the array's layout is not one this module
    handles (read it with zarr). ``require_checksums``: an array without them is damage (a format-2 store);
    ``require_places``: so is one without its table of them (format 6). ``buffer(shape, dtype)``: the array to
    read into, the caller's to reuse (a fresh one costs a page fault per 4 KiB); the chunks are then read one
    after the other on the calling thread, which is one of many reading at once."""
    array_dir = Path(array_dir)
    lay = _direct_layout(array_dir, require_checksums, require_places)
    if lay is None:
        return None
    start, stop, _ = slice(start, stop).indices(lay.rows)
    stop = max(start, stop)
    shape = (stop - start, lay.width)
    out = filled_once(shape, lay.dtype) if buffer is None else buffer(shape, lay.dtype)

    def read(i: int) -> None:
        lo, hi = max(start, i * lay.chunk_rows), min(stop, (i + 1) * lay.chunk_rows)
        read_chunk(array_dir, lay, i, lo, hi, out[lo - start:hi - start])

    first, last = start // lay.chunk_rows, -(-stop // lay.chunk_rows)
    tasks = [lambda i=i: read(i) for i in range(first, last)] if stop > start else []
    if buffer is None:
        run_all(tasks)
    else:
        for task in tasks:
            task()
    return out


def read_row_set(array_dir: Path, rows: np.ndarray, require_checksums: bool = False,
                 require_places: bool = False) -> np.ndarray | None:
    """The array's rows ``rows`` (any order, repeats allowed), each chunk holding any of them read and checked
    once: a sample of scattered rows costs the chunks it touches, not a chunk per row. None when the layout is
    not one this module handles."""
    array_dir = Path(array_dir)
    lay = _direct_layout(array_dir, require_checksums, require_places)
    if lay is None:
        return None
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= lay.rows):
        raise IndexError(f"rows outside the {lay.rows} rows of {array_dir}")
    out = np.empty((len(rows), lay.width), dtype=lay.dtype)
    chunk_of = rows // lay.chunk_rows

    def read(i: int) -> None:
        mine = np.nonzero(chunk_of == i)[0]
        lo, hi = int(rows[mine].min()), int(rows[mine].max()) + 1
        span = np.empty((hi - lo, lay.width), dtype=lay.dtype)
        read_chunk(array_dir, lay, i, lo, hi, span)
        out[mine] = span[rows[mine] - lo]

    run_all([lambda i=i: read(i) for i in np.unique(chunk_of).tolist()])
    return out


def check(array_dir: Path, contents: bool, visit: Callable[[np.ndarray], None] | None = None,
          require_checksums: bool = False, require_places: bool = False) -> list[Damaged] | None:
    """Every missing or damaged chunk of the array, all of them rather than the first: with ``contents`` each
    chunk is read and checked against its checksum and its rows handed to ``visit`` (one call at a time),
    without only each chunk file's presence and size are checked. None when the layout is not one this
    module handles."""
    array_dir = Path(array_dir)
    try:
        lay = _direct_layout(array_dir, require_checksums, require_places)
    except Damaged as e:
        return [e]
    if lay is None:
        return None
    found: list[Damaged] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        lo, hi = i * lay.chunk_rows, min(lay.rows, (i + 1) * lay.chunk_rows)
        try:
            if contents:
                rows = np.empty((hi - lo, lay.width), dtype=lay.dtype)
                read_chunk(array_dir, lay, i, lo, hi, rows)
                if visit is not None:
                    with lock:
                        visit(rows)
            else:
                _check_size(array_dir, lay, i)
        except Damaged as e:
            with lock:
                found.append(e)

    run_all([lambda i=i: one(i) for i in range(lay.chunks)])
    return sorted(found, key=lambda e: e.file)


def _check_size(array_dir: Path, lay: _Layout, i: int) -> None:
    path = chunk_path(array_dir, i)
    try:
        st = path.stat()
    except FileNotFoundError:
        if lay.checksum:
            raise Damaged(path, "chunk file missing") from None
        return  # all fill value (an array without checksums)
    except OSError as e:
        raise Damaged(path, f"chunk file unreadable ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise Damaged(path, "chunk file is not a plain file")
    size = st.st_size
    if size != lay.file_bytes:
        raise Damaged(path, f"chunk file has {size} bytes; its array's metadata says {lay.file_bytes}")
