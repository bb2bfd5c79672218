"""Vectors a store references instead of copying (``bigknn build --vectors reference``): a shard whose entry has
a ``source`` ({"input": index into the manifest's ``inputs``, "byte_offset": where its first row starts}) reads
its rows from that byte range of the input file, mapped.

The input's fingerprint (path, size, mtime_ns, and the sha256 the sharding pass computed) is in ``inputs``: a
file missing, moved, or of another size or mtime than recorded is refused in one line naming it (exit 2), and
so is one that changes while mapped, so that no read returns rows of other bytes than the build saw
(``bigknn verify`` rehashes it). Only flat files whose rows lie at fixed byte offsets can be referenced, and
only where the store keeps the rows as they are (not cosine, whose rows are stored normalised)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from bigknn.core.errors import BadInput
from bigknn.formats.read import VectorFile, file_state, open_vectors

FLAT_SUFFIXES = (".fbin", ".u8bin", ".i8bin", ".f16bin", ".npy")  # rows at fixed byte offsets
MODES = ("copy", "reference")  # --vectors


def refusal(suffix: str, metric_normalises: bool, partition: str, flat: bool) -> str | None:
    """Why an input file of ``suffix`` (``flat``: one file whose rows lie in order at fixed byte offsets)
    cannot be referenced (one line), or None."""
    if not flat or suffix not in FLAT_SUFFIXES:
        return (f"--vectors reference needs one flat file ({' '.join(FLAT_SUFFIXES)}) whose rows lie at fixed "
                "byte offsets; use --vectors copy")
    if metric_normalises:
        return ("--vectors reference keeps rows as the file has them, and metric cosine stores them normalised "
                "(normalising on every read would cost every merge); use --vectors copy, or normalise the file "
                "and use --metric ip")
    if partition != "contiguous":
        return (f"--vectors reference reads each shard as one range of the file; --partition {partition} stores "
                "scattered rows: use --partition contiguous or --vectors copy")
    return None


class References:
    """The opened inputs of one store's referenced shards, each mapped once and checked against its
    fingerprint when opened and before each read."""

    def __init__(self, store: Path, inputs: list[dict], dim: int):
        self.store, self.inputs, self.dim = Path(store), inputs, dim
        self._open: dict[int, VectorFile] = {}
        self._lock = threading.Lock()

    def file(self, index: int) -> VectorFile:
        with self._lock:
            vf = self._open.get(index)
            if vf is None:
                vf = self._open[index] = self._check(self.inputs[index])
        if (change := vf.changed()) is not None:
            raise BadInput(vf.path, f"{change} while {self.store} reads the vectors it references; rebuild the "
                                    "store from the file as it is now")
        return vf

    def _check(self, rec: dict) -> VectorFile:
        path = Path(rec["path"])
        state = file_state(path)
        if state is None:
            raise BadInput(path, f"missing: {self.store} references its vectors (moved or deleted?); put it back "
                                 "or rebuild")
        if state.size != rec["size"] or state.mtime_ns != rec["mtime_ns"]:
            raise BadInput(path, f"changed since {self.store} referenced it (size or mtime differs); put the "
                                 "original back or rebuild")
        vf = open_vectors(path)
        if vf.rows != rec["rows"] or vf.dim != self.dim:
            raise BadInput(path, f"holds {vf.rows} x {vf.dim} rows; {self.store} references {rec['rows']} x "
                                 f"{self.dim}")
        return vf

    def rows(self, source: dict, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of the shard whose rows begin at ``source``."""
        vf = self.file(source["input"])
        first = (source["byte_offset"] - vf.header_bytes) // vf.row_bytes
        return vf.read(first + start, first + stop)

    def take(self, source: dict, rows: np.ndarray) -> np.ndarray:
        """Scattered rows (local to the shard) of the shard whose rows begin at ``source``."""
        vf = self.file(source["input"])
        first = (source["byte_offset"] - vf.header_bytes) // vf.row_bytes
        rows = np.asarray(rows, np.int64)
        order = np.argsort(rows, kind="stable")  # VectorFile.take wants them ascending
        out = np.empty((len(rows), vf.dim), vf.read_dtype)
        out[order] = vf.take(rows[order] + first)
        return out

    def close(self) -> None:
        with self._lock:
            self._open.clear()
