"""The manifest's sections as typed objects: each reads the JSON object older bigknn wrote and writes the same one
back (same keys, same order), so a store's bytes do not change with the code that reads them.

``PartitionSpec`` is ``partition`` (format 4).
"""

from __future__ import annotations

from dataclasses import dataclass


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
