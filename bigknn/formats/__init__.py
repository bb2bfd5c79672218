"""Streaming readers and writers for the vector and ground-truth file formats.

Inputs can be far bigger than RAM, so nothing here reads a whole file: every reader opens the file once,
checks the header against the file size and returns a memory map; callers pull rows in blocks through
``VectorFile.read`` or ``VectorFile.chunks``. Every defect of an input file is reported as one ``BadInput``
line naming the file (exit code 2), never as a numpy traceback halfway through a build. Every writer
writes a temporary file and renames it (``bigknn.core.atomic``): a file appears whole or not at all.

Formats, chosen by extension (case-insensitive):

- big-ann-benchmarks ``.fbin`` / ``.u8bin`` / ``.i8bin`` / ``.f16bin``: uint32 n, uint32 d, then n*d values.
- TEXMEX ``.fvecs`` / ``.bvecs`` / ``.ivecs``: each row is int32 d followed by d values.
- ``.npy``: a 2-D float32, float16, uint8, int8 or float64 array; float64 is read as float32, block by
  block, because every backend computes in float32 at most and a float32 copy of the file may not fit.
- Parquet ``.parquet`` / ``.pq`` and Arrow IPC (Feather v2) ``.arrow`` / ``.feather`` / ``.ipc``: a list column of
  vectors, read through pyarrow a row group at a time (``columnar.py``; pyarrow is the ``parquet`` extra).
- a directory or glob of any of these: one dataset, its parts in sorted path order (``source.py``).
- ground truth ``.ibin``: uint32 n, uint32 k, then n*k int32 ids, then n*k float32 distances.

All multi-byte values are little-endian.
"""

from bigknn.formats.read import (FileState, VectorFile, check_and_hash, check_peaks, check_rows,
                                 file_sha256, file_state, open_vectors, read_truth)
from bigknn.formats.source import PartedSource, VectorSource, cast_note, open_source
from bigknn.formats.spec import (BIN_DTYPES, CHECK_CHUNK_ROWS, COLUMNAR_EXTENSIONS, HASH_BLOCK_BYTES,
                                 INPUT_EXTENSIONS, MAX_SQUARED_NORM, NPY_DTYPES, TRUTH_EXTENSION, VECS_DTYPES,
                                 VECTOR_EXTENSIONS)
from bigknn.formats.write import npy_header, npy_writer, truth_writer, vectors_writer, write_truth, write_vectors

__all__ = ["BIN_DTYPES", "CHECK_CHUNK_ROWS", "COLUMNAR_EXTENSIONS", "INPUT_EXTENSIONS", "PartedSource",
           "VectorSource", "cast_note", "open_source", "HASH_BLOCK_BYTES", "MAX_SQUARED_NORM", "NPY_DTYPES", "TRUTH_EXTENSION",
           "VECS_DTYPES", "VECTOR_EXTENSIONS", "FileState", "VectorFile", "check_and_hash", "check_peaks", "check_rows",
           "file_sha256", "file_state", "npy_header", "npy_writer", "open_vectors", "read_truth", "truth_writer",
           "vectors_writer", "write_truth", "write_vectors"]
