"""Bringing an older store up to this bigknn's format as its next writer commits, and recording a store's format
in the zarr group's attributes (which name it too)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bigknn.core.atomic import write_atomic
from bigknn.shards import chunk_writes
from bigknn.shards.manifest import PLACED_SINCE, Manifest


def mark_format(path: Path, fmt: int) -> None:
    """Record ``fmt`` in the store's zarr.json group attributes."""
    meta_path = Path(path) / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta.setdefault("attributes", {})["bigknn"] = {**meta["attributes"].get("bigknn", {}), "format": fmt}
    write_atomic(meta_path, json.dumps(meta, indent=2))


def upgrade_places(path: Path, manifest: Manifest) -> None:
    """Make a checksummed store of format 2-5 format 6 (before the commit that says so): every array lists its
    chunks' checksums for its place, each chunk read and checked once; an array with a damaged chunk is left
    without, to stay damage that ``bigknn verify`` reports."""
    path = Path(path)
    for root, _, files in os.walk(path):
        if "zarr.json" in files and Path(root) != path:
            chunk_writes.add_table(Path(root), Path(root).relative_to(path).as_posix())
    manifest.format = max(manifest.format, PLACED_SINCE)
    mark_format(path, manifest.format)
