"""In-memory arrays as pipeline inputs: the pipeline streams files (hashing, resuming and ingesting by
file), so an array is written once to a ``.npy`` file it can stream, whose rows the build checks as it reads them.

Accepted: NumPy arrays, CuPy arrays (copied to the host: the store is on disk), and anything ``np.asarray``
takes (``__array__``: PyTorch CPU tensors, pandas frames, memory maps). float32, float16, uint8 and int8
keep their dtype; every other dtype becomes float32, what the backends compute in.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from bigknn.core.atomic import allocate
from bigknn.core.errors import BadInput, disk_full_named
from bigknn.formats import npy_header
from bigknn.shards import Store

ARRAY = "array"  # how errors name an in-memory input
KEPT_DTYPES = tuple(np.dtype(t) for t in ("<f4", "<f2", "u1", "i1"))
SPILL_ROWS = 1 << 16  # rows converted and written at a time
SPILL_THREADS = min(8, os.cpu_count() or 1)


def host_array(data: object) -> np.ndarray:
    """``data`` as a 2-D host array without copying what is already one (CuPy arrays are copied over)."""
    cupy = sys.modules.get("cupy")  # a CuPy array implies CuPy is imported; never import it here
    x = cupy.asnumpy(data) if cupy is not None and isinstance(data, cupy.ndarray) else np.asarray(data)
    if x.ndim != 2 or 0 in x.shape:
        raise BadInput(ARRAY, f"has shape {x.shape}; expected 2-D (rows, dim) with rows and dim positive")
    if x.dtype.kind not in "biuf":
        raise BadInput(ARRAY, f"holds {x.dtype} values; expected numbers")
    return x


def kept_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a build keeps an array's rows in: KEPT_DTYPES as they are, every other dtype float32."""
    return dtype if dtype in KEPT_DTYPES else np.dtype(np.float32)


def spill(data: object, path: Path) -> Path:
    """Write ``data`` to the new ``.npy`` file ``path``; return the path. It is scratch that the build reads
    once and deletes with its folder, so it goes to the page cache unsynced (a crash loses only the build, which
    an array cannot resume anyway), in blocks a thread each (``os.pwrite`` and the casts drop the GIL), and
    unchecked: the sharding pass checks every row it reads and names the array's row. A 740K x 384 float32
    array took ~0.5 s more through the API than its file through the CLI, synced and checked twice (session 31)."""
    x = host_array(data)
    dtype = kept_dtype(x.dtype)
    header = npy_header(dtype, x.shape)
    row_bytes = x.shape[1] * dtype.itemsize
    size = len(header) + x.shape[0] * row_bytes
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with disk_full_named(path, size):
            allocate(fd, size)  # a full disk is named before any work
            _write_at(fd, 0, header)

            def block(start: int) -> None:
                _write_at(fd, len(header) + start * row_bytes,
                          np.ascontiguousarray(x[start:start + SPILL_ROWS], dtype=dtype))

            with ThreadPoolExecutor(SPILL_THREADS) as pool:
                for done in [pool.submit(block, a) for a in range(0, x.shape[0], SPILL_ROWS)]:
                    done.result()
    finally:
        os.close(fd)
    return path


def _write_at(fd: int, offset: int, data: bytes | np.ndarray) -> None:
    """All of ``data``'s bytes at ``offset`` of the open file ``fd`` (pwrite may write fewer at a time)."""
    view = memoryview(data).cast("B")
    while view.nbytes:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


@contextmanager
def input_file(data: Any, store: Path, new_store: bool) -> Iterator[Path]:
    """A file the pipeline can stream: ``data`` itself when it is a path, else ``data`` written to a
    temporary ``.npy`` beside ``store`` (on its file system, which has room for the vectors anyway)."""
    if isinstance(data, (str, os.PathLike)):
        yield Path(data)
        return
    if new_store and Store.exists(store):
        raise BadInput(store, "exists; an array is built into a new store (bigknn.open reads this one)")
    store.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".bigknn-input-", dir=store.parent) as tmp:
        path = spill(data, Path(tmp) / "array.npy")
        try:
            yield path
        except BadInput as e:  # name the caller's array, not the temporary file
            if e.path != str(path):
                raise
            raise BadInput(ARRAY, e.problem) from None
