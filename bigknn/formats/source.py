"""Vector sources: what the build, the labelling pass and ingest read rows from, whatever holds them.

A source is one flat file (``VectorFile``: a memory map, read with no extra copy), one Parquet or Arrow IPC file
(``ColumnarFile``: decoded a row group at a time through pyarrow), or a dataset of many such parts
(``PartedSource``: a directory or a glob, its parts in sorted path order, rows numbered across them in that
order). Every source answers the same few questions (``VectorSource``), so the passes that read rows need not
know which it is; a bad row is named by the part file that holds it and its row within that file.
"""

from __future__ import annotations

import glob
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Protocol

import numpy as np

from bigknn.core.errors import BadInput
from bigknn.formats.read import FileState, open_vectors
from bigknn.formats.spec import CHECK_CHUNK_ROWS, COLUMNAR_EXTENSIONS, FLAT_READ_THREADS, INPUT_EXTENSIONS

GLOB_CHARS = frozenset("*?[")


class VectorSource(Protocol):
    """The rows of an input, in a fixed order, and what ingest needs to recognise it again."""

    path: str  # the file, directory or glob, as errors and the manifest name it
    rows: int
    dim: int
    dtype: np.dtype  # the values as stored
    state: FileState  # a part's own state; a dataset's total size and latest mtime (its fingerprint's fields)
    column: str | None  # the column of the vectors (Parquet/Arrow)
    id_column: str | None  # the column of the user's ids, if the source has one
    random_access: bool  # whether scattered rows are cheap (a memory map) or cost decoding their row groups
    read_threads: int  # threads a parallel pass reads blocks on (formats/spec.py: disk-bound or decode-bound)

    @property
    def read_dtype(self) -> np.dtype: ...
    def read(self, start: int, stop: int) -> np.ndarray: ...
    def read_into(self, start: int, out: np.ndarray) -> None: ...
    def take(self, rows: np.ndarray) -> np.ndarray: ...
    def chunks(self, chunk_rows: int) -> Iterator[tuple[int, np.ndarray]]: ...
    def block_starts(self, start: int, stop: int, rows: int) -> list[int]: ...
    def check(self, start: int, block: np.ndarray) -> None: ...
    def sha256(self) -> str: ...
    def check_and_hash(self, chunk_rows: int = CHECK_CHUNK_ROWS) -> str: ...
    def changed(self) -> str | None: ...
    def check_unchanged(self) -> None: ...


def merged_starts(start: int, stop: int, cuts: np.ndarray, rows: int) -> list[int]:
    """Block starts in [start, stop), each at one of ``cuts`` (where decoding units begin), blocks of at least
    ``rows`` rows where the cuts allow (the last may be shorter): ``start`` first."""
    starts = [start]
    for cut in cuts[(cuts > start) & (cuts < stop)].tolist():
        if cut - starts[-1] >= rows:
            starts.append(int(cut))
    return starts


