"""The contract every backend implements; the pipeline only talks to this, and never probes a backend for
what it can do: every capability is declared here, and every backend implements all of it (a no-op where
it has nothing to do)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

import numpy as np

from bigknn.core.knn_graph import KnnGraph, ShardPart
from bigknn.core.metric import Metric
from bigknn.core.params import GnndParams
from bigknn.algorithms.recall_target import Probe
from bigknn.algorithms.search_index import SearchIndex
from bigknn.algorithms.search_params import DiversifyRule, PruneParams, SearchPlan

OnIter = Callable[[int], None]  # called after each descent iteration with the number of list updates it made


@dataclass(frozen=True)
class CallShape:
    """What a build's backend calls will look like: row width, element type, metric and GNND parameters."""

    dim: int
    dtype: str
    metric: Metric
    params: GnndParams


class MemoryModel(Protocol):
    """What a device backend's calls need of its memory, asked by the planner (bigknn/operations/plan_model.py) without
    a device at hand: a plan made here may size a build for a GPU elsewhere (registry.device_memory_model)."""

    def merge_bytes(self, shard_rows: int, dim: int, itemsize: int, params: GnndParams) -> int:
        """Device bytes of one GGM of two shards of ``shard_rows`` rows of ``dim`` elements of ``itemsize``
        bytes (the largest call of a build: shard sizes are chosen so that it fits)."""

    def whole_bytes(self, rows: int, dim: int, itemsize: int, params: GnndParams) -> int:
        """Device bytes of one GNND of all ``rows`` rows at once (a one-shard build: no merge at all), at the
        same full candidate slots and widening room as ``merge_bytes``."""

    def spanning_bytes(self, rows: int, dim: int, itemsize: int, params: GnndParams, gpus: int) -> int:
        """Device bytes on each of ``gpus`` devices of one GNND of ``rows`` rows spanning them
        (Backend.spanning): what ``whole_bytes`` counts on one device."""


