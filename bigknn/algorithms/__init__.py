"""Layer 5, the algorithms: backend-independent GNND/GGM set-up, recall targets, list merging, partition
learning and labelling, prune rules and the search index (docs/design.md, "Layers")."""
