"""HDBSCAN's core distances and mutual-reachability graph (Campello, Moulavi, Sander 2013; McInnes, Healy
2017) from the kNN lists, for ``sklearn.cluster.HDBSCAN(metric="precomputed")``.

``min_samples`` counts the row itself, as scikit-learn's HDBSCAN does (scikit-learn-contrib's ``hdbscan``
counts without it: its value is ours minus 1): a row's core distance is its (min_samples - 1)-th neighbour's
distance, so the graph's k bounds min_samples by k + 1. The graph's edges are the union kNN graph weighted
max(core_a, core_b, d(a, b)). A kNN graph often falls apart into components, which scikit-learn refuses; they
are joined as Boruvka's MST does: each round, every component but the largest gets its cheapest
mutual-reachability edge to another component, found exactly from the store's vectors (so each added edge is
one the exact MST holds too) by a scan that bounds leaf balls before it measures (bigknn/products/join.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bigknn.core.errors import BadInput
from bigknn.products.edges import shard_edges
from bigknn.products.join import join_components
from bigknn.products.symmetric import symmetric_csr
from bigknn.shards import Store

def check_min_samples(store: Store, min_samples: int) -> None:
    k = store.manifest.k
    if not 1 <= min_samples <= k + 1:
        raise BadInput(store.path, f"min_samples = {min_samples} needs each row's {min_samples - 1}-th neighbour "
                                   f"(min_samples counts the row itself, as scikit-learn's HDBSCAN), but the graph "
                                   f"holds k = {k}: choose min_samples 1..{k + 1}, or build with k >= "
                                   f"{max(min_samples - 1, 1)}")


def core_distances(store: Store, min_samples: int) -> np.ndarray:
    """(rows,) float32: each row's distance to its (min_samples - 1)-th neighbour (0 for min_samples 1)."""
    check_min_samples(store, min_samples)
    core = np.zeros(store.manifest.rows, np.float32)
    if min_samples == 1:
        return core
    for rows, _, dists in shard_edges(store, min_samples - 1):
        core[rows] = dists[:, -1]
    return core


def mutual_reachability(store: Store, min_samples: int, join: bool = True, host_mem: int | None = None,
                        tmp_parent: Path | None = None) -> Any:
    """The symmetric mutual-reachability CSR of the union graph, its components joined (``join``) or
    refused in one line where there are several."""
    from scipy.sparse import csgraph

    core = core_distances(store, min_samples)
    graph = symmetric_csr(store, "union", "distance", None, host_mem, tmp_parent,
                          lambda r, c, d: np.maximum(np.maximum(core[r], core[c]), d))
    count, labels = csgraph.connected_components(graph, directed=False)
    if count == 1:
        return graph
    if not join:
        raise BadInput(store.path, f"the k = {store.manifest.k} graph's mutual reachability has {count} "
                                   "components, which scikit-learn's HDBSCAN refuses; join them (join=True: "
                                   "exact nearest cross-component pairs) or build with a larger k")
    return join_components(store, graph, core, labels, count)
