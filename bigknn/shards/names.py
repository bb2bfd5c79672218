"""Where each array of a store lives, relative to the store's directory (the layout in docs/design.md)."""

from __future__ import annotations


def vectors_name(shard_id: int, version: int | None = None) -> str:
    """A shard's rows; ``version``: those of a shard that keeps them with its graph version (a tail shard)."""
    return f"shards/{shard_id}/vectors" if version is None else graph_name(shard_id, version, "vectors")


def row_ids_name(shard_id: int) -> str:
    return f"shards/{shard_id}/row_ids"


def partition_name(array: str) -> str:
    return f"partition/{array}"


def graph_dir(shard_id: int, version: int | None = None) -> str:
    """A shard's directory of graph versions, or one version's directory."""
    return f"shards/{shard_id}/graph" + ("" if version is None else f"/{version}")


def graph_name(shard_id: int, version: int, array: str) -> str:
    return f"shards/{shard_id}/graph/{version}/{array}"


def search_name(version: int, array: str) -> str:
    return f"search/{version}/{array}"
