"""The file formats' tables: extensions, stored dtypes, header layout, and the limits every reader checks."""

from __future__ import annotations

import os

import numpy as np

BIN_DTYPES: dict[str, np.dtype] = {
    ".fbin": np.dtype("<f4"),
    ".u8bin": np.dtype("u1"),
    ".i8bin": np.dtype("i1"),
    ".f16bin": np.dtype("<f2"),
}
VECS_DTYPES: dict[str, np.dtype] = {
    ".fvecs": np.dtype("<f4"),
    ".bvecs": np.dtype("u1"),
    ".ivecs": np.dtype("<i4"),
}
NPY_DTYPES: tuple[np.dtype, ...] = tuple(np.dtype(t) for t in ("<f4", "<f2", "u1", "i1", "<f8"))
VECTOR_EXTENSIONS: tuple[str, ...] = (*BIN_DTYPES, *VECS_DTYPES, ".npy")
TRUTH_EXTENSION = ".ibin"
PARQUET_EXTENSIONS: tuple[str, ...] = (".parquet", ".pq")  # read through pyarrow (bigknn/formats/columnar.py)
ARROW_EXTENSIONS: tuple[str, ...] = (".arrow", ".feather", ".ipc")  # Arrow IPC files (Feather v2)
COLUMNAR_EXTENSIONS: tuple[str, ...] = (*PARQUET_EXTENSIONS, *ARROW_EXTENSIONS)
INPUT_EXTENSIONS: tuple[str, ...] = (*VECTOR_EXTENSIONS, *COLUMNAR_EXTENSIONS)  # what a dataset's parts may be

HEADER = np.dtype("<u4")
HEADER_BYTES = 2 * HEADER.itemsize
VECS_DIM = np.dtype("<i4")
SCAN_ROWS = 1 << 22  # rows per block when scanning every *vecs row's dim field (bounds the temporaries)
# a row's squared norm above this lets a squared L2 distance |a|^2 + |b|^2 - 2ab overflow float32 to inf
MAX_SQUARED_NORM = float(np.finfo(np.float32).max) / 4
# a row whose every value is below this (but not all zero) has squares under float32's smallest normal number:
# its distances underflow to 0 (denormal rows such as 1e-42 build a graph of ties that recall scores perfect)
MIN_ROW_PEAK = float(np.sqrt(np.finfo(np.float32).tiny))
CHECK_CHUNK_ROWS = 1 << 16  # rows per block of a checking pass
HASH_BLOCK_BYTES = 16 << 20
# threads that read a source's blocks at once: a flat file's reads (and a dataset's parts hashed) are bound by
# the disk, where more than a few threads gain nothing; a columnar file's by pyarrow's decoding (which lets go
# of the GIL), so every core helps
FLAT_READ_THREADS = min(8, os.cpu_count() or 1)
DECODE_READ_THREADS = os.cpu_count() or 1



def bin_header(rows: int, dim: int) -> bytes:
    """The uint32 n, uint32 d header of a ``.*bin`` or ``.ibin`` file."""
    return np.array([rows, dim], dtype=HEADER).tobytes()
