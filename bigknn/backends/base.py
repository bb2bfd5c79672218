"""The contract every backend implements; the pipeline only talks to this."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

import numpy as np

from bigknn.graph import KnnGraph
from bigknn.params import GnndParams


@dataclass
class ShardPart:
    """One shard as the merge sees it: its first global row id, its vectors and its graph (global ids)."""

    offset: int
    vectors: np.ndarray
    graph: KnnGraph


class Backend(Protocol):
    name: str

    def gnnd(self, x: np.ndarray, metric: str, params: GnndParams, seed: int) -> KnnGraph:
        """k-NN graph of the rows of ``x`` among themselves; ids are local row numbers 0..n-1."""

    def ggm(self, a: ShardPart, b: ShardPart, metric: str, params: GnndParams, seed: int,
            vias: list[ShardPart] | None = None) -> tuple[KnnGraph, KnnGraph]:
        """Merge two shard graphs (paper Alg. 3): every row of a and b gets its top-k over its old list
        (which may hold rows of other shards) and a ∪ b. Ids in and out are global. ``vias``: a seeded merge
        of a small batch b into an old shard a, through shards already merged with b (bigknn/ggm.py)."""

    def exact_knn(self, queries: np.ndarray, k: int, metric: str, blocks: Iterable[tuple[int, np.ndarray]]) -> KnnGraph:
        """Exact top-k of each query over all rows of ``blocks`` ((global offset, vectors) pairs, streamed)."""