class Backend(Protocol):
    name: str
    # whether a search's first batch of a size is slower than the next (a device's GEMM plans, memory blocks): a
    # loaded index then warms up with whole batches of its rows, otherwise with one row (operations/loaded_index.py)
    search_warms_by_shape: bool

    def gnnd(self, x: np.ndarray, metric: Metric, params: GnndParams, seed: int,
             on_iter: OnIter | None = None, probe: Probe | None = None) -> KnnGraph:
        """k-NN graph of the rows of ``x`` among themselves; ids are local row numbers 0..n-1. ``probe``: the
        rows the recall target measures, with their exact top-10 among ``x`` and the pace that search ran
        at (a build's recall sample, bigknn/engine/recall_sample.py); None: the backend draws its own."""

    def spanning(self, others: list["Backend"]) -> "Backend | None":
        """A backend like this one whose ``gnnd`` runs across this backend's device and those of ``others`` at
        once (a one-shard build, where the others would sit idle), or None where this backend cannot (the
        executor then runs the plan as it is)."""

    def ggm(self, a: ShardPart, b: ShardPart, metric: Metric, params: GnndParams, seed: int,
            on_iter: OnIter | None = None, vias: list[ShardPart] | None = None) -> tuple[KnnGraph, KnnGraph]:
        """Merge two shard graphs (GGM: Alg. 3 of Wang et al., "Fast k-NN Graph Construction by GPU based
        NN-Descent", docs/design.md): every row of a and b gets its top-k over its old list (which may hold
        rows of other shards) and a ∪ b. Ids in and out are global. ``vias``: a seeded merge of a small
        batch b into an old shard a, through shards already merged with b (bigknn/algorithms/merge_setup.py)."""

    def exact_knn(self, queries: np.ndarray, k: int, metric: Metric,
                  blocks: Iterable[tuple[int, np.ndarray]]) -> KnnGraph:
        """Exact top-k of each query over all rows of ``blocks`` ((global offset, vectors) pairs, streamed)."""

    def nearest_centroids(self, x: np.ndarray, count: int, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's ``count`` nearest ``centroids`` (int64 ids, float32 squared L2), ascending: the
        partition's labelling and k-means steps (bigknn/algorithms/partition/nearest.py), on the backend's fastest
        route for few columns."""

    @property
    def last_stats(self) -> dict:
        """Timings and counts of the last gnnd / ggm call (keys ending in ``_s``: seconds of its stages, as the
        build's timeline reports them); empty where the backend keeps none."""
        return {}

    def memory_budget(self) -> int | None:
        """Bytes of device memory one call may plan to use (what shard sizes are chosen from); None where
        no device memory bounds a shard (the CPU)."""

    def warm_up(self, say: Callable[[str], None], like: CallShape | None = None) -> float:
        """Compile (or load) the kernels a build calls before its first task, so that no rate, ETA or recorded
        timing includes the compile; ``say`` is told first where that takes long (a cold cache). ``like``: the
        rows and parameters the build's calls will have (kernels compiled per element type, width and sample
        count). Returns the seconds it took here (0 where nothing was left to do, or where the work goes on in
        the background and the first call waits for it)."""

    def stage(self, arrays: Iterable[np.ndarray]) -> None:
        """Start copying host arrays (the next pair's shards) to the device while the current call computes;
        returns at once. A no-op without a device."""

    # ---- search graphs (bigknn/operations/: prune, search) -------------------------------------------
    def diversify_lists(self, cands: np.ndarray, keys: np.ndarray, table: np.ndarray, metric: Metric,
                        rule: DiversifyRule, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Per row, its candidates ``cands`` (rows, c) (rows of ``table``, EMPTY-padded at the end) with their keys
        to the row ``keys`` (ascending) diversified by ``rule`` (bigknn/algorithms/search_params.py DiversifyRule): the
        columns kept, in order under a sequential rule, by (occlusion factor, column) under ``occlusion``, cut
        to ``width`` (int32, -1 padded), and their factors (uint8: 0 under a sequential rule; NO_LAMBDA padded)
        (bigknn/algorithms/edge_lists.py verdict_columns; the verdict itself: bigknn/backends/cpu/diversify.py diversify)."""

    def nearest_lists(self, rows: int, width: int, row: np.ndarray, ids: np.ndarray, keys: np.ndarray,
                      lists: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per row 0..rows-1, the nearest ``width`` distinct ids of its edges (``row``, ``ids``, ``keys``; no edge
        repeated) and of its entries in ``lists`` ((rows, m) ids and keys), ascending by key, a repeated id with
        its smaller key: (rows, width) int64 ids, float32 keys, EMPTY / inf padded (bigknn/algorithms/edge_lists.py)."""

    def prune_tsdg(self, ids: np.ndarray, keys: np.ndarray, table: np.ndarray, metric: Metric,
                   params: PruneParams) -> tuple[np.ndarray, np.ndarray, int]:
        """TSDG's two stages on a whole kNN graph held at once (bigknn/algorithms/tsdg_whole.py): ``ids`` / ``keys``
        (rows, k), ids global = rows of ``table``. Returns (rows, degree) int32 ids and uint8 occlusion factors
        (EMPTY / NO_LAMBDA padded) and the number of forward edges. The caller checks whole.resident_bytes
        against memory_budget() (or the host budget) first."""

    def reach_back(self, table: np.ndarray, lists: np.ndarray, list_index: np.ndarray, x: np.ndarray,
                   z: np.ndarray, z_ids: np.ndarray) -> np.ndarray:
        """GGNN's symmetric-link test, two hops: per request (table rows x, z; z's global id), whether z is in
        x's list or in the list of a row of x's list inside the sphere around z + 0.4 (x - z) through x
        (bigknn/backends/cpu/diversify.py reach_back)."""

    def searched_queries(self, rows: np.ndarray, metric: Metric, name: str, first_row: int) -> Any:
        """Query rows (C order, in the dtype the user gave them) checked and prepared where this backend searches
        them: BadInput naming ``name`` and row ``first_row + i`` for a bad row (bigknn/formats/read.py
        check_rows), unit length where the metric normalises. The host: NumPy rows; CUDA: a device array, checked
        and normalised there (only each row's largest magnitude comes back), so a large batch costs the host
        nothing but its upload. ``graph_search`` takes what this returns."""

    def graph_search(self, index: SearchIndex, queries: Any, plan: SearchPlan, batch: int) -> KnnGraph:
        """Search the graph for the k nearest rows of each query, in consecutive batches of ``batch`` queries
        (each finished before the next starts), by the plan's procedure (bigknn/backends/cpu/graph_search.py).
        ``queries``: prepared host rows (float32, unit length under cosine) or what ``searched_queries``
        returned. Entry points come from the entry sample nearest each query (bigknn/algorithms/search_index.py).
        Keys ascending, EMPTY-padded."""

    def forget_index(self, index: SearchIndex) -> None:
        """Drop what the backend keeps of ``index`` between searches (its device copy, the memory freed): a
        loaded index's ``close()``. A no-op on the host."""

