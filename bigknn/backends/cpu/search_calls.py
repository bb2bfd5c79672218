"""The search-graph calls of the Backend protocol (bigknn/backends/base.py) on the host: the CPU backend's (the
CUDA backend overrides each with its device version)."""

from __future__ import annotations

import numpy as np

from bigknn.backends.cpu import graph_search
from bigknn.backends.cpu import diversify as prune
from bigknn.core.knn_graph import KnnGraph
from bigknn.core.metric import Metric
from bigknn.algorithms import tsdg_whole as whole
from bigknn.algorithms.search_index import SearchIndex, host_queries
from bigknn.algorithms.edge_lists import nearest_lists, verdict_columns
from bigknn.algorithms.search_params import NO_LAMBDA, DiversifyRule, PruneParams, SearchPlan


class SearchReference:
    search_warms_by_shape = False  # the host's loops run alike at any batch size once compiled
    def diversify_lists(self, cands: np.ndarray, keys: np.ndarray, table: np.ndarray, metric: Metric,
                        rule: DiversifyRule, width: int) -> tuple[np.ndarray, np.ndarray]:
        verdict = prune.diversify(cands, keys, table, metric, rule)
        return verdict_columns(np, verdict, cands >= 0, rule.sequential, width, NO_LAMBDA)

    def nearest_lists(self, rows: int, width: int, row: np.ndarray, ids: np.ndarray, keys: np.ndarray,
                      lists: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        return nearest_lists(np, rows, width, row, ids, keys, lists)

    def prune_tsdg(self, ids: np.ndarray, keys: np.ndarray, table: np.ndarray, metric: Metric,
                   params: PruneParams) -> tuple[np.ndarray, np.ndarray, int]:
        return whole.tsdg(np, ids, keys, params, lambda c, k, rule, width: self.diversify_lists(
            c, k, table, metric, rule, width))

    def reach_back(self, table: np.ndarray, lists: np.ndarray, list_index: np.ndarray, x: np.ndarray,
                   z: np.ndarray, z_ids: np.ndarray) -> np.ndarray:
        return prune.reach_back(table, lists, list_index, x, z, z_ids)

    def searched_queries(self, rows: np.ndarray, metric: Metric, name: str, first_row: int) -> np.ndarray:
        return host_queries(rows, metric, name, first_row)

    def graph_search(self, index: SearchIndex, queries: np.ndarray, plan: SearchPlan, batch: int) -> KnnGraph:
        return graph_search.search_batches(index, queries, plan, batch)

    def forget_index(self, index: SearchIndex) -> None:
        """The host keeps nothing of an index between searches beyond the index itself."""
