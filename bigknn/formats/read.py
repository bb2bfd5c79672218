"""Readers: open a vector or ground-truth file once, check its header against its size, and map it; check
rows block by block and hash the bytes read (bigknn/formats/__init__.py states the contract)."""

from __future__ import annotations

import hashlib
import mmap
import os
import stat
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

from bigknn.core.errors import BadInput
from bigknn.formats.spec import (BIN_DTYPES, CHECK_CHUNK_ROWS, HASH_BLOCK_BYTES, HEADER, HEADER_BYTES,
                                 MAX_SQUARED_NORM, MIN_ROW_PEAK, NPY_DTYPES, SCAN_ROWS, TRUTH_EXTENSION, VECS_DIM,
                                 VECS_DTYPES, VECTOR_EXTENSIONS, FLAT_READ_THREADS)

_WILL_NEED = getattr(mmap, "MADV_WILLNEED", None)  # not on every platform: there, no hint is given
WILL_NEED_MAX_RUNS = 1 << 16  # more separate page runs than this: the rows are dense, readahead serves them


@dataclass(frozen=True)
class FileState:
    """What the path named when it was looked at: a change in any field means the file was appended to,
    rewritten or replaced since (inode and device tell a replacement by ``mv``, which keeps the mtime)."""

    size: int
    mtime_ns: int
    ino: int
    dev: int

    @classmethod
    def of(cls, st: os.stat_result) -> "FileState":
        return cls(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)

    def change_to(self, now: "FileState | None") -> str | None:
        """How the file changed from this state to ``now`` (None: it did not; ``now`` None: it is gone)."""
        if now is None:
            return "was removed"
        if (now.ino, now.dev) != (self.ino, self.dev):
            return "was replaced by another file"
        if now.size != self.size:
            return f"changed size from {self.size} to {now.size} bytes"
        if now.mtime_ns != self.mtime_ns:
            return "was modified"
        return None


def file_state(path: str | os.PathLike) -> FileState | None:
    """The state of whatever ``path`` names now, None if nothing."""
    try:
        return FileState.of(os.stat(path))
    except FileNotFoundError:
        return None


