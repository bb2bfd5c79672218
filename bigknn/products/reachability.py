"""HDBSCAN's core distances and mutual-reachability graph (Campello, Moulavi, Sander 2013; McInnes, Healy
2017) from the kNN lists, for ``sklearn.cluster.HDBSCAN(metric="precomputed")``.

``min_samples`` counts the row itself, as scikit-learn's HDBSCAN does (scikit-learn-contrib's ``hdbscan``
counts without it: its value is ours minus 1): a row's core distance is its (min_samples - 1)-th neighbour's
distance, so the graph's k bounds min_samples by k + 1. The graph's edges are the union kNN graph weighted
max(core_a, core_b, d(a, b)). A kNN graph often falls apart into components, which scikit-learn refuses; they
are joined as Boruvka's MST does: each round, every component but the largest gets its cheapest
mutual-reachability edge to another component, found by an exact scan of the store's vectors (so each
added edge is one the exact MST holds too). That scan costs (rows outside the largest component) x rows
distances a round, and rounds at most halve the components: cheap for a few small fragments, quadratic for a
graph that falls apart into many large clusters (a larger k joins those through the lists instead)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bigknn.errors import BadInput
from bigknn.metrics import kernel_metric, pairwise_keys, user_distance
from bigknn.partition.rowmap import RowMap
from bigknn.products.edges import shard_edges
from bigknn.products.symmetric import symmetric_csr
from bigknn.progress import log
from bigknn.shards import Store

QUERY_ROWS = 1024  # rows of the small components scanned at a time against ...
TILE_ROWS = 4096  # ... this many of a shard's rows (a 16 MB distance tile)


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


def join_components(store: Store, graph: Any, core: np.ndarray, labels: np.ndarray, count: int) -> Any:
    """``graph`` plus the cheapest cross-component edges, Boruvka round by round, until it is connected."""
    from scipy import sparse
    from scipy.sparse import csgraph

    a_all, b_all, w_all = [], [], []
    start = count
    while count > 1:
        outside = int((labels != np.bincount(labels).argmax()).sum())
        log.info("mutual reachability: %d components; scanning %d rows outside the largest against all %d",
                 count, outside, len(labels))
        a, b, w = cheapest_links(store, core, labels)
        a_all.append(a)
        b_all.append(b)
        w_all.append(w)
        merged = sparse.coo_matrix((np.ones(len(a)), (labels[a], labels[b])), shape=(count, count))
        count, relabel = csgraph.connected_components(merged, directed=False)
        labels = relabel[labels]
    a, b, w = np.concatenate(a_all), np.concatenate(b_all), np.concatenate(w_all)
    log.info("mutual reachability: joined %d components with %d exact cross-component edges", start, len(a))
    n = graph.shape[0]
    links = sparse.coo_matrix((np.concatenate([w, w]), (np.concatenate([a, b]), np.concatenate([b, a]))),
                              shape=(n, n)).tocsr()
    joined = (graph + links).tocsr()
    joined.sort_indices()
    return joined


def cheapest_links(store: Store, core: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each component but the largest: (its row, the row of another component, their mutual
    reachability) of least mutual reachability, by an exact scan of the store's vectors."""
    m = store.manifest
    rowmap = RowMap.of(store)
    largest = np.bincount(labels).argmax()
    q = np.nonzero(labels != largest)[0]
    qv = store.vectors_of(rowmap.to_position(q))
    best = np.full(len(q), np.inf, np.float32)
    to = np.full(len(q), -1, np.int64)
    for shard in m.shards:
        vectors = store.read_vectors(shard.id)
        vrows = np.asarray(rowmap.to_input(np.arange(shard.offset, shard.offset + shard.rows)), np.int64)
        for t in range(0, shard.rows, TILE_ROWS):
            v, vr = vectors[t:t + TILE_ROWS], vrows[t:t + TILE_ROWS]
            for s in range(0, len(q), QUERY_ROWS):
                qs = q[s:s + QUERY_ROWS]
                d = user_distance(pairwise_keys(qv[s:s + QUERY_ROWS], v, kernel_metric(m.metric)), m.metric)
                mr = np.maximum(np.maximum(d, core[qs][:, None]), core[vr][None, :])
                mr[labels[qs][:, None] == labels[vr][None, :]] = np.inf
                j = mr.argmin(axis=1)
                val = mr[np.arange(len(qs)), j]
                better = val < best[s:s + QUERY_ROWS]
                best[s:s + QUERY_ROWS][better] = val[better]
                to[s:s + QUERY_ROWS][better] = vr[j[better]]
    order = np.lexsort((best, labels[q]))
    first = np.ones(len(order), bool)
    first[1:] = labels[q][order][1:] != labels[q][order][:-1]
    pick = order[first]
    return q[pick], to[pick], best[pick]
