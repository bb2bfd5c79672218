"""manifest.json: the single source of truth of a store, replaced atomically (temp, fsync, rename)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from bigknn.core.errors import BadInput
from bigknn.core.knn_graph import id_dtype
from bigknn.core.params import GnndParams
from bigknn.shards.schema import check_manifest
from bigknn.shards.sections import PartitionSpec, PendingWrite, SearchEntry, ShardEntry
from bigknn.shards.lock import running_writer

FORMAT_VERSION = 6  # of the stores this bigknn creates
CHECKSUMS_SINCE = 2  # the first format whose every array checksums every chunk (bigknn/shards/checksums.py)
SEARCH_SINCE = 3  # format 2 plus a pruned search graph (``search``, bigknn/operations/prune.py): what ``bigknn prune`` writes
PARTITIONED_SINCE = 4  # rows stored by a learnt partition (``partition``, shards/<id>/row_ids) and chosen ``pairs``
WIDE_IDS_SINCE = 5  # graph ids are int64 (``id_dtype``): a store past 2^31 rows, which older bigknn must not read
# every array lists its chunks' checksums for its place (bigknn/shards/checksums.py): a chunk swapped with another
# array's, or an older write's, is damage. A writer upgrades a format 2-5 store to it (Store.commit)
PLACED_SINCE = 6
REFERENCED_SINCE = 7  # shards whose vectors are read from the input file (``ShardEntry.source``), not copied
# a shard may keep its rows in its graph version's directory (ShardEntry.rows_with_graph: the tail shard small
# ingests append to), where older bigknn would look for them under shards/<id>/vectors
TAIL_SINCE = 7  # with referenced vectors: format 7 holds both
READ_FORMATS = (1, 2, 3, 4, 5, 6, 7)  # format 1 (no checksums) is still read, and written: new arrays get checksums
MANIFEST = "manifest.json"


@dataclass
class Manifest:
    dim: int
    dtype: str  # dtype of the stored vectors
    metric: str
    k: int
    shard_rows: int
    params: GnndParams  # JSON: its to_manifest() object
    seed: int
    format: int = FORMAT_VERSION
    inputs: list[dict] = field(default_factory=list)  # path, size, sha256, rows, first_id
    shards: list[ShardEntry] = field(default_factory=list)
    merged: list[list[int]] = field(default_factory=list)  # shard pairs whose GGM is committed
    timings: dict = field(default_factory=dict)  # seconds per phase, summed over runs
    # an ingest in progress: its inputs, new shards, staged graph versions and merged pairs; invisible to
    # readers until the ingest's final commit folds it into the fields above
    pending: PendingWrite | None = None  # JSON: its to_dict() object
    # the build's recall estimate on its sample (bigknn/engine/recall_sample.py): recall, low, high, rows, at,
    # target, graph_rows (rows of the graph it was measured on: an ingest since leaves it about fewer rows)
    estimate: dict | None = None
    # the committed search graph (bigknn/operations/search_arrays.py): its version under search/<v>/, how it
    # was pruned, and the kNN graph versions it was pruned from (a search graph older than the graph is stale)
    search: SearchEntry | None = None  # JSON: its to_dict() object
    # a partitioned store (format 4): the method and the arrays stored under partition/ (bigknn/algorithms/partition/);
    # shard <id>'s input rows are shards/<id>/row_ids. None: contiguous, shard rows are input rows from offset
    partition: PartitionSpec | None = None  # JSON: its to_dict() object
    # the shard pairs this store merges (bigknn/algorithms/partition/pairs.py), committed before the first merge so that a
    # resumed run merges the same ones. None: every pair
    pairs: list[list[int]] | None = None
    # the dtype graph ids are written in (bigknn/core/knn_graph.py id_dtype of the rows, pending ones included); it
    # never narrows. Arrays written before it widened keep int32 on disk and are widened as they are read
    ids: str = "int32"

    @property
    def checksummed(self) -> bool:
        """Whether every array of the store must carry chunk checksums (one without them is damage)."""
        return self.format >= CHECKSUMS_SINCE

    @property
    def placed(self) -> bool:
        """Whether every checksummed array must list its chunks' checksums for its place (format 6)."""
        return self.format >= PLACED_SINCE

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def id_dtype(self) -> np.dtype:
        """What graph ids are written in, and read as."""
        return np.dtype(self.ids)

    def hold_ids_of(self, rows: int) -> None:
        """Widen the id dtype, if need be, to hold the ids of ``rows`` rows (before any graph among them is
        written); int64 ids make the store format 5."""
        want = id_dtype(rows)
        if want.itemsize > self.id_dtype.itemsize:
            self.ids = want.name
            self.format = max(self.format, WIDE_IDS_SINCE)

    @property
    def merges_total(self) -> int:
        if self.pairs is not None:
            return len(self.pairs)
        return len(self.shards) * (len(self.shards) - 1) // 2

    @property
    def partition_method(self) -> str:
        """How the build's rows were split: kmeans, rptree or contiguous (bigknn/algorithms/partition/)."""
        return self.partition.method if self.partition else "contiguous"

    def planned(self, i: int, j: int) -> bool:
        """Whether the pair (i, j), i < j, is one this store merges: every pair of a contiguous store; of a
        partitioned one, those of its plan (none before the plan is committed)."""
        if self.pairs is None:
            return self.partition is None
        return [i, j] in self.pairs

    @property
    def shards_built(self) -> int:
        return sum(s.graph is not None for s in self.shards)

    @property
    def merges_pending(self) -> int:
        return self.merges_total - len(self.merged)

    @property
    def complete(self) -> bool:
        """Every shard has a graph and every pair is merged: what readers see is the final graph. The one
        test of that: everything that reads or reports a finished graph asks here."""
        return bool(self.shards) and self.shards_built == len(self.shards) and self.merges_pending == 0

    def require_complete(self, store: Path) -> None:
        """Refuse (exit 2) to read an unfinished graph: its recall or export would silently be wrong."""
        if not self.complete:
            done = (f"{self.shards_built} of {len(self.shards)} shards built, {len(self.merged)} of "
                    f"{self.merges_total} merges done")
            if (pid := running_writer(store)) is not None:
                raise BadInput(store, f"a build is running (pid {pid}); the graph is not finished yet ({done})")
            raise BadInput(store, f"the graph is not finished ({done}); run `bigknn merge` first")

    def pairs_done(self) -> set[tuple[int, int]]:
        return {(a, b) for a, b in self.merged}

    def to_json(self) -> str:
        raw = asdict(self)
        raw["pending"] = self.pending.to_dict() if self.pending is not None else None
        raw["search"] = self.search.to_dict() if self.search is not None else None
        raw["partition"] = self.partition.to_dict() if self.partition is not None else None
        for shard in raw["shards"]:  # written only where set: a copied shard without a tail reads as before
            if shard["source"] is None:
                del shard["source"]
            if not shard["rows_with_graph"]:
                del shard["rows_with_graph"]
        return json.dumps(raw, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        """Parse a manifest; ValueError with one line naming the problem if it is not one this code reads."""
        raw = json.loads(text)
        if isinstance(raw, dict) and raw.get("format") not in READ_FORMATS:
            raise ValueError(f"store format {raw.get('format')} is not supported (this bigknn reads formats "
                             f"{', '.join(map(str, READ_FORMATS))}); use the bigknn that wrote it")
        check_manifest(raw)
        pending, search, partition = raw.get("pending"), raw.get("search"), raw.get("partition")
        return cls(**dict(raw, params=GnndParams.from_manifest(raw["params"]),
                          pending=PendingWrite.from_dict(pending) if pending is not None else None,
                          search=SearchEntry.from_dict(search) if search is not None else None,
                          partition=PartitionSpec.from_dict(partition) if partition is not None else None,
                          shards=[ShardEntry(**s) for s in raw.get("shards", [])]))