@dataclass
class VectorFile:
    """An opened vector file: its shape and stored dtype, and read-only views of one memory map of it.

    The file is opened once: ``raw`` (every byte of the file) and ``data`` (its values) view the same
    mapping, so what is checked, hashed and read are the same bytes; ``state`` is the file as opened, and
    ``changed()`` tells whether the path still names exactly that file."""

    path: str
    rows: int
    dim: int
    dtype: np.dtype  # the values as stored in the file
    data: np.ndarray  # np.memmap (or a strided view of one), shape (rows, dim); no data read yet
    raw: np.ndarray  # np.memmap of the whole file as uint8
    header_bytes: int  # bytes before the first row
    state: FileState
    column = id_column = None  # a flat file holds vectors only (vector sources' fields: bigknn/formats/source.py)
    random_access = True  # a scattered row costs one page fault
    read_threads = FLAT_READ_THREADS

    @property
    def read_dtype(self) -> np.dtype:
        """What ``read`` returns: the stored dtype, except float64 which comes back as float32."""
        return np.dtype(np.float32) if self.dtype == np.float64 else self.dtype

    @property
    def row_bytes(self) -> int:
        """Bytes of the file per row (a *vecs row includes its dim field)."""
        return (self.raw.size - self.header_bytes) // self.rows

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) as a fresh C-contiguous array, so callers never hold on to the mapping."""
        if not 0 <= start <= stop <= self.rows:
            raise ValueError(f"rows [{start}, {stop}) are outside [0, {self.rows}) of {self.path}")
        return np.array(self.data[start:stop], dtype=self.read_dtype, order="C")

    def read_into(self, start: int, out: np.ndarray) -> None:
        """Rows [start, start + len(out)) cast into ``out``: one copy straight from the mapping."""
        out[...] = self.data[start:start + len(out)]

    def block_starts(self, start: int, stop: int, rows: int) -> list[int]:
        """Where the blocks of ``rows`` rows of a parallel pass over [start, stop) begin (any cut suits a map)."""
        return list(range(start, stop, rows)) or [start]

    def check(self, start: int, block: np.ndarray) -> None:
        """Refuse bad rows of ``block`` (rows ``start``... of this file), naming the first (``check_rows``)."""
        check_rows(self.path, start, block)

    def sha256(self) -> str:
        return file_sha256(self)

    def check_and_hash(self, chunk_rows: int = CHECK_CHUNK_ROWS) -> str:
        return check_and_hash(self, chunk_rows)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Scattered rows (sorted ascending, for sequential access) as a fresh C-contiguous array. ``take`` of
        the plain array: indexing the memmap, then copying its memmap result, took 3-25x as long (measured)."""
        rows = np.asarray(rows, dtype=np.int64)
        self._will_need(rows)
        return np.asarray(self.data).take(rows, axis=0).astype(self.read_dtype, copy=False)

    def _will_need(self, rows: np.ndarray) -> None:
        """Ask the kernel for the pages of scattered rows all at once: from a cold file they would fault in one
        at a time (2,000 rows of a 3.8 GB file: 4.8 s, against 0.05 s with this hint; measured)."""
        if _WILL_NEED is None or len(rows) == 0:
            return
        page = mmap.PAGESIZE
        lo = self.header_bytes + rows * self.row_bytes
        first, last = lo // page, (lo + self.row_bytes - 1) // page
        starts = np.concatenate([[0], np.flatnonzero(first[1:] > last[:-1] + 1) + 1])
        if len(starts) > WILL_NEED_MAX_RUNS:
            return
        ends = np.append(starts[1:], len(rows)) - 1
        for a, b in zip(first[starts].tolist(), last[ends].tolist()):
            self.raw._mmap.madvise(_WILL_NEED, a * page, (b - a + 1) * page)  # np.memmap's own mapping

    def chunks(self, chunk_rows: int) -> Iterator[tuple[int, np.ndarray]]:
        """(start, block) pairs covering every row once, in order, at most ``chunk_rows`` rows each."""
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
        for start in range(0, self.rows, chunk_rows):
            yield start, self.read(start, min(start + chunk_rows, self.rows))

    def file_bytes(self, start: int, stop: int) -> np.ndarray:
        """The file's bytes from row ``start`` to row ``stop`` (the header too when ``start`` is 0), so that
        consecutive row ranges cover every byte of the file once, in file order (in a Fortran-order .npy
        these bytes hold columns, not those rows: the byte count is what matters for hashing)."""
        lo = 0 if start == 0 else self.header_bytes + start * self.row_bytes
        return self.raw[lo:self.header_bytes + stop * self.row_bytes]

    def changed(self) -> str | None:
        """How the path's file changed since it was opened (None: it is the same, unchanged file)."""
        return self.state.change_to(file_state(self.path))

    def check_unchanged(self) -> None:
        """Refuse (exit 2) a file that changed since it was opened: what was read (or hashed) may be a mix
        of two versions, or not what the path names any more."""
        if (change := self.changed()) is not None:
            raise BadInput(self.path, f"{change} while it was being read; rerun once it is complete")


def open_vectors(path: str | os.PathLike) -> VectorFile:
    """Open a vector file after checking its extension, header and size; reads only the header."""
    ext = _extension(path, VECTOR_EXTENSIONS)
    with _open_regular(path) as (f, state):
        if ext in BIN_DTYPES:
            dtype = BIN_DTYPES[ext]
            n, d = _bin_shape(path, f, state.size, dtype.itemsize, dim_name="d")
            raw = np.memmap(f, dtype=np.uint8, mode="r")
            data = raw[HEADER_BYTES:].view(dtype).reshape(n, d)
            return VectorFile(str(path), n, d, dtype, data, raw, HEADER_BYTES, state)
        if ext in VECS_DTYPES:
            return _open_vecs(path, f, state, VECS_DTYPES[ext])
        return _open_npy(path, f, state)


def check_rows(path: str | os.PathLike, start: int, block: np.ndarray) -> None:
    """Refuse a block (rows ``start``... of ``path``) holding NaN or Inf, or a row so large that distances
    overflow float32 (they would come out as inf: an empty neighbour slot), naming the first bad row."""
    if not np.issubdtype(block.dtype, np.floating) or not block.size:
        return
    if block.dtype == np.float16:
        peak = _half_peaks(block)
    else:
        peak = np.maximum(block.max(axis=1), -block.min(axis=1))  # |largest|; NaN and Inf propagate; no temporary
    check_peaks(path, start, block, peak)


