"""The manifest's sections as typed objects: each reads the JSON object older bigknn wrote and writes the same one
back (same keys, same order), so a store's bytes do not change with the code that reads them.

``PartitionSpec`` is ``partition`` (format 4), ``SearchEntry`` is ``search`` (format 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
