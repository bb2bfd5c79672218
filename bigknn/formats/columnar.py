"""Parquet and Arrow IPC (Feather v2) vector files, read through pyarrow one row group (one record batch) at a time.

pyarrow does the decoding (compression, encodings, nested lists): a Parquet reader of our own would be a second,
less tested copy of it. A file is never read whole: each thread that reads rows keeps one reader and one decoded
group, of the file it read last, so memory stays at one row group per reading thread however many files. The
vectors are a ``fixed_size_list`` column (or a ``list`` column whose rows all have the same length) of float32,
float16, float64 (read as float32, as in ``.npy``), uint8 or int8; a null row, a null value, or a row of another
length is refused naming the file and the row.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from bigknn.core.errors import BadInput
from bigknn.formats.read import FileState, check_rows, file_state
from bigknn.formats.source import merged_starts, read_rows
from bigknn.formats.spec import (CHECK_CHUNK_ROWS, DECODE_READ_THREADS, HASH_BLOCK_BYTES, NPY_DTYPES,
                                 PARQUET_EXTENSIONS)

_THREAD = threading.local()  # each thread's one open reader and one decoded group (ColumnarFile._reader, _group)
INSTALL_HINT = "reading Parquet and Arrow files needs pyarrow: pip install 'bigknn[parquet]'"


def pyarrow() -> Any:
    """The pyarrow module, or a one-line BadInput saying how to install it (it is an optional extra)."""
    try:
        import pyarrow as pa
    except ImportError:
        raise BadInput("pyarrow", INSTALL_HINT) from None
    return pa


class ColumnarFile:
    """One Parquet or Arrow IPC file's vector column (and optionally an id column): a vector source
    (bigknn/formats/source.py) whose groups are decoded on demand."""

    def __init__(self, path: str | os.PathLike, column: str | None = None, id_column: str | None = None):
        self.path = str(path)
        self.parquet = Path(path).suffix.lower() in PARQUET_EXTENSIONS
        st = file_state(path)
        if st is None:
            raise BadInput(path, "no such file")
        self.state: FileState = st
        meta = self._open_reader()  # not kept open: a dataset of many files would hold a descriptor each
        schema, self.group_rows = meta.schema, meta.group_rows
        meta.close()
        self.column = _vector_column(path, schema, column)
        self.id_column = id_column
        if id_column is not None:
            _check_id_type(path, schema, id_column)
        self.rows = int(sum(self.group_rows))  # 0: an empty part, which a dataset skips (source.py)
        self.group_starts = np.concatenate([[0], np.cumsum(self.group_rows)]).astype(np.int64)
        self.dim, self.dtype = _shape_of(self, schema.field(self.column).type)

    random_access = False  # a scattered row costs decoding its whole row group
    read_threads = DECODE_READ_THREADS

    @property
    def read_dtype(self) -> np.dtype:
        return np.dtype(np.float32) if self.dtype == np.float64 else self.dtype

    def block_starts(self, start: int, stop: int, rows: int) -> list[int]:
        """Blocks of whole row groups (of at least ``rows`` rows where they allow), so that no group is
        decoded by two threads."""
        return merged_starts(start, stop, self.group_starts, rows)

    def read(self, start: int, stop: int) -> np.ndarray:
        return read_rows(self, start, stop)

    def read_into(self, start: int, out: np.ndarray) -> None:
        """Rows [start, start + len(out)) cast into ``out``, group by group."""
        row, done = start, 0
        while done < len(out):
            g = int(np.searchsorted(self.group_starts, row, side="right")) - 1
            values = self._group(g)
            lo = row - int(self.group_starts[g])
            n = min(len(out) - done, len(values) - lo)
            out[done:done + n] = values[lo:lo + n]
            row, done = row + n, done + n

    def take(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.dim), self.read_dtype)
        groups = np.searchsorted(self.group_starts, rows, side="right") - 1
        for g in np.unique(groups):
            at = np.flatnonzero(groups == g)
            out[at] = self._group(int(g))[rows[at] - self.group_starts[g]]
        return out

    def chunks(self, chunk_rows: int) -> Iterator[tuple[int, np.ndarray]]:
        for start in range(0, self.rows, chunk_rows):
            yield start, self.read(start, min(start + chunk_rows, self.rows))

    def check(self, start: int, block: np.ndarray) -> None:
        check_rows(self.path, start, block)

    def sha256(self) -> str:
        """sha256 of the file's bytes, read from a descriptor checked to be the file that was opened."""
        digest = hashlib.sha256()
        with open(self.path, "rb") as f:
            self._check_same(f)
            for block in iter(lambda: f.read(HASH_BLOCK_BYTES), b""):
                digest.update(block)
        return digest.hexdigest()

    def check_and_hash(self, chunk_rows: int = CHECK_CHUNK_ROWS) -> str:
        for start, block in self.chunks(chunk_rows):
            check_rows(self.path, start, block)
        return self.sha256()

    def user_ids(self) -> Iterator[Any]:
        """The id column, group by group, as pyarrow arrays (integers or strings), nulls refused."""
        for g in range(len(self.group_rows)):
            ids = self._reader().read(g, self.id_column)
            if ids.null_count:
                row = int(self.group_starts[g]) + int(np.flatnonzero(ids.is_null().to_numpy(zero_copy_only=False))[0])
                raise BadInput(self.path, f"row {row}: id column {self.id_column!r} is null")
            yield ids

    def changed(self) -> str | None:
        return self.state.change_to(file_state(self.path))

    def check_unchanged(self) -> None:
        if (change := self.changed()) is not None:
            raise BadInput(self.path, f"{change} while it was being read; rerun once it is complete")

    # ---- internals ------------------------------------------------------------------------------
    def _check_same(self, f: Any) -> None:
        """Refuse a path that names another file than the one opened (replaced or rewritten since)."""
        if (change := self.state.change_to(FileState.of(os.fstat(f.fileno())))) is not None:
            raise BadInput(self.path, f"{change} while it was being read; rerun once it is complete")

    def _reader(self) -> "_GroupReader":
        """This thread's reader of this file: a thread keeps one reader, of the file it read last (pyarrow's
        readers are not shared between threads; one per file would hold a descriptor per part and thread)."""
        held = getattr(_THREAD, "reader", None)
        if held is not None and held[0] is self:
            return held[1]
        if held is not None:
            held[1].close()
        _THREAD.reader = None
        reader = self._open_reader()
        _THREAD.reader = (self, reader)
        return reader

    def _open_reader(self) -> "_GroupReader":
        f = open(self.path, "rb")  # noqa: SIM115 - closed with the reader
        try:
            self._check_same(f)
            return _GroupReader(self.path, f, self.parquet)
        except BaseException:
            f.close()
            raise

    def _group(self, g: int) -> np.ndarray:
        """Group ``g``'s vectors, (rows, dim) in the stored dtype. A thread keeps only the group it decoded
        last, of any file: memory stays at one row group per reading thread, however many parts."""
        held = getattr(_THREAD, "group", None)
        if held is not None and held[0] is self and held[1] == g:
            return held[2]
        _THREAD.group = None  # let the previous group go before the next is decoded
        values = _vectors(self, g, self._reader().read(g, self.column))
        _THREAD.group = (self, g, values)
        return values