def check_peaks(path: str | os.PathLike, start: int, block: np.ndarray, peak: np.ndarray) -> None:
    """``check_rows`` given each row's largest magnitude ``peak`` (NaN or Inf where the row holds one), which a
    GPU may have computed from its own copy of ``block``: only rows whose peak could overflow are read here."""
    bad = ~np.isfinite(peak)
    if bad.any():
        raise BadInput(path, f"row {start + int(np.argmax(bad))} holds NaN or Inf values")
    tiny = (peak > 0) & (peak < MIN_ROW_PEAK)
    if tiny.any():
        i = int(np.argmax(tiny))
        raise BadInput(path, f"row {start + i}'s values are all below {MIN_ROW_PEAK:.3g} (largest {peak[i]:.3g}): "
                             "its distances would underflow float32 to 0 (scale the data up)")
    suspects = np.flatnonzero(np.square(peak, dtype=np.float64) * block.shape[1] > MAX_SQUARED_NORM)
    if suspects.size:  # only rows whose largest value could reach the limit get the exact norm
        norms = np.square(block[suspects], dtype=np.float64).sum(axis=1)
        over = norms > MAX_SQUARED_NORM
        if over.any():
            i = int(np.argmax(over))
            raise BadInput(path, f"row {start + int(suspects[i])} has squared norm {norms[i]:.3g}, above "
                                 f"{MAX_SQUARED_NORM:.3g}: its distances would overflow float32 (scale the data down)")


def _half_peaks(block: np.ndarray) -> np.ndarray:
    """Each float16 row's largest magnitude (float32; inf where a row holds Inf or NaN), from the bits: with the
    sign cleared, half-precision bit patterns order as their magnitudes do, and an integer maximum runs ~20x
    faster than NumPy's float16 reductions (which convert every element: a second per 46M values)."""
    bits = np.bitwise_and(np.ascontiguousarray(block).view(np.uint16), np.uint16(0x7FFF), dtype=np.uint16)
    top = bits.max(axis=1)
    peak = top.view(np.float16).astype(np.float32)
    peak[top >= 0x7C00] = np.inf  # exponent all ones: Inf or NaN
    return peak


def check_and_hash(vf: VectorFile, chunk_rows: int = CHECK_CHUNK_ROWS) -> str:
    """One pass over the opened file: refuse a bad row (``check_rows``) and return the sha256 of the file's
    bytes, hashed block by block as the rows are checked, from the same mapping the rows come from."""
    digest = hashlib.sha256()
    for start, block in vf.chunks(chunk_rows):
        digest.update(vf.file_bytes(start, start + len(block)))
        check_rows(vf.path, start, block)
    return digest.hexdigest()


def file_sha256(vf: VectorFile) -> str:
    """sha256 of the opened file's bytes, read from its mapping (not from the path, which may name another
    file by now); hashlib releases the GIL, so this can run beside the reads of the rows."""
    digest = hashlib.sha256()
    for start in range(0, vf.raw.size, HASH_BLOCK_BYTES):
        digest.update(vf.raw[start:start + HASH_BLOCK_BYTES])
    return digest.hexdigest()


