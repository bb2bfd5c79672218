"""The user's own ids of a store's rows (``--id-column``), kept once, beside the graph, indexed by input row.

Graph ids are input row numbers; a store built with an id column also holds that column, one part per input
(the build's, then each ingest's), named by the first row it covers: ``user_ids/<first row>.i64`` (int64) or
``user_ids/<first row>.utf8`` with ``<first row>.offsets`` (int64, rows + 1 of them: Arrow's large_string
layout). The parts are plain files, not zarr arrays, and the manifest is untouched: a store without them opens
as before, and a part past the manifest's rows (written by a run that did not commit) is never read. Parts are
written whole or not at all, through the store's descriptors (bigknn/shards/safepaths.py), never through a link.

Like every chunk, each part file is bound to its place: it ends in the crc32c of its name in the store followed
by its bytes, then ``MAGIC``. A part edited, or another part's file put in its place, is damage. Parts written
before parts were sealed have no trailer; they are read as they are until the store's first writer seals them,
which it does before recording the store's identity (bigknn/shards/identity.py): in a store with that record an
unsealed part is damage.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import numpy as np

from bigknn.core.errors import BadInput, Damaged
from bigknn.shards import checksums, identity, safepaths

DIR = "user_ids"
INT, STR = "int64", "string"
SUFFIX = {INT: ".i64", STR: ".utf8"}
OFFSETS = ".offsets"
# ends every sealed part, after its 4-byte checksum. No unsealed part ends so in practice: 0xff is never in UTF-8;
# as the last 4 bytes of an int64 file it is the high half of a value near 7.6e18 (no offset; an unlikely id)
MAGIC = b"\xffBKi"
TRAILER = checksums.SIZE + len(MAGIC)


class _Sealed:
    """A part file being written: its checksum, begun over its place, extended over every byte written."""

    def __init__(self, f: BinaryIO, name: str):
        self.f, self.crc = f, checksums.extend(0, _place(name).encode())

    def write(self, data: bytes | memoryview) -> None:
        self.crc = checksums.extend(self.crc, np.frombuffer(data, np.uint8))
        self.f.write(data)

    def seal(self) -> None:
        self.f.write(checksums.encode(self.crc) + MAGIC)


def _place(name: str) -> str:
    return f"{DIR}/{name}"


def write_part(store_path: Path, first_row: int, path: str, blocks: Iterator[Any]) -> tuple[str, int]:
    """Write the id blocks (pyarrow arrays; the reader refused nulls) of the input ``path`` whose first row is
    ``first_row``; return (kind, rows). Integers are kept as int64, strings as UTF-8."""
    import pyarrow as pa
    blocks = iter(blocks)
    head = next(blocks)
    kind = INT if pa.types.is_integer(head.type) else STR
    stem = f"{first_row:012d}"
    if kind == INT:
        name = stem + SUFFIX[INT]
        with safepaths.new_file(store_path, DIR, name) as f:
            out = _Sealed(f, name)
            rows = sum(_write_ints(out, path, block) for block in itertools.chain([head], blocks))
            out.seal()
        return kind, rows
    text_name, offsets_name = stem + SUFFIX[STR], stem + OFFSETS
    with safepaths.new_file(store_path, DIR, text_name) as ft, safepaths.new_file(store_path, DIR, offsets_name) as fo:
        text, offsets = _Sealed(ft, text_name), _Sealed(fo, offsets_name)
        rows, end = 0, 0
        offsets.write(np.zeros(1, "<i8").tobytes())
        for block in itertools.chain([head], blocks):
            end = _write_strings(text, offsets, path, block, end)
            rows += len(block)
        text.seal()
        offsets.seal()
    return kind, rows


def part_bytes(store_path: Path, first_row: int) -> int:
    """Bytes on disk of the id part ``write_part`` wrote for ``first_row`` (what a run's summary counts)."""
    return sum(p.stat().st_size for p in (Path(store_path) / DIR).glob(f"{first_row:012d}.*"))


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
    ``rows`` are uncommitted leftovers and ignored; a gap, a short part or one that fails its checksum is damage,
    raised (``Damaged``, naming the file)."""
    kind, parts = _parts(store_path, rows)
    if kind is None:
        return None
    sealed = identity.recorded(store_path) is not None
    folder, values, data, at = Path(store_path) / DIR, [], [], 0
    for first, p in parts:
        if first != at:
            raise Damaged(folder, f"has no ids for rows {at}..{first - 1} (a part is missing)")
        if kind == INT:
            values.append(_ints(p, sealed))
            at += len(values[-1])
            continue
        offsets = _ints(p.with_suffix(OFFSETS), sealed)
        values.append(offsets[1:] + sum(len(d) for d in data) if values else offsets)
        data.append(_payload(p, sealed))
        at += len(offsets) - 1
    if at < rows:
        raise Damaged(folder, f"holds ids of {at} rows; the store has {rows}")
    if kind == INT:
        return UserIds(INT, np.concatenate(values)[:rows])
    offsets = np.concatenate(values)[:rows + 1]
    return UserIds(STR, offsets, np.concatenate(data)[:int(offsets[-1])])


def check(store_path: Path, rows: int) -> list[Damaged]:
    """What ``load`` would find damaged in the ids of the store's first ``rows`` rows, for ``bigknn verify``:
    every part file that fails its checksum, then a gap or a short part (the first)."""
    try:
        _, parts = _parts(store_path, rows)
    except BadInput as e:
        return [Damaged(e.path, e.problem)]
    sealed = identity.recorded(store_path) is not None
    found = []
    for _, p in parts:
        for f in (p, p.with_suffix(OFFSETS)) if p.suffix == SUFFIX[STR] else (p,):
            try:
                _payload(f, sealed)
            except Damaged as e:
                found.append(e)
    if not found:
        try:
            load(store_path, rows)
        except Damaged as e:
            found.append(e)
    return found


def _ints(path: Path, sealed: bool) -> np.ndarray:
    data = _payload(path, sealed)
    if data.size % 8:
        raise Damaged(path, f"holds {data.size} bytes of ids, not a whole number of int64")
    return data.view("<i8")


def _payload(path: Path, sealed: bool) -> np.ndarray:
    """A part file's bytes, checked against its trailer's checksum for its place (``sealed``: the store's parts
    must all have one)."""
    try:
        raw = np.fromfile(path, np.uint8)
    except FileNotFoundError:
        raise Damaged(path, "user id part missing") from None
    except OSError as e:
        raise Damaged(path, f"user id part unreadable ({e.strerror or e})") from None
    if raw.size < TRAILER or raw[-len(MAGIC):].tobytes() != MAGIC:
        if sealed:
            raise Damaged(path, "user id part has no checksum (every part of this store is written with one)")
        return raw  # written before parts were sealed
    body = raw[:-TRAILER]
    crc = checksums.extend(checksums.extend(0, _place(path.name).encode()), body)
    if crc != checksums.decode(raw[-TRAILER:-len(MAGIC)].tobytes()):
        raise Damaged(path, f"user id part fails its checksum for {_place(path.name)} (edited, or another "
                            "part's bytes)")
    return body


def seal(store_path: Path) -> None:
    """Give every part of the store written before parts were sealed its trailer (each rewritten whole)."""
    folder = Path(store_path) / DIR
    if not folder.is_dir():
        return
    for p in sorted(folder.iterdir()):
        if not (p.stem.isdigit() and p.suffix in (SUFFIX[INT], SUFFIX[STR], OFFSETS)):
            continue
        raw = p.read_bytes()
        if raw.endswith(MAGIC):
            continue
        with safepaths.new_file(store_path, DIR, p.name) as f:
            out = _Sealed(f, p.name)
            out.write(raw)
            out.seal()


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
    stem = f"{first_row:012d}"
    try:
        with safepaths.owned_dir(store_path, DIR) as fd:
            for suffix in (SUFFIX[INT], SUFFIX[STR], OFFSETS):
                safepaths.remove_file(fd, stem + suffix)
    except (FileNotFoundError, NotADirectoryError):
        return


def copy_parts(src_store: Path, rows: int, dst_store: Path, first_row: int) -> None:
    """Write the ids of ``src_store``'s first ``rows`` rows into ``dst_store`` as one part starting at
    ``first_row`` (``bigknn merge`` of stores: the other store's rows come after STORE's). The ids are read
    through their checksums and written sealed for their new place (a copied file would carry the old place);
    a part past ``dst_store``'s committed rows is ignored until a commit covers it."""
    ids = require(Path(src_store), rows)
    write_part(dst_store, first_row, str(src_store), iter([ids.arrow(np.arange(len(ids)))]))