class _GroupReader:
    """Row group (or record batch) ``g`` of one column, through pyarrow's Parquet or IPC file reader."""

    def __init__(self, path: str, f: Any, parquet: bool):
        pa = pyarrow()
        try:
            if parquet:
                import pyarrow.parquet as pq
                self._pq = pq.ParquetFile(f)
                self.schema = self._pq.schema_arrow
                self.group_rows = [self._pq.metadata.row_group(i).num_rows for i in range(self._pq.num_row_groups)]
            else:
                self._ipc = pa.ipc.open_file(f)
                self.schema = self._ipc.schema
                self.group_rows = [self._ipc.get_batch(i).num_rows for i in range(self._ipc.num_record_batches)]
        except (pa.ArrowException, OSError, ValueError) as e:
            kind = "Parquet" if parquet else "Arrow IPC (Feather v2)"
            raise BadInput(path, f"not a readable {kind} file ({' '.join(str(e).split())[:200]})") from None
        self.path, self._file = path, f

    def close(self) -> None:
        self._file.close()

    def read(self, g: int, column: str) -> Any:
        """Column ``column`` of group ``g`` as one pyarrow array."""
        pa = pyarrow()
        try:
            if hasattr(self, "_pq"):
                col = self._pq.read_row_group(g, columns=[column]).column(0)
            else:
                col = self._ipc.get_batch(g).column(column)
        except (pa.ArrowException, OSError) as e:
            raise BadInput(self.path, f"row group {g} cannot be read ({' '.join(str(e).split())[:200]})") from None
        if isinstance(col, pa.ChunkedArray):
            return col.chunk(0) if col.num_chunks == 1 else pa.concat_arrays(col.chunks)
        return col