def read_truth(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Ground truth of an ``.ibin`` file: ids (n, k) int32 and distances (n, k) float32, both memory-mapped."""
    _extension(path, (TRUTH_EXTENSION,))
    with _open_regular(path) as (f, state):
        n, k = _bin_shape(path, f, state.size, cell_bytes=8, dim_name="k")
        raw = np.memmap(f, dtype=np.uint8, mode="r")
    ids = raw[HEADER_BYTES:HEADER_BYTES + n * k * 4].view("<i4").reshape(n, k)
    dists = raw[HEADER_BYTES + n * k * 4:].view("<f4").reshape(n, k)
    return ids, dists


def _extension(path: str | os.PathLike, accepted: tuple[str, ...]) -> str:
    """The lower-cased extension of ``path``, refused unless it is one of ``accepted``."""
    ext = Path(path).suffix.lower()
    if ext not in accepted:
        raise BadInput(path, f"unknown extension {ext or '(none)'!r}; accepted: {', '.join(accepted)}")
    return ext


@contextmanager
def _open_regular(path: str | os.PathLike) -> Iterator[tuple[BinaryIO, FileState]]:
    """The file opened once (its reads and its memory map go through this one descriptor) and its state,
    refusing anything but an existing, non-empty regular file. O_NONBLOCK: opening a FIFO must not hang."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BadInput(path, "no such file") from None
    except OSError as e:
        raise BadInput(path, f"cannot read ({e.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # before fdopen, which names the descriptor ("Is a directory: 3")
        os.close(fd)
        raise BadInput(path, "is a directory, not a vectors file" if stat.S_ISDIR(st.st_mode) else
                       "not a regular file")
    with os.fdopen(fd, "rb") as f:
        if st.st_size == 0:
            raise BadInput(path, "empty file (0 bytes)")
        yield f, FileState.of(st)


def _head(path: str | os.PathLike, f: BinaryIO, size: int, nbytes: int) -> bytes:
    """The first ``nbytes`` bytes (a header), refusing files too short to hold it."""
    if size < nbytes:
        raise BadInput(path, f"file is {size} bytes, shorter than its {nbytes}-byte header")
    try:
        return os.pread(f.fileno(), nbytes, 0)
    except OSError as e:
        raise BadInput(path, f"cannot read ({e.strerror})") from None


def _check_size(path: str | os.PathLike, size: int, expected: int, shape: str) -> None:
    if size != expected:
        defect = "truncated" if size < expected else "trailing bytes"
        raise BadInput(path, f"{shape} needs {expected} bytes but the file has {size} ({defect})")


def _bin_shape(path: str | os.PathLike, f: BinaryIO, size: int, cell_bytes: int, dim_name: str) -> tuple[int, int]:
    """(n, d) of a uint32 n, uint32 d header, checked against the file size (cell_bytes per n*d cell)."""
    n, d = (int(v) for v in np.frombuffer(_head(path, f, size, HEADER_BYTES), dtype=HEADER))
    if n == 0 or d == 0:
        raise BadInput(path, f"header says n={n}, {dim_name}={d}; both must be positive")
    _check_size(path, size, HEADER_BYTES + n * d * cell_bytes, f"header n={n}, {dim_name}={d}")
    return n, d


def _open_vecs(path: str | os.PathLike, f: BinaryIO, state: FileState, dtype: np.dtype) -> VectorFile:
    """A *vecs file mapped as records (int32 d, d values); the values field is a strided view, no copy."""
    d = int(np.frombuffer(_head(path, f, state.size, VECS_DIM.itemsize), dtype=VECS_DIM)[0])
    if d <= 0:
        raise BadInput(path, f"first row says d={d}; it must be positive")
    row_bytes = VECS_DIM.itemsize + d * dtype.itemsize
    if state.size % row_bytes:
        raise BadInput(path, f"size {state.size} bytes is not a multiple of the row size {row_bytes} bytes (d={d})")
    n = state.size // row_bytes
    raw = np.memmap(f, dtype=np.uint8, mode="r")
    records = raw.view(np.dtype([("d", VECS_DIM), ("x", dtype, (d,))]))
    # every row repeats its dim: scanning them all (touching every page) catches corrupt or mis-typed files
    dims = records["d"]
    for start in range(0, n, SCAN_ROWS):
        bad = np.flatnonzero(dims[start:start + SCAN_ROWS] != d)
        if bad.size:
            row = start + int(bad[0])
            raise BadInput(path, f"row {row} says d={int(dims[row])} but row 0 says d={d} (inconsistent row dims)")
    return VectorFile(str(path), n, d, dtype, records["x"], raw, 0, state)


def _open_npy(path: str | os.PathLike, f: BinaryIO, state: FileState) -> VectorFile:
    try:
        version = np.lib.format.read_magic(f)
        read_header = _NPY_HEADER_READERS.get(version)
        if read_header is None:
            raise ValueError(f"format version {version} is not supported")
        shape, fortran, dtype = read_header(f)
    except (OSError, ValueError, EOFError) as e:
        raise BadInput(path, f"not a readable .npy file ({' '.join(str(e).split())})") from None
    if len(shape) != 2:
        raise BadInput(path, f"array has shape {shape}; expected 2-D (rows, dim)")
    if dtype not in NPY_DTYPES:
        accepted = ", ".join(str(t) for t in NPY_DTYPES)
        raise BadInput(path, f"dtype {dtype} is not accepted; accepted: {accepted}")
    n, d = shape
    if n == 0 or d == 0:
        raise BadInput(path, f"array has shape {shape}; rows and dim must be positive")
    offset = f.tell()
    _check_size(path, state.size, offset + n * d * dtype.itemsize, f"header shape {shape}")
    raw = np.memmap(f, dtype=np.uint8, mode="r")
    data = raw[offset:].view(dtype).reshape((n, d), order="F" if fortran else "C")
    return VectorFile(str(path), n, d, dtype, data, raw, offset, state)


_NPY_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
