"""Locality-aware partitioning: which shard each input row is stored in, and which shard pairs to merge.

``contiguous`` (the GNND paper's ranges) needs every shard pair merged; ``kmeans`` and ``rptree`` put near rows
in the same shard, learnt on a row sample, so that a few near pairs per shard meet the recall target
(``pairs.choose_pairs``). The graph arrays hold store positions (shard offset + local row, as for contiguous
stores); ``rowmap.RowMap`` translates them to the input's row numbers wherever users see ids.
"""

from __future__ import annotations

from bigknn.algorithms.partition.learn import METHODS, Partition, learn, load

__all__ = ["METHODS", "Partition", "learn", "load"]