def _vector_column(path: str | os.PathLike, schema: Any, column: str | None) -> str:
    """``column``, checked to exist and to be a list column; None: the only fixed-size list column, or where
    there is none the only list column."""
    pa = pyarrow()
    if column is not None:
        if schema.get_field_index(column) < 0:
            raise BadInput(path, f"has no column {column!r}; its columns: {', '.join(schema.names)}")
        if not _is_list(pa, schema.field(column).type):
            raise BadInput(path, f"column {column!r} holds {schema.field(column).type}, not lists of numbers")
        return column
    found = [f.name for f in schema if pa.types.is_fixed_size_list(f.type)] or \
        [f.name for f in schema if _is_list(pa, f.type)]
    if len(found) != 1:
        which = f"{len(found)} ({', '.join(found)})" if found else "none"
        raise BadInput(path, f"name the vector column with --column: list columns: {which}; "
                             f"columns: {', '.join(schema.names)}")
    return found[0]


def _is_list(pa: Any, t: Any) -> bool:
    return pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)


def _check_id_type(path: str | os.PathLike, schema: Any, id_column: str) -> None:
    pa = pyarrow()
    if schema.get_field_index(id_column) < 0:
        raise BadInput(path, f"has no id column {id_column!r}; its columns: {', '.join(schema.names)}")
    t = schema.field(id_column).type
    if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise BadInput(path, f"id column {id_column!r} holds {t}; ids are integers or strings")


def _shape_of(src: ColumnarFile, t: Any) -> tuple[int, np.dtype]:
    """(dim, stored dtype) of the vector column: from the type of a fixed-size list, else from the first row."""
    pa = pyarrow()
    dtype = np.dtype(t.value_type.to_pandas_dtype()) if pa.types.is_floating(t.value_type) or \
        pa.types.is_integer(t.value_type) else None
    if dtype is None or dtype not in NPY_DTYPES:
        accepted = ", ".join(str(d) for d in NPY_DTYPES)
        raise BadInput(src.path, f"column {src.column!r} holds lists of {t.value_type}; accepted: {accepted}")
    if pa.types.is_fixed_size_list(t):
        dim = t.list_size
    elif src.rows == 0:
        return 0, dtype  # unknown, and no rows to hold any
    else:
        first = src._reader().read(0, src.column).slice(0, 1)
        if first.null_count:
            raise BadInput(src.path, f"row 0: column {src.column!r} is null")
        dim = len(first[0])
    if dim < 1:
        raise BadInput(src.path, f"column {src.column!r} holds empty lists")
    return dim, dtype


def _vectors(src: ColumnarFile, g: int, col: Any) -> np.ndarray:
    """Group ``g``'s column as a (rows, dim) array: null rows, null values and rows of another length refused."""
    pa = pyarrow()
    import pyarrow.compute as pc
    first = int(src.group_starts[g])
    if col.null_count:
        row = first + int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise BadInput(src.path, f"row {row}: column {src.column!r} is null")
    if not pa.types.is_fixed_size_list(col.type):
        lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        if (bad := np.flatnonzero(lengths != src.dim)).size:
            raise BadInput(src.path, f"row {first + int(bad[0])}: column {src.column!r} has {lengths[bad[0]]} "
                                     f"values where row 0 has {src.dim} (ragged lists)")
    values = col.flatten()
    if values.null_count:
        at = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        raise BadInput(src.path, f"row {first + at // src.dim}: column {src.column!r} holds a null value")
    return values.to_numpy(zero_copy_only=False).reshape(-1, src.dim)

