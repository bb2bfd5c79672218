"""manifest.json: the single source of truth of a store, replaced atomically (temp, fsync, rename)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

FORMAT_VERSION = 2  # of the stores this bigknn creates
CHECKSUMS_SINCE = 2  # the first format whose every array checksums every chunk (bigknn/shards/checksums.py)
READ_FORMATS = (1, 2)  # format 1 (no checksums) is still read, and written: new arrays get checksums
MANIFEST = "manifest.json"


@dataclass
class ShardEntry:
    id: int
    offset: int  # global id of the shard's first row
    rows: int
    graph: int | None = None  # committed graph version, None until GNND has run


@dataclass
class Manifest:
    dim: int
    dtype: str  # dtype of the stored vectors
    metric: str
    k: int
    shard_rows: int
    params: dict
    seed: int
    format: int = FORMAT_VERSION
    inputs: list[dict] = field(default_factory=list)  # path, size, sha256, rows, first_id
    shards: list[ShardEntry] = field(default_factory=list)
    merged: list[list[int]] = field(default_factory=list)  # shard pairs whose GGM is committed
    timings: dict = field(default_factory=dict)  # seconds per phase, summed over runs
    # an ingest in progress: its inputs, new shards, staged graph versions and merged pairs; invisible to
    # readers until the ingest's final commit folds it into the fields above
    pending: dict | None = None

    @property
    def checksummed(self) -> bool:
        """Whether every array of the store must carry chunk checksums (one without them is damage)."""
        return self.format >= CHECKSUMS_SINCE

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    def pairs_done(self) -> set[tuple[int, int]]:
        return {(a, b) for a, b in self.merged}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        raw = json.loads(text)
        if raw.get("format") not in READ_FORMATS:
            raise ValueError(f"store format {raw.get('format')} is not supported (this bigknn reads formats "
                             f"{', '.join(map(str, READ_FORMATS))}); use the bigknn that wrote it")
        raw["shards"] = [ShardEntry(**s) for s in raw["shards"]]
        return cls(**raw)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` so that a reader (or a crash) sees the old or the new file, never a mix."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
