"""The on-disk store: a zarr v3 group with an atomically replaced manifest (the contract: docs/design.md)."""

from bigknn.shards.lock import WriterLock
from bigknn.shards.manifest import Manifest, ShardEntry
from bigknn.shards.store import Store
from bigknn.shards.store_readers import read_store

__all__ = ["Manifest", "ShardEntry", "Store", "WriterLock", "read_store"]
