"""Layer 6 beside the store and the formats, the core: the Metric, the kNN graph type, errors, atomic writes,
progress reporting, environment settings (docs/design.md, "Layers")."""
