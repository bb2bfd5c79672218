"""``bigknn export``: the final graph in input order, as ``.ibin``, ``.npy``, ``.npz`` (scipy CSR) or ``.parquet``
(an edge list: bigknn/operations/export_parquet.py).

Row i holds the neighbours of global row i, nearest first, self excluded unless asked for (then first, at
distance 0), with the distances of ``bigknn.core.metric.user_distance``: Euclidean for ``l2``, 1 - cos for
``cosine``, 1 - x.y for ``ip``. The format follows the output's extension. Ids are the store's (int32, or int64
past 2^31 rows: ``.ibin`` holds int32 ids only, so such a store exports to ``.npy`` or ``.npz``); with
``ids="user"`` they are the user's ids the store keeps (``--id-column``): in ``.parquet``, or in ``.npy`` when
they are integers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from bigknn.core.atomic import atomic_path
from bigknn.core.errors import BadInput
from bigknn.formats import npy_writer, truth_writer
from bigknn.operations.readout import csr_parts, neighbours_per_row, shard_blocks
from bigknn.operations.export_parquet import export_parquet
from bigknn.shards import Store, user_ids

FORMATS = ("ibin", "npy", "npz", "parquet")
ID_KINDS = ("row", "user")  # input row numbers, or the user's ids the store keeps
NAMES = {user_ids.INT: "integers", user_ids.STR: "strings"}


def export(store: Store, out: Path, include_self: bool = False, ids: str = "row") -> dict:
    """Write the finished graph to ``out`` in the format its extension names; return a summary."""
    m = store.manifest
    m.require_complete(store.path)
    out = Path(out)
    fmt = format_of(out)
    if ids not in ID_KINDS:
        raise BadInput(out, f"ids {ids!r} is not one of {', '.join(ID_KINDS)}")
    cols = neighbours_per_row(store, None) + include_self
    users = user_ids.require(store.path, m.rows) if ids == "user" else None
    if users is not None and not (fmt == "parquet" or (fmt == "npy" and users.kind == user_ids.INT)):
        where = ".parquet or .npy" if users.kind == user_ids.INT else ".parquet"
        raise BadInput(out, f"the store's user ids are {NAMES[users.kind]}: export them to {where}")
    if fmt == "parquet":
        edges = export_parquet(store, out, include_self, users)
        return {"store": str(store.path), "rows": m.rows, "k": m.k, "format": fmt, "include_self": include_self,
                "ids": ids, "edges": edges, "files": [str(out)]}
    files = write_graph_file(out, m.rows, cols, m.id_dtype if users is None else np.dtype(np.int64),
                             lambda: shard_blocks(store, include_self=include_self),
                             None if users is None else users.take)
    return {"store": str(store.path), "rows": m.rows, "k": m.k, "format": fmt, "include_self": include_self,
            "ids": ids, "files": files}


def write_graph_file(out: Path, rows: int, cols: int, id_dtype: np.dtype,
                     blocks: Callable[[], Iterable[tuple[slice | np.ndarray, np.ndarray, np.ndarray]]],
                     user_ids_of: Callable[[np.ndarray], np.ndarray] | None = None) -> list[str]:
    """Write a graph of ``rows`` lists of ``cols`` entries to ``out`` in the format its extension names, from
    ``blocks()``: (input rows, ids, distances) in any order (a store's shards, or one block of arrays held in
    memory). ``user_ids_of``: maps row ids to the user's (an .npy of integer ids). Returns the files written."""
    fmt = format_of(out)
    if fmt == "ibin":
        if id_dtype != np.int32:
            raise BadInput(out, f"the graph's {rows} rows have int64 ids; .ibin holds int32 ids: export to "
                                ".npy or .npz")
        with truth_writer(out, rows, cols) as (ids, dists):
            for where, block_ids, block_dists in blocks():
                ids[where] = block_ids
                dists[where] = block_dists
        return [str(out)]
    if fmt == "npy":
        dist_path = out.with_name(out.stem + ".dists.npy")
        with npy_writer(out, id_dtype, (rows, cols)) as ids, npy_writer(dist_path, np.float32, (rows, cols)) as dists:
            # both files are renamed into place only after both are complete
            for where, block_ids, block_dists in blocks():
                ids[where] = block_ids if user_ids_of is None else user_ids_of(block_ids)
                dists[where] = block_dists
        return [str(out), str(dist_path)]
    # the file scipy.sparse.save_npz writes for a CSR matrix, written without needing scipy
    all_ids = np.empty((rows, cols), id_dtype)
    all_dists = np.empty((rows, cols), np.float32)
    for where, block_ids, block_dists in blocks():
        all_ids[where] = block_ids
        all_dists[where] = block_dists
    data, indices, indptr = csr_parts(all_ids, all_dists)
    with atomic_path(out) as tmp, open(tmp, "wb") as f:
        np.savez(f, indices=indices, indptr=indptr, format=np.array(b"csr"), shape=np.array([rows, rows]), data=data)
    return [str(out)]


def format_of(out: Path) -> str:
    """The export format ``out``'s extension names."""
    fmt = Path(out).suffix.lower().removeprefix(".")
    if fmt not in FORMATS:
        raise BadInput(out, f"unknown export format {Path(out).suffix or '(no extension)'!r}; name the file "
                            f"{', '.join('.' + f for f in FORMATS)}")
    return fmt
