"""What users build kNN graphs for, computed from a store's lists one shard (or one row block) at a time:
the symmetric and mutual graphs with UMAP's fuzzy weights (``symmetric``), near-duplicate groups
(``components``) and HDBSCAN's core distances and mutual reachability (``reachability``). ``edges`` holds
the two-pass bucketing they share; ``methods`` puts them on ``Graph``."""
