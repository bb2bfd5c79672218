"""``bigknn export``: the final graph in input order, as ``.ibin`` or ``.npy``.

Row i holds the neighbours of global row i, nearest first, self excluded. Distances are the metric's
own: Euclidean distance for ``l2``, the inner product for ``ip`` (larger is closer), cosine distance
(1 - cos) for ``cosine``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bigknn.errors import BadInput
from bigknn.formats import npy_writer, truth_writer
from bigknn.shards import Store

FORMATS = ("ibin", "npy")


def metric_distance(keys: np.ndarray, metric: str) -> np.ndarray:
    """Stored ordering keys -> the distances users expect."""
    if metric == "l2":
        return np.sqrt(np.maximum(keys, 0.0))
    if metric == "ip":
        return -keys
    return 1.0 + keys  # cosine: key = -cos


def export(store: Store, out: Path, fmt: str) -> dict:
    """Write the finished graph to ``out`` (and ``<stem>.dists.npy`` for npy), each file under a temporary
    name renamed into place only when complete: a failed export leaves any previous file byte-identical."""
    m = store.manifest
    m.require_complete(store.path)
    out = Path(out)
    if not out.parent.is_dir():
        raise BadInput(out, f"no such directory {out.parent}")
    if fmt == "ibin":
        if out.suffix.lower() != ".ibin":
            raise BadInput(out, "--format ibin writes a .ibin file")
        with truth_writer(out, m.rows, m.k) as (ids, dists):
            _fill(store, ids, dists)
        files = [str(out)]
    else:
        if out.suffix.lower() != ".npy":
            raise BadInput(out, "--format npy writes a .npy file (distances go to <name>.dists.npy)")
        dist_path = out.with_name(out.stem + ".dists.npy")
        with npy_writer(out, np.int32, (m.rows, m.k)) as ids, \
                npy_writer(dist_path, np.float32, (m.rows, m.k)) as dists:
            _fill(store, ids, dists)  # both files are renamed into place only after both are complete
        files = [str(out), str(dist_path)]
    return {"store": str(store.path), "rows": m.rows, "k": m.k, "format": fmt, "files": files}


def _fill(store: Store, ids: np.ndarray, dists: np.ndarray) -> None:
    """Every shard's graph, cut to k, into the output arrays at the shard's global rows."""
    m = store.manifest
    for shard, g in _graphs(store):
        ids[shard.offset:shard.offset + shard.rows] = g.ids[:, :m.k]
        dists[shard.offset:shard.offset + shard.rows] = metric_distance(g.dists[:, :m.k], m.metric)


def _graphs(store: Store):
    for shard in store.manifest.shards:
        yield shard, store.read_graph(shard.id)
