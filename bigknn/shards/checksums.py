"""Chunk checksums: the crc32c of each chunk's bytes, appended to the chunk file as 4 little-endian bytes.

This is zarr v3's own ``crc32c`` codec placed after the ``bytes`` codec, so the checksum lives in the chunk
file itself (written by the same write, never out of step with it), and zarr checks it too: on the store's
fallback path and in any other zarr reader. crc32c comes from google-crc32c, a dependency of zarr 3: with the
CPU's crc instruction it runs at about 9 GB/s on one core, where the stdlib's ``zlib.crc32`` manages 1.9 GB/s
(384 MB, this project's 2-core machine), so checking in the same pass as the chunk I/O costs little.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Callable

import google_crc32c
import numpy as np

from bigknn.core.errors import Damaged

NAME = "crc32c"  # the codec's name in an array's zarr.json
SIZE = 4  # bytes the checksum adds to each chunk file


def codecs() -> list:
    """The ``compressors`` of every array the store creates: no compression, a checksum per chunk."""
    from zarr.codecs import Crc32cCodec  # zarr is loaded by the writers only

    return [Crc32cCodec()]


def present(meta: dict) -> bool:
    """Whether an array's metadata (its zarr.json) checksums every chunk: crc32c last among its codecs."""
    codec_list = meta.get("codecs") or [{}]
    return isinstance(codec_list[-1], dict) and codec_list[-1].get("name") == NAME


def _threaded_extend() -> Callable[[int, int, int], int] | None:
    """google_crc32c's C library's ``crc32c_extend(crc, pointer, length)`` called through ctypes, which lets
    other Python threads run during the call: the extension's own ``extend`` holds the GIL, so threads that
    read chunks at once took turns to checksum them. None where the wheel's library is not found (a source
    build, a pure-Python fallback): then the extension's ``extend`` serves."""
    if getattr(google_crc32c, "implementation", "") != "c":
        return None
    libs = Path(google_crc32c.__file__).resolve().parent.parent / "google_crc32c.libs"
    for path in sorted(libs.glob("libcrc32c*.so*")):
        try:
            fn = ctypes.CDLL(str(path)).crc32c_extend
        except (OSError, AttributeError):
            continue
        fn.restype, fn.argtypes = ctypes.c_uint32, [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
        return fn
    return None


_EXTEND = _threaded_extend()
THREADED_BYTES = 1 << 16  # pieces at least this large go through ctypes; smaller ones are not worth a release


def extend(crc: int, data: np.ndarray | bytes) -> int:
    """``crc`` extended over ``data`` (a C-contiguous array or bytes); start from 0. Large arrays are checksummed
    with the GIL released (``_threaded_extend``)."""
    if _EXTEND is not None and isinstance(data, np.ndarray) and data.nbytes >= THREADED_BYTES:
        if not data.flags.c_contiguous:
            raise ValueError("checksums.extend needs a C-contiguous array")
        return int(_EXTEND(crc, data.ctypes.data, data.nbytes))
    return google_crc32c.extend(crc, data)


def encode(crc: int) -> bytes:
    return crc.to_bytes(SIZE, "little")


def decode(stored: bytes) -> int:
    return int.from_bytes(stored, "little")


# ---- each chunk's checksum bound to its place (format 6) ---------------------------------------------------
# A chunk's own checksum proves its bytes are whole, not that they belong where they are: a chunk copied over
# another array's (a mixed-up restore, a bad sync) or an older write's chunk passes it. So every array also
# records, in its zarr.json, where it lives in the store (the array's path: shard, graph or search version,
# array name) and the checksum of each of its chunks in order; a chunk whose checksum is not the one listed for
# its index is damage. zarr and other readers ignore these attributes and still check the chunks' own crc32c.
TABLE = "bigknn_chunks"  # the key under the array's zarr.json attributes


def with_table(meta: dict, place: str, crcs: list[int]) -> dict:
    """``meta`` (an array's zarr.json) recording its place and its chunks' checksums."""
    return {**meta, "attributes": {**(meta.get("attributes") or {}), TABLE: {"place": place, "crc32c": crcs}}}


def table(meta: dict, array_dir: Path, chunks: int) -> tuple[int, ...] | None:
    """The chunk checksums ``meta`` lists for the array at ``array_dir`` (None when it lists none); Damaged
    when they were written for another place or do not match the array's chunk count."""
    raw = (meta.get("attributes") or {}).get(TABLE)
    if raw is None:
        return None
    where = Path(array_dir) / "zarr.json"
    if not isinstance(raw, dict) or not isinstance(raw.get("place"), str) or not isinstance(raw.get("crc32c"), list):
        raise Damaged(where, f"unreadable {TABLE} attribute")
    place, crcs = raw["place"], raw["crc32c"]
    if not Path(array_dir).as_posix().endswith("/" + place):
        raise Damaged(where, f"the array's metadata was written for {place}, not for this place")
    if len(crcs) != chunks or not all(isinstance(c, int) and 0 <= c < 1 << 32 for c in crcs):
        raise Damaged(where, f"lists {len(crcs)} chunk checksums for {chunks} chunks")
    return tuple(crcs)
