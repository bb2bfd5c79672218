"""The contract every backend implements; the pipeline only talks to this, and never probes a backend for
what it can do: every capability is declared here, and every backend implements all of it (a no-op where
it has nothing to do)."""

from __future__ import annotations

from typing import Callable, Iterable, Protocol

import numpy as np

from bigknn.graph import KnnGraph, ShardPart
from bigknn.params import GnndParams

OnIter = Callable[[int], None]  # called after each descent iteration with the number of list updates it made


class Backend(Protocol):
    name: str

    def gnnd(self, x: np.ndarray, metric: str, params: GnndParams, seed: int,
             on_iter: OnIter | None = None) -> KnnGraph:
        """k-NN graph of the rows of ``x`` among themselves; ids are local row numbers 0..n-1."""

    def ggm(self, a: ShardPart, b: ShardPart, metric: str, params: GnndParams, seed: int,
            on_iter: OnIter | None = None, vias: list[ShardPart] | None = None) -> tuple[KnnGraph, KnnGraph]:
        """Merge two shard graphs (GGM: Alg. 3 of Wang et al., "Fast k-NN Graph Construction by GPU based
        NN-Descent", docs/design.md): every row of a and b gets its top-k over its old list (which may hold
        rows of other shards) and a ∪ b. Ids in and out are global. ``vias``: a seeded merge of a small
        batch b into an old shard a, through shards already merged with b (bigknn/ggm.py)."""

    def exact_knn(self, queries: np.ndarray, k: int, metric: str, blocks: Iterable[tuple[int, np.ndarray]]) -> KnnGraph:
        """Exact top-k of each query over all rows of ``blocks`` ((global offset, vectors) pairs, streamed)."""

    def memory_budget(self) -> int | None:
        """Bytes of device memory one call may plan to use (what shard sizes are chosen from); None where
        no device memory bounds a shard (the CPU)."""

    def stage(self, arrays: Iterable[np.ndarray]) -> None:
        """Start copying host arrays (the next pair's shards) to the device while the current call computes;
        returns at once. A no-op without a device."""
