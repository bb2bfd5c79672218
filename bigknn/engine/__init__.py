"""Layer 3, the engine: running tasks over a store (the sharding pass, pending work, the scheduler, the
executors in-process and on Dask, shard cache, writer, accounting; docs/design.md, "Layers")."""