def read_rows(source: VectorSource, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of ``source`` as a new array of its read dtype: ``read`` of every source that fills
    rows through ``read_into``."""
    if not 0 <= start <= stop <= source.rows:
        raise ValueError(f"rows [{start}, {stop}) are outside [0, {source.rows}) of {source.path}")
    out = np.empty((stop - start, source.dim), source.read_dtype)
    source.read_into(start, out)
    return out


def cast_note(source: VectorSource) -> str | None:
    """The note a run gives when it reads ``source`` in another dtype (float64 as float32: every backend
    computes in float32 at most), or None."""
    if source.read_dtype == source.dtype:
        return None
    return (f"{source.path}: {source.dtype.name} values are read, stored and compared as {source.read_dtype.name} "
            f"(for ingest, a {source.dtype.name} file matches a store of {source.read_dtype.name})")


def open_source(spec: str | os.PathLike, column: str | None = None, id_column: str | None = None) -> VectorSource:
    """The source ``spec`` names: a file, a directory of part files, or a glob of them (sorted paths).
    ``column``/``id_column``: the vector and id columns of Parquet/Arrow inputs (refused for flat files)."""
    path = Path(spec)
    if path.is_dir():
        parts = [p for p in sorted(path.iterdir()) if not p.name.startswith(".") and p.is_file()
                 and p.suffix.lower() in INPUT_EXTENSIONS]
        if not parts:
            raise BadInput(path, f"is a directory holding no input files (accepted: {', '.join(INPUT_EXTENSIONS)})")
        return PartedSource(str(path), [open_part(p, column, id_column) for p in parts])
    if not path.exists() and GLOB_CHARS & set(str(spec)):
        parts = [Path(p) for p in sorted(glob.glob(str(spec))) if Path(p).is_file()]
        if not parts:
            raise BadInput(spec, "matches no files")
        return PartedSource(os.path.abspath(spec), [open_part(p, column, id_column) for p in parts])
    source = open_part(path, column, id_column)
    if source.rows == 0:
        raise BadInput(path, "holds no rows")
    return source


def open_part(path: Path, column: str | None, id_column: str | None) -> VectorSource:
    """One file as a source: Parquet/Arrow through pyarrow, anything else as a flat file."""
    if path.suffix.lower() in COLUMNAR_EXTENSIONS:
        from bigknn.formats.columnar import ColumnarFile  # imports pyarrow only when such a file is given
        return ColumnarFile(path, column, id_column)  # may have 0 rows: a dataset skips it, open_source refuses
    if column is not None or id_column is not None:
        named = ", ".join(repr(c) for c in (column, id_column) if c is not None)
        raise BadInput(path, f"is a flat file, without columns: column {named} needs Parquet or Arrow files")
    return open_vectors(path)


class PartedSource:
    """Many part files as one source: rows numbered across the parts in the order given."""

    def __init__(self, path: str, parts: list[VectorSource]):
        parts = [p for p in parts if p.rows]  # empty parts (Spark writes some) hold nothing to refuse
        if not parts:
            raise BadInput(path, "holds no rows (every file is empty)")
        first = parts[0]
        for part in parts[1:]:
            if part.dim != first.dim or part.read_dtype != first.read_dtype:
                raise BadInput(part.path, f"holds {part.dim}-dim {part.read_dtype.name} rows; {first.path} holds "
                                          f"{first.dim}-dim {first.read_dtype.name} rows (every part must match)")
        self.path, self.parts = path, parts
        self.dim, self.dtype, self.column, self.id_column = first.dim, first.dtype, first.column, first.id_column
        self.random_access = all(p.random_access for p in parts)
        self.read_threads = max(p.read_threads for p in parts)
        self.starts = np.concatenate([[0], np.cumsum([p.rows for p in parts])]).astype(np.int64)
        self.rows = int(self.starts[-1])
        self.state = FileState(size=sum(p.state.size for p in parts),
                               mtime_ns=max(p.state.mtime_ns for p in parts), ino=0, dev=0)

    @property
    def read_dtype(self) -> np.dtype:
        return self.parts[0].read_dtype

    def block_starts(self, start: int, stop: int, rows: int) -> list[int]:
        """Each part's own block starts (a block never spans two parts)."""
        return [int(self.starts[i]) + b for i, lo, hi, _ in self._spans(start, stop - start)
                for b in self.parts[i].block_starts(lo, hi, rows)]

    def read(self, start: int, stop: int) -> np.ndarray:
        return read_rows(self, start, stop)

    def read_into(self, start: int, out: np.ndarray) -> None:
        for i, lo, hi, at in self._spans(start, len(out)):
            self.parts[i].read_into(lo, out[at:at + hi - lo])

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Scattered rows, part by part; parts that decode row groups to take rows (Parquet, Arrow) are taken
        from on ``read_threads`` threads, so a sample spread over a whole dataset is decoded in parallel."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.dim), self.read_dtype)
        which = np.searchsorted(self.starts, rows, side="right") - 1

        def part(i: int) -> None:
            at = np.flatnonzero(which == i)
            out[at] = self.parts[i].take(rows[at] - self.starts[i])

        touched = np.unique(which).tolist()
        if self.random_access or len(touched) == 1:
            for i in touched:
                part(i)
        else:
            with ThreadPoolExecutor(self.read_threads, thread_name_prefix="take") as pool:
                list(pool.map(part, touched))
        return out

    def chunks(self, chunk_rows: int) -> Iterator[tuple[int, np.ndarray]]:
        for start in range(0, self.rows, chunk_rows):
            yield start, self.read(start, min(start + chunk_rows, self.rows))

    def check(self, start: int, block: np.ndarray) -> None:
        """Refuse bad rows, naming the part file and the row within it."""
        for i, lo, hi, at in self._spans(start, len(block)):
            self.parts[i].check(lo, block[at:at + hi - lo])

    def sha256(self) -> str:
        """sha256 of the parts' sha256s in order: the same parts give the same hash wherever they lie. The
        parts are hashed on ``FLAT_READ_THREADS`` threads (hashlib lets go of the GIL), so that a dataset of many
        parts is not hashed at one core's pace while its rows are decoded on every core."""
        with ThreadPoolExecutor(FLAT_READ_THREADS, thread_name_prefix="hash") as pool:
            return _combine(pool.map(lambda part: part.sha256(), self.parts))

    def check_and_hash(self, chunk_rows: int = CHECK_CHUNK_ROWS) -> str:
        return _combine(p.check_and_hash(chunk_rows) for p in self.parts)

    def user_ids(self) -> Iterator[Any]:
        for part in self.parts:
            yield from part.user_ids()

    def changed(self) -> str | None:
        for part in self.parts:
            if (change := part.changed()) is not None:
                return f"part {part.path} {change}"
        return None

    def check_unchanged(self) -> None:
        for part in self.parts:
            part.check_unchanged()

    def _spans(self, start: int, count: int) -> Iterator[tuple[int, int, int, int]]:
        """(part, first row in it, end row in it, offset in the block) covering rows [start, start + count)."""
        row, stop = start, start + count
        while row < stop:
            i = int(np.searchsorted(self.starts, row, side="right")) - 1
            lo = row - int(self.starts[i])
            hi = min(self.parts[i].rows, stop - int(self.starts[i]))
            yield i, lo, hi, row - start
            row += hi - lo


def _combine(hashes: Iterator[str]) -> str:
    digest = hashlib.sha256()
    for h in hashes:
        digest.update(h.encode())
    return digest.hexdigest()
