"""``bigknn export -o edges.parquet``: the graph as an edge list any dataframe engine reads without help.

One row per edge: ``src``, ``dst`` (input row numbers as int64, or the user's ids with ``ids="user"``),
``distance`` (float32, as ``bigknn.core.metric.user_distance`` gives it) and ``rank`` (int32: 1 for the nearest
neighbour, 0 for the row itself with ``include_self``). A row's edges are consecutive, nearest first; rows come
shard by shard (input order in a contiguous store; a partitioned one groups near rows). pyarrow writes the file
(a Parquet writer of our own would be one more thing to keep compatible with pandas, polars, DuckDB and Spark),
one shard's edges at a time in row groups of ``ROW_GROUP_EDGES``, to a temporary name renamed into place when
complete (``bigknn.core.atomic``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bigknn.core.atomic import atomic_path
from bigknn.formats.columnar import pyarrow
from bigknn.operations.readout import neighbours_per_row, shard_blocks
from bigknn.shards import Store
from bigknn.shards.user_ids import UserIds

ROW_GROUP_EDGES = 1 << 20  # edges per row group: a few tens of MB, what Parquet readers handle best


def id_type(pa, ids: UserIds | None):
    """The Arrow type of ids: int64 row numbers or user ids, or strings."""
    return pa.int64() if ids is None or ids.kind == "int64" else pa.large_string()


def export_parquet(store: Store, out: Path, include_self: bool, ids: UserIds | None) -> int:
    """Write the edge list to ``out``; return the number of edges. ``ids``: the user's ids to speak in."""
    pa = pyarrow()
    import pyarrow.parquet as pq
    m = store.manifest
    cols = neighbours_per_row(store, None) + include_self
    rank = np.arange(cols, dtype=np.int32) + (not include_self)
    schema = pa.schema([("src", id_type(pa, ids)), ("dst", id_type(pa, ids)), ("distance", pa.float32()),
                        ("rank", pa.int32())],
                       metadata={"bigknn.metric": m.metric, "bigknn.k": str(m.k),
                                 "bigknn.ids": "user" if ids is not None else "row"})
    edges = 0
    with atomic_path(out) as tmp, pq.ParquetWriter(tmp, schema) as writer:
        for rows, block_ids, block_dists in shard_blocks(store, include_self=include_self):
            src = np.arange(rows.start, rows.stop) if isinstance(rows, slice) else np.asarray(rows)
            src = np.repeat(src.astype(np.int64), cols)
            dst = block_ids.astype(np.int64, copy=False).ravel()
            keep = dst >= 0  # an empty slot (a row with fewer neighbours than k) is no edge
            src, dst = src[keep], dst[keep]
            table = pa.table({"src": src if ids is None else ids.arrow(src),
                              "dst": dst if ids is None else ids.arrow(dst),
                              "distance": block_dists.ravel()[keep], "rank": np.tile(rank, len(block_ids))[keep]},
                             schema=schema)
            writer.write_table(table, row_group_size=ROW_GROUP_EDGES)
            edges += len(table)
    return edges


def write_found_parquet(out: Path, found: np.ndarray, distances: np.ndarray, ids: UserIds | None) -> None:
    """A search's results as rows ``query``, ``rank`` (1 = nearest), ``id`` (row number or user id) and
    ``distance``; slots where fewer than k were found are left out."""
    pa = pyarrow()
    import pyarrow.parquet as pq
    queries, k = found.shape
    keep = found.ravel() >= 0
    rows = found.ravel()[keep].astype(np.int64)
    table = pa.table({"query": np.repeat(np.arange(queries, dtype=np.int64), k)[keep],
                      "rank": np.tile(np.arange(1, k + 1, dtype=np.int32), queries)[keep],
                      "id": rows if ids is None else ids.arrow(rows),
                      "distance": distances.ravel()[keep].astype(np.float32, copy=False)})
    with atomic_path(out) as tmp:
        pq.write_table(table, tmp, row_group_size=ROW_GROUP_EDGES)
