"""What a store's arrays were built for (``dim``, ``dtype``, ``metric``, ``k``), recorded where an edit of
manifest.json does not reach, and compared on every open.

The arrays show their width and data type, but not the metric their distances were computed with or the k their
lists were cut to: a manifest whose ``metric`` is changed from ``l2`` to ``ip`` (or whose ``k`` is lowered) is
still valid, and every search, recall and merge on it would be silently wrong. So the writer that creates a
store records these fields in the zarr group's attributes (``zarr.json``, beside the store's format); the first
writer on an older store records them from its manifest, as it finds it. Every open compares them with the
manifest: a field that differs refuses readers and writers (exit 2, naming the field; nothing is committed on
it) and is damage to ``bigknn verify`` (exit 1), repaired by putting the recorded value back.

The record also marks a store whose user-id parts all carry checksums (bigknn/shards/user_ids.py): the writer
that records it seals the parts written before first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from bigknn.core.atomic import write_atomic
from bigknn.core.errors import BadInput, Damaged
from bigknn.shards import chunks
from bigknn.shards.manifest import MANIFEST, Manifest
from bigknn.shards.names import vectors_name

FIELDS = ("dim", "dtype", "metric", "k")
GROUP = "zarr.json"  # the store's own zarr group metadata
KEY = "identity"  # under its attributes' "bigknn" object


class Mismatch(NamedTuple):
    field: str
    want: object  # what the store was built with
    problem: str  # in one line


def of(manifest: Manifest) -> dict:
    """The fields recorded for ``manifest``."""
    return {name: getattr(manifest, name) for name in FIELDS}


def recorded(path: Path) -> dict | None:
    """The fields recorded in the store at ``path``; None for a store written before they were (or whose
    zarr.json cannot be read: the arrays' own checks report that)."""
    try:
        meta = json.loads((Path(path) / GROUP).read_text())
        record = meta["attributes"]["bigknn"][KEY]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if isinstance(record, dict) else None


def mismatches(path: Path, manifest: Manifest) -> list[Mismatch]:
    """Each manifest field that differs from what the store was built for. A store without the record is
    checked as far as its arrays tell: ``dim`` against shard 0's width."""
    path = Path(path)
    record = recorded(path)
    if record is None:
        return _width_mismatch(path, manifest)
    return [Mismatch(name, record.get(name), f"{name} is {getattr(manifest, name)!r} but the store was built with "
                                              f"{record.get(name)!r} (recorded in {path / GROUP}): manifest.json "
                                              f"was edited; put {record.get(name)!r} back")
            for name in FIELDS if record.get(name) != getattr(manifest, name)]


def _width_mismatch(path: Path, manifest: Manifest) -> list[Mismatch]:
    if not manifest.shards or manifest.shards[0].source is not None:  # a referenced input: its reader checks it
        return []
    try:
        shape = chunks.metadata(path / vectors_name(0)).get("shape")
    except Damaged:
        return []  # a missing or unreadable array is left to the reads and to `bigknn verify`, which name it
    if isinstance(shape, list) and len(shape) == 2 and shape[1] != manifest.dim:
        return [Mismatch("dim", shape[1], f"dim is {manifest.dim} but shard 0's vectors have {shape[1]} columns "
                                          f"({path / vectors_name(0) / 'zarr.json'})")]
    return []


def refuse_edits(path: Path, manifest: Manifest) -> None:
    """Refuse (exit 2) a manifest whose identity differs from the store's, naming the first such field."""
    found = mismatches(path, manifest)
    if found:
        raise BadInput(Path(path) / MANIFEST, found[0].problem)


def record(path: Path, manifest: Manifest) -> None:
    """Record ``manifest``'s fields in the store's zarr.json (kept with whatever else its attributes hold)."""
    meta_path = Path(path) / GROUP
    meta = json.loads(meta_path.read_text())
    attrs = meta.setdefault("attributes", {})
    attrs["bigknn"] = {**attrs.get("bigknn", {}), KEY: of(manifest)}
    write_atomic(meta_path, json.dumps(meta, indent=2))
