"""Writers: every file is written under a temporary name and renamed (``bigknn.core.atomic``), so it appears whole
or not at all; the block writers map a file allocated in full first, so a full disk is an error, not a SIGBUS."""

from __future__ import annotations

import io
import os
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

from bigknn.core.atomic import atomic_path
from bigknn.core.errors import disk_full_named
from bigknn.formats.spec import BIN_DTYPES, NPY_DTYPES, TRUTH_EXTENSION, bin_header


def write_vectors(path: str | os.PathLike, x: np.ndarray) -> None:
    """Write a whole in-memory array as a ``.*bin`` or ``.npy`` file, atomically (temp file + rename)."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D array, got shape {x.shape}")
    ext = _writable_extension(path, x.shape[0], x.shape[1], x.dtype)
    with _atomic_write(path) as f:
        if ext == ".npy":
            np.save(f, x)
        else:
            f.write(bin_header(*x.shape))
            x.tofile(f)  # tofile writes C order whatever the array's layout


@contextmanager
def vectors_writer(path: str | os.PathLike, rows: int, dim: int, dtype: np.dtype | type) -> Iterator[np.memmap]:
    """Yield a writable memmap of a new ``.*bin`` or ``.npy`` file's values, so that sets bigger than RAM
    can be written block by block; the file appears under ``path`` only when the block exits cleanly."""
    dtype = np.dtype(dtype)
    if _writable_extension(path, rows, dim, dtype) == ".npy":
        with npy_writer(path, dtype, (rows, dim)) as out:
            yield out
        return
    with _mapped_output(path, bin_header(rows, dim), [(dtype, (rows, dim))]) as (out,):
        yield out


@contextmanager
def npy_writer(path: str | os.PathLike, dtype: np.dtype | type, shape: tuple[int, int]) -> Iterator[np.memmap]:
    """Yield a writable memmap of a new C-order ``.npy`` file; it appears under ``path`` only when the block
    exits cleanly."""
    dtype = np.dtype(dtype)
    with _mapped_output(path, npy_header(dtype, shape), [(dtype, shape)]) as (out,):
        yield out


def npy_header(dtype: np.dtype, shape: tuple[int, int]) -> bytes:
    """The header of a C-order ``.npy`` file of ``shape`` values of ``dtype`` (format 1.0)."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
                 "shape": tuple(shape)})
    return header.getvalue()


@contextmanager
def truth_writer(path: str | os.PathLike, rows: int, k: int) -> Iterator[tuple[np.memmap, np.memmap]]:
    """Yield writable (ids, dists) memmaps of a new ``.ibin`` file, written block by block; the file
    appears under ``path`` only when the block exits cleanly."""
    if Path(path).suffix.lower() != TRUTH_EXTENSION:
        raise ValueError(f"ground truth is written as {TRUTH_EXTENSION}, not {path}")
    with _mapped_output(path, bin_header(rows, k), [(np.dtype("<i4"), (rows, k)), (np.dtype("<f4"), (rows, k))]) \
            as (ids, dists):
        yield ids, dists


def write_truth(path: str | os.PathLike, ids: np.ndarray, dists: np.ndarray) -> None:
    """Write ground truth as ``.ibin`` (ids as int32, distances as float32), atomically."""
    if Path(path).suffix.lower() != TRUTH_EXTENSION:
        raise ValueError(f"ground truth is written as {TRUTH_EXTENSION}, not {path}")
    ids, dists = np.asarray(ids), np.asarray(dists)
    if ids.ndim != 2 or ids.shape != dists.shape:
        raise ValueError(f"ids {ids.shape} and dists {dists.shape} must be 2-D of one shape")
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be integers, got {ids.dtype}")
    limits = np.iinfo(np.int32)
    if ids.size and (ids.min() < limits.min or ids.max() > limits.max):
        raise ValueError("ids do not fit in int32")
    with _atomic_write(path) as f:
        f.write(bin_header(*ids.shape))
        ids.astype("<i4").tofile(f)
        dists.astype("<f4").tofile(f)


def _writable_extension(path: str | os.PathLike, rows: int, dim: int, dtype: np.dtype) -> str:
    """The extension to write ``path`` as, after checking that the result would be a valid input file."""
    ext = Path(path).suffix.lower()
    if rows < 1 or dim < 1:
        raise ValueError(f"rows and dim must be positive, got {rows} x {dim}")
    if ext == ".npy":
        if dtype not in NPY_DTYPES:
            raise ValueError(f"dtype {dtype} cannot be written as .npy input")
    elif ext in BIN_DTYPES:
        if dtype != BIN_DTYPES[ext]:
            raise ValueError(f"{ext} holds {BIN_DTYPES[ext]}, not {dtype}")
        if rows >= 2**32 or dim >= 2**32:
            raise ValueError(f"{ext} headers are uint32; {rows} x {dim} does not fit")
    else:
        raise ValueError(f"cannot write {ext or 'no extension'}; writable: {', '.join((*BIN_DTYPES, '.npy'))}")
    return ext


@contextmanager
def _atomic_write(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A file object whose bytes appear under ``path`` only when the block exits cleanly (bigknn.core.atomic)."""
    with atomic_path(path) as tmp, disk_full_named(path, None), open(tmp, "wb") as f:
        yield f


@contextmanager
def _mapped_output(path: str | os.PathLike, header: bytes,
                   arrays: list[tuple[np.dtype, tuple[int, int]]]) -> Iterator[list[np.memmap]]:
    """Writable memmaps of the arrays laid out one after the other behind ``header`` in a new file that
    appears under ``path`` only when the block exits cleanly. The file is allocated in full first, so a
    full disk is an error here and not a SIGBUS in the middle of the writes."""
    size = len(header) + sum(np.dtype(dtype).itemsize * rows * cols for dtype, (rows, cols) in arrays)
    with atomic_path(path, size) as tmp:
        with disk_full_named(path, size), open(tmp, "r+b") as f:
            f.write(header)
        maps, offset = [], len(header)
        for dtype, shape in arrays:
            maps.append(np.memmap(tmp, dtype=dtype, mode="r+", offset=offset, shape=shape))
            offset += maps[-1].nbytes
        yield maps
        for m in maps:
            m.flush()
