"""The search graph in a store: ``search/<v>/`` next to the shards, committed through the manifest's ``search``
entry (store format 3: a format-2 store plus a search graph; older bigknn refuses it with one line).

    search/<v>/shards/<id>/ids      (rows, degree) int32 global row ids, EMPTY-padded at the end
    search/<v>/shards/<id>/lambdas  (rows, degree) uint8 occlusion factors (TSDG §3.3; 0 for the RNG graph),
                                    NO_LAMBDA in empty slots; each row ordered by (factor, distance)
    search/<v>/work/...             scratch of a prune in progress (forward lists, reverse edges), removed
                                    before the commit

Row i of a shard's arrays belongs to the shard's i-th row (``shard_rows``). Versions are copy-on-write like
graph versions: a prune writes a version no directory on disk has, then commits; the version the previous
commit named stays for readers that opened it, older ones are deleted after the commit.

``shard_rows`` and ``locate`` are the one place that knows how shards hold global rows (contiguous ranges today).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bigknn.core.errors import BadInput
from bigknn.core.metric import Metric
from bigknn.algorithms.search_index import SearchIndex
from bigknn.shards import Store, safepaths, upgrade
from bigknn.shards.manifest import ShardEntry
from bigknn.shards.sections import SearchEntry

SEARCH_DIR = "search"
WORK = "work"
SEARCH_ID_DTYPE = np.dtype(np.int32)  # search graph ids: the kernels read them; prune refuses stores past 2^31 rows


def shard_rows(shard: ShardEntry) -> np.ndarray:
    """The global ids of a shard's rows, in the order its arrays hold them."""
    return np.arange(shard.offset, shard.offset + shard.rows, dtype=np.int64)


def locate(store: Store, global_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(position in manifest.shards, local row) of each global id."""
    shards = store.manifest.shards
    global_ids = np.asarray(global_ids, np.int64)
    if len(shards) == 1:  # a store of one shard (defaults where the GPU holds the data): no search
        return np.zeros(global_ids.shape, np.intp), global_ids - shards[0].offset
    starts = np.array([s.offset for s in shards], np.int64)
    pos = np.searchsorted(starts, global_ids, side="right") - 1
    return pos, global_ids - starts[pos]


def next_version(store: Store) -> int:
    """Above the committed version and every version directory on disk (copy-on-write)."""
    on_disk = safepaths.versions(store.path, SEARCH_DIR)
    current = store.manifest.search.version if store.manifest.search else 0
    return max([current, *on_disk]) + 1


def drop_versions(store: Store, keep: set[int]) -> None:
    """Delete the search graph versions not in ``keep`` (after a commit: the new one and the previous one)."""
    for version in safepaths.versions(store.path, SEARCH_DIR):
        if version not in keep:
            safepaths.remove_tree(store.path, f"{SEARCH_DIR}/{version}")


def drop_work(store: Store, version: int) -> None:
    safepaths.remove_tree(store.path, f"{SEARCH_DIR}/{version}/{WORK}")


def mark_format(store: Store) -> None:
    """Record the manifest's format in zarr.json's group attributes too (they name the store's format)."""
    upgrade.mark_format(store.path, store.manifest.format)


def current(store: Store) -> SearchEntry:
    """The committed search graph, refused (exit 2) where there is none or the kNN graph changed since."""
    m = store.manifest
    if m.search is None:
        raise BadInput(store.path, "has no search graph; run `bigknn prune` first")
    entry = m.search
    if entry.rows != m.rows or entry.graphs != [s.graph for s in m.shards]:
        raise BadInput(store.path, f"the search graph was pruned from an older graph ({entry.rows} rows; the graph "
                                   f"has {m.rows} now); run `bigknn prune` again")
    return entry


def load_index(store: Store, metric: Metric) -> tuple[SearchIndex, SearchEntry]:
    """The whole search graph and every row's vector in memory, in global id order (what a search reads)."""
    m = store.manifest
    entry = current(store)
    vectors = np.empty((m.rows, m.dim), np.dtype(m.dtype))
    ids = np.empty((m.rows, entry.degree), SEARCH_ID_DTYPE)
    lambdas = np.empty((m.rows, entry.degree), np.uint8)
    for s in m.shards:
        at = shard_rows(s)
        vectors[at] = store.read_vectors(s.id)
        ids[at] = store.read_search(entry.version, f"shards/{s.id}/ids")
        lambdas[at] = store.read_search(entry.version, f"shards/{s.id}/lambdas")
    return SearchIndex(vectors, ids, lambdas, metric), entry


def work_path(store: Store, version: int) -> Path:
    return store.path / SEARCH_DIR / str(version) / WORK
