"""Layer 2, the operations: one module per operation (build, ingest, merge, export, evaluate, verify, prune,
search, plan), each what an API function runs (docs/design.md, "Layers")."""
