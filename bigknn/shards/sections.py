"""The manifest's sections as typed objects: each reads the JSON object older bigknn wrote and writes the same one
back (same keys, same order), so a store's bytes do not change with the code that reads them.

``ShardEntry`` is one of ``shards``, ``PartitionSpec`` is ``partition`` (format 4), ``SearchEntry`` is ``search``
(format 3), ``PendingWrite`` is ``pending``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# the keys of ``pending`` in the order each kind of write lays them out (``PendingWrite.layout``)
INGEST_KEYS = ("inputs", "shards", "graphs", "merged", "near")
STORES_KEYS = ("inputs", "shards", "merged", "graphs")  # a merge of stores: no near shards


@dataclass
class ShardEntry:
    id: int
    offset: int  # global id of the shard's first row
    rows: int
    graph: int | None = None  # committed graph version, None until GNND has run
    # vectors referenced, not copied: {"input": index into Manifest.inputs, "byte_offset": of its first row}
    # (bigknn/shards/referenced.py); None: shards/<id>/vectors holds them
    source: dict | None = None
    # the rows live in the graph version's directory (shards/<id>/graph/<v>/vectors), not in shards/<id>/vectors:
    # a tail shard that small ingests append to, whose rows are then copy-on-write with its lists (format 7)
    rows_with_graph: bool = False


@dataclass(frozen=True)
class PartitionSpec:
    """How a partitioned store's rows were split: the learnt partition's ``method`` (kmeans or rptree,
    bigknn/algorithms/partition/), the ``arrays`` it keeps under partition/ (centroids, shard_of, the RP-tree's
    nodes), and the ``shards`` stored by it: shard <id> < ``shards`` keeps its input rows in shards/<id>/row_ids;
    the shards an ingest adds after them hold contiguous rows."""

    method: str
    arrays: list[str]
    shards: int

    def to_dict(self) -> dict:
        return {"method": self.method, "arrays": list(self.arrays), "shards": self.shards}

    @classmethod
    def from_dict(cls, raw: dict) -> PartitionSpec:
        """The section read back (bigknn/shards/schema.py has checked its fields)."""
        return cls(raw["method"], list(raw["arrays"]), raw["shards"])


@dataclass(frozen=True)
class SearchEntry:
    """The committed search graph (bigknn/operations/search_arrays.py). What its readers rely on: its ``version``
    under search/<v>/, how it was pruned (``method``), its ``degree``, the ``rows`` and the kNN graph versions of
    each shard (``graphs``) it was pruned from (a search graph older than the graph is stale). ``made``: the
    record of how it was made (alpha, lambda0, knn_k, mean_degree, seconds; older bigknn recorded more), kept
    as written."""

    version: int
    method: str
    degree: int
    rows: int
    graphs: list[int | None]
    made: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"version": self.version, "method": self.method, "degree": self.degree, "rows": self.rows,
                "graphs": list(self.graphs), **self.made}

    @classmethod
    def from_dict(cls, raw: dict) -> SearchEntry:
        """The section read back (bigknn/shards/schema.py has checked the fields its readers rely on)."""
        made = {key: value for key, value in raw.items() if key not in _SEARCH_READ}
        return cls(raw["version"], raw["method"], raw["degree"], raw["rows"], list(raw["graphs"]), made)


_SEARCH_READ = ("version", "method", "degree", "rows", "graphs")


@dataclass
class PendingWrite:
    """A write that adds shards to a finished store (an ingest, a merge of stores), invisible to readers until its
    final commit folds it into the manifest (bigknn/engine/pending.py StagedLedger): the ``inputs`` it adds, its
    new ``shards``, the graph versions it staged (``graphs``: shard id -> version, of new and old shards), the
    pairs it ``merged``, and for an ingest into a partitioned store the old shards ``near`` its batch (None:
    every old shard). ``layout``: the JSON keys in the order written (INGEST_KEYS, STORES_KEYS, or as read)."""

    inputs: list[dict]
    shards: list[ShardEntry]
    graphs: dict[int, int] = field(default_factory=dict)
    merged: list[list[int]] = field(default_factory=list)
    near: list[int] | None = None
    layout: tuple[str, ...] = field(default=INGEST_KEYS, compare=False, repr=False)

    def to_dict(self) -> dict:
        values = {"inputs": self.inputs, "shards": [asdict(s) for s in self.shards],
                  "graphs": {str(sid): version for sid, version in self.graphs.items()}, "merged": self.merged,
                  "near": self.near}
        return {key: values[key] for key in self.layout}

    @classmethod
    def from_dict(cls, raw: dict) -> PendingWrite:
        """The section read back (bigknn/shards/schema.py has checked its fields)."""
        return cls(list(raw["inputs"]), [ShardEntry(**s) for s in raw["shards"]],
                   {int(sid): version for sid, version in raw["graphs"].items()}, list(raw["merged"]),
                   raw.get("near"), tuple(raw))
