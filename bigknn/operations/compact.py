"""Regroup the small shards an older bigknn left at the end of a contiguous store (one shard per ingested file,
never compacted) into shards of up to ``shard_rows`` rows, keeping their lists as they are: ids are global, so a
shard's rows and lists move without a change. The ingest that finds such a store does it first, in a commit
of its own, before its batch (bigknn/operations/ingest.py).

Which shards: the trailing run of shards of at most SMALL_FRACTION of ``shard_rows`` rows each. They are read and
written once, whole (their rows and lists; the work is their rows, once: shards that follow a regrouped one take
new ids, so the run is regrouped as a whole). Each regrouped shard keeps its rows with its graph version, as a
small ingest's tail does (ShardEntry.rows_with_graph), so every array is written under a version no reader
holds, and the commit makes the regrouping visible at once; readers of the older version keep reading the
shards it named until they close.
"""

from __future__ import annotations

import numpy as np

from bigknn.core.knn_graph import KnnGraph
from bigknn.core.progress import Reporter
from bigknn.shards import ShardEntry, Store
from bigknn.shards.manifest import TAIL_SINCE, Manifest
from bigknn.shards.upgrade import mark_format

SMALL_FRACTION = 0.5  # a shard of at most this share of shard_rows, at the end of a store, is regrouped


def regroup_plan(m: Manifest) -> tuple[int, list[list[ShardEntry]]] | None:
    """(first shard of the trailing run of small shards, its consecutive groups of up to ``shard_rows`` rows), or
    None where regrouping would not reduce the shard count (or the store is partitioned: its shards are regions)."""
    if m.partition is not None:
        return None
    first = len(m.shards)
    while first > 1 and m.shards[first - 1].rows <= SMALL_FRACTION * m.shard_rows:
        first -= 1
    groups: list[list[ShardEntry]] = []
    for s in m.shards[first:]:
        if groups and sum(g.rows for g in groups[-1]) + s.rows <= m.shard_rows:
            groups[-1].append(s)
        else:
            groups.append([s])
    return (first, groups) if len(groups) < len(m.shards) - first else None


def regroup_small_shards(store: Store, reporter: Reporter) -> dict | None:
    """Regroup the store's trailing small shards (module docstring) in one commit; what it did, or None."""
    m = store.manifest
    plan = regroup_plan(m)
    if plan is None:
        return None
    first, groups = plan
    entries, rows_moved = [], 0
    for i, group in enumerate(groups):
        sid = first + i
        x = np.concatenate([store.read_vectors(s.id) for s in group])
        graphs = [store.read_graph(s.id) for s in group]
        graph = KnnGraph(np.concatenate([g.ids for g in graphs]).astype(m.id_dtype, copy=False),
                         np.concatenate([g.dists for g in graphs]))
        version = store.next_version(sid, None)  # above every version on disk, whichever shard had the id
        store.write_vectors(sid, x, version)
        store.write_graph(sid, version, graph)
        entries.append(ShardEntry(id=sid, offset=group[0].offset, rows=len(x), graph=version, rows_with_graph=True))
        rows_moved += len(x)
    before = len(m.shards)
    m.shards[first:] = entries
    # a contiguous store merges every pair: the regrouped shards' lists already span the whole store
    m.merged = [p for p in m.merged if max(p) < first] + [[i, j] for j in range(first, len(m.shards))
                                                           for i in range(j)]
    if m.format < TAIL_SINCE:
        m.format = TAIL_SINCE
        mark_format(store.path, m.format)
    store.commit()
    reporter.note(f"{store.path}: regrouped {before - first} small shards ({rows_moved:,} rows) into {len(entries)}")
    return {"shards_before": before, "shards_after": len(m.shards), "rows_moved": rows_moved}
