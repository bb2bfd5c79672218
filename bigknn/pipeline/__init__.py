"""The data path, top to bottom: read -> shard -> GNND per shard -> GGM per pair -> commit; and evaluation."""
