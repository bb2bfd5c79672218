"""The user's own ids of a store's rows (``--id-column``), kept once, beside the graph, indexed by input row.

Graph ids are input row numbers; a store built with an id column also holds that column, one part per input
(the build's, then each ingest's), named by the first row it covers: ``user_ids/<first row>.i64`` (int64) or
``user_ids/<first row>.utf8`` with ``<first row>.offsets`` (int64, rows + 1 of them: Arrow's large_string
layout, so pyarrow reads it without a copy and NumPy without pyarrow). The parts are plain files, not zarr
arrays, and the manifest is untouched: a store without them opens as before, and a part past the manifest's
rows (written by a run that did not commit) is never read. Parts are written whole or not at all.
"""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from bigknn.atomic import atomic_path
from bigknn.errors import BadInput

DIR = "user_ids"
INT, STR = "int64", "string"
SUFFIX = {INT: ".i64", STR: ".utf8"}
OFFSETS = ".offsets"


def write_part(store_path: Path, first_row: int, path: str, blocks: Iterator[Any]) -> tuple[str, int]:
    """Write the id blocks (pyarrow arrays; the reader refused nulls) of the input ``path`` whose first row is
    ``first_row``; return (kind, rows). Integers are kept as int64, strings as UTF-8."""
    import pyarrow as pa
    blocks = iter(blocks)
    head = next(blocks)
    kind = INT if pa.types.is_integer(head.type) else STR
    folder = Path(store_path) / DIR
    folder.mkdir(exist_ok=True)
    stem = folder / f"{first_row:012d}"
    if kind == INT:
        with atomic_path(stem.with_suffix(SUFFIX[INT])) as tmp, open(tmp, "wb") as f:
            rows = sum(_write_ints(f, path, block) for block in itertools.chain([head], blocks))
        return kind, rows
    with atomic_path(stem.with_suffix(SUFFIX[STR])) as text, atomic_path(stem.with_suffix(OFFSETS)) as offs, \
            open(text, "wb") as ft, open(offs, "wb") as fo:
        rows, end = 0, 0
        fo.write(np.zeros(1, "<i8").tobytes())
        for block in itertools.chain([head], blocks):
            end = _write_strings(ft, fo, path, block, end)
            rows += len(block)
    return kind, rows


def _write_ints(f: Any, path: str, block: Any) -> int:
    import pyarrow as pa
    import pyarrow.compute as pc
    if not pa.types.is_integer(block.type):
        raise BadInput(path, f"its parts hold ids of different types ({block.type} and integers)")
    try:
        f.write(pc.cast(block, pa.int64()).to_numpy().astype("<i8", copy=False).tobytes())
    except pa.ArrowInvalid as e:
        raise BadInput(path, f"an id does not fit int64 ({e})") from None
    return len(block)


def _write_strings(ft: Any, fo: Any, path: str, block: Any, end: int) -> int:
    """Append a block of string ids: its UTF-8 bytes and its end offsets (after ``end`` bytes so far)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    if pa.types.is_integer(block.type):
        raise BadInput(path, "its parts hold ids of different types (strings and integers)")
    block = pc.cast(block, pa.large_string())
    o = np.frombuffer(block.buffers()[1], "<i8")[block.offset:block.offset + len(block) + 1]
    fo.write((o[1:] - o[0] + end).astype("<i8").tobytes())
    ft.write(memoryview(block.buffers()[2])[int(o[0]):int(o[-1])])
    return end + int(o[-1] - o[0])


class UserIds:
    """The ids of rows [0, rows) of a store, as NumPy (int64, or an object array of str) or pyarrow arrays."""

    def __init__(self, kind: str, values: np.ndarray, data: np.ndarray | None = None):
        self.kind, self.values, self.data = kind, values, data  # values: int64 ids, or string offsets

    def __len__(self) -> int:
        return len(self.values) - (self.kind == STR)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The ids of input rows ``rows`` (any shape): int64, or an object array of ``str``. A row -1 (no
        neighbour found) stays -1, or becomes None among strings."""
        rows = np.asarray(rows, dtype=np.int64)
        at = np.maximum(rows, 0)
        if self.kind == INT:
            return np.where(rows >= 0, self.values[at], -1)
        # strings: decode each id once, whichever is fewer: the rows asked for, or every row
        found = self._strings(np.arange(len(self)))[at] if rows.size > len(self) else self._strings(at)
        return np.where(rows >= 0, found, None)

    def arrow(self, rows: np.ndarray) -> Any:
        """The ids of ``rows`` (1-D) as a pyarrow array, strings taken without decoding to Python objects."""
        import pyarrow as pa
        rows = pa.array(np.asarray(rows, dtype=np.int64))
        if self.kind == INT:
            return pa.array(self.values).take(rows)
        whole = pa.LargeStringArray.from_buffers(len(self), pa.py_buffer(np.ascontiguousarray(self.values)),
                                                 pa.py_buffer(np.ascontiguousarray(self.data)))
        return whole.take(rows)

    def _strings(self, rows: np.ndarray) -> np.ndarray:
        """The string ids of ``rows`` (any shape), decoded, as an object array."""
        raw = self.data.tobytes()
        out = np.empty(rows.shape, object)
        out.ravel()[:] = [raw[a:b].decode() for a, b in zip(self.values[rows.ravel()].tolist(),
                                                             self.values[rows.ravel() + 1].tolist())]
        return out


