"""The checksummed zarr arrays of a store directory: written whole (chunk bytes through ``chunks``, direct file
I/O, where the layout allows it, else through zarr, which creates every array's metadata with a checksum per
chunk), read by row ranges or row sets, and checked; a missing or damaged chunk raises ``Damaged``.
``Store`` (bigknn/shards/store.py) is one of these with a manifest saying what the arrays are."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
from numpy.typing import DTypeLike

from bigknn.core.errors import Damaged, disk_full_named
from bigknn.shards import checksums, chunk_writes, chunks, safepaths
from bigknn.shards.chunks import Buffer
from bigknn.shards.manifest import Manifest


def tree_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (files deleted meanwhile are skipped)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


class ReadBuffers:
    """One reading thread's arrays, one per array it reads (``name``), reused from one read to the next and
    grown as needed: a thread that reads a large store block after block takes the page faults of fresh
    memory once, not once per block. What a read returns is a view that the thread's next read overwrites."""

    def __init__(self) -> None:
        self._held: dict[str, np.ndarray] = {}

    def of(self, name: str) -> Buffer:
        def buffer(shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
            nbytes = shape[0] * shape[1] * np.dtype(dtype).itemsize
            held = self._held.get(name)
            if held is None or held.nbytes < nbytes:
                held = self._held[name] = np.empty(nbytes, np.uint8)
            return held[:nbytes].view(dtype).reshape(shape)
        return buffer


class ArrayDir:
    """The arrays under ``path``, checked as ``manifest``'s format requires."""

    path: Path
    manifest: Manifest

    def _write_array(self, name: str, data: np.ndarray, chunk_rows: int, dtype: DTypeLike) -> int:
        """Write array ``name`` whole; returns the bytes its files take on disk (what a run's summary counts)."""
        import zarr  # here, not at import: commands that only read a store never load it (a third of a second)

        with disk_full_named(self.path / name, data.shape[0] * data.shape[1] * np.dtype(dtype).itemsize):
            safepaths.fresh_dir(self.path, name)  # zarr's overwrite would follow a link in its way
            arr = zarr.create_array(store=str(self.path), name=name, shape=data.shape,
                                    chunks=(chunk_rows, data.shape[1]), dtype=dtype, compressors=checksums.codecs(),
                                    overwrite=True, config={"write_empty_chunks": True})
            if not chunk_writes.write_array(self.path / name, data, place=name):
                arr[:] = data.astype(dtype, copy=False)
        return tree_bytes(self.path / name)

    def _required(self) -> dict[str, bool]:
        """What every array of this store must carry: chunk checksums (format 2), bound to their place (6)."""
        return {"require_checksums": self.manifest.checksummed, "require_places": self.manifest.placed}

    def _read_array(self, name: str, where: str, start: int = 0, stop: int | None = None,
                    buffer: Buffer | None = None) -> np.ndarray:
        try:
            out = chunks.read_rows(self.path / name, start, stop, **self._required(), buffer=buffer)
            if out is None:
                out = self._zarr_read(name, start, stop)
        except Damaged as e:
            raise Damaged(e.file, f"{e.problem} (`bigknn verify {self.path}` lists all damage and what repairs it)",
                          where) from None
        return out

    def _zarr_read(self, name: str, start: int, stop: int | None) -> np.ndarray:
        """The fallback for layouts ``chunks`` does not handle: zarr checks the checksums; missing chunks are
        found here (zarr would read them as the fill value)."""
        import zarr

        arr = zarr.open_array(store=str(self.path), path=name, mode="r")
        checksummed = checksums.present(arr.metadata.to_dict())
        if self.manifest.checksummed and not checksummed:
            raise Damaged(self.path / name / "zarr.json", "array has no chunk checksums")
        if checksummed and arr.nchunks_initialized < arr.nchunks:
            raise Damaged(self.path / name, f"{arr.nchunks - arr.nchunks_initialized} of its {arr.nchunks} "
                                            "chunk files missing")
        try:
            return arr[start:stop]
        except ValueError as e:  # zarr's crc32c codec: stored and computed checksums differ
            raise Damaged(self.path / name, f"a chunk fails its checksum ({e})") from None

    def array_meta(self, name: str) -> dict:
        """An array's zarr.json; Damaged when it is missing or unreadable."""
        return chunks.metadata(self.path / name)

    def check_array(self, name: str, contents: bool,
                    visit: Callable[[np.ndarray], None] | None = None) -> list[Damaged]:
        """Every missing or damaged chunk of an array (``chunks.check``); for layouts it does not handle, the
        whole array is read through zarr, which reports the first damage only."""
        try:
            found = chunks.check(self.path / name, contents, visit, **self._required())
            if found is not None:
                return found
            data = self._zarr_read(name, 0, None)
            if visit is not None:
                visit(data)
            return []
        except Damaged as e:
            return [e]

    def _read_array_rows(self, name: str, where: str, rows: np.ndarray) -> np.ndarray:
        try:
            out = chunks.read_row_set(self.path / name, rows, **self._required())
        except Damaged as e:
            raise Damaged(e.file, f"{e.problem} (`bigknn verify {self.path}` lists all damage and what repairs it)",
                          where) from None
        if out is None:  # a layout zarr reads: one row at a time
            out = np.concatenate([self._read_array(name, where, int(r), int(r) + 1) for r in rows])
        return out

    def disk_bytes(self) -> int:
        """Bytes of every file under the store (files a writer deletes meanwhile are skipped)."""
        return tree_bytes(self.path)