def load(store_path: Path, rows: int) -> UserIds | None:
    """The ids of a store's first ``rows`` rows (its committed ones), or None if it keeps none. Parts beyond
    ``rows`` are uncommitted leftovers and ignored; a gap or a short part is damage, reported."""
    kind, parts = _parts(store_path, rows)
    if kind is None:
        return None
    folder, values, data, at = Path(store_path) / DIR, [], [], 0
    for first, p in parts:
        if first != at:
            raise BadInput(folder, f"has no ids for rows {at}..{first - 1} (a part is missing)")
        if kind == INT:
            values.append(np.fromfile(p, "<i8"))
            at += len(values[-1])
            continue
        offsets = np.fromfile(p.with_suffix(OFFSETS), "<i8")
        values.append(offsets[1:] + sum(len(d) for d in data) if values else offsets)
        data.append(np.fromfile(p, np.uint8))
        at += len(offsets) - 1
    if at < rows:
        raise BadInput(folder, f"holds ids of {at} rows; the store has {rows}")
    if kind == INT:
        return UserIds(INT, np.concatenate(values)[:rows])
    offsets = np.concatenate(values)[:rows + 1]
    return UserIds(STR, offsets, np.concatenate(data)[:int(offsets[-1])])


def stored_kind(store_path: Path, rows: int) -> str | None:
    """The kind of ids (INT or STR) a store keeps for its first ``rows`` rows, None if none; reads no ids."""
    return _parts(store_path, rows)[0]


def _parts(store_path: Path, rows: int) -> tuple[str | None, list[tuple[int, Path]]]:
    """(kind, [(first row, path)] in row order) of the id parts that start below ``rows``."""
    folder = Path(store_path) / DIR
    if not folder.is_dir():
        return None, []
    parts = sorted((int(p.stem), p) for p in folder.iterdir()
                   if p.stem.isdigit() and p.suffix in (SUFFIX[INT], SUFFIX[STR]) and int(p.stem) < rows)
    kinds = {INT if p.suffix == SUFFIX[INT] else STR for _, p in parts}
    if len(kinds) > 1:
        raise BadInput(folder, "holds both integer and string id parts")
    return (kinds.pop() if kinds else None), parts


def require(store_path: Path, rows: int) -> UserIds:
    """``load``, refusing a store that keeps no user ids (the one-line error says how to get them)."""
    ids = load(store_path, rows)
    if ids is None:
        raise BadInput(store_path, "keeps no user ids: build it with --id-column NAME (Parquet/Arrow inputs)")
    return ids


def remove_part(store_path: Path, first_row: int) -> None:
    """Remove the (uncommitted) part starting at ``first_row``, if any."""
    stem = Path(store_path) / DIR / f"{first_row:012d}"
    for suffix in (SUFFIX[INT], SUFFIX[STR], OFFSETS):
        with_suffix = stem.with_suffix(suffix)
        if with_suffix.exists():
            os.remove(with_suffix)


def copy_parts(src_store: Path, rows: int, dst_store: Path, first_row: int) -> None:
    """Copy the id parts of ``src_store``'s first ``rows`` rows into ``dst_store``, renamed to start at
    ``first_row`` (``bigknn merge`` of stores: the other store's rows come after STORE's). Each part is written
    whole or not at all; one past ``dst_store``'s committed rows is ignored until a commit covers it."""
    kind, parts = _parts(src_store, rows)
    folder = Path(dst_store) / DIR
    folder.mkdir(exist_ok=True)
    suffixes = (SUFFIX[INT],) if kind == INT else (SUFFIX[STR], OFFSETS)
    for first, path in parts:
        for suffix in suffixes:
            with atomic_path((folder / f"{first_row + first:012d}").with_suffix(suffix)) as tmp:
                shutil.copyfile(path.with_suffix(suffix), tmp)
