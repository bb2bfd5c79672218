"""``bigknn export``: the final graph in input order, as ``.ibin``, ``.npy``, ``.npz`` (scipy CSR) or ``.parquet``
(an edge list: bigknn/pipeline/export_parquet.py).

Row i holds the neighbours of global row i, nearest first, self excluded unless asked for (then first, at
distance 0), with the distances of ``bigknn.metrics.user_distance``: Euclidean for ``l2``, 1 - cos for
``cosine``, 1 - x.y for ``ip``. The format follows the output's extension. Ids are the store's (int32, or int64
past 2^31 rows: ``.ibin`` holds int32 ids only, so such a store exports to ``.npy`` or ``.npz``); with
``ids="user"`` they are the user's ids the store keeps (``--id-column``): in ``.parquet``, or in ``.npy`` when
they are integers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bigknn.atomic import atomic_path
from bigknn.errors import BadInput
from bigknn.formats import npy_writer, truth_writer
from bigknn.pipeline.readout import csr_parts, neighbours_per_row, shard_blocks, whole_graph
from bigknn.pipeline.export_parquet import export_parquet
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
    files = [str(out)]
    if fmt == "parquet":
        edges = export_parquet(store, out, include_self, users)
        return {"store": str(store.path), "rows": m.rows, "k": m.k, "format": fmt, "include_self": include_self,
                "ids": ids, "edges": edges, "files": files}
    if fmt == "ibin":
        if m.id_dtype != np.int32:
            raise BadInput(out, f"the store's {m.rows} rows have int64 ids; .ibin holds int32 ids: export to "
                                ".npy or .npz")
        with truth_writer(out, m.rows, cols) as (out_ids, dists):
            for rows, block_ids, block_dists in shard_blocks(store, include_self=include_self):
                out_ids[rows] = block_ids
                dists[rows] = block_dists
        files = [str(out)]
    elif fmt == "npy":
        dist_path = out.with_name(out.stem + ".dists.npy")
        with npy_writer(out, m.id_dtype if users is None else np.int64, (m.rows, cols)) as out_ids, \
                npy_writer(dist_path, np.float32, (m.rows, cols)) as dists:
            # both files are renamed into place only after both are complete
            for rows, block_ids, block_dists in shard_blocks(store, include_self=include_self):
                out_ids[rows] = block_ids if users is None else users.take(block_ids)
                dists[rows] = block_dists
        files = [str(out), str(dist_path)]
    else:  # the file scipy.sparse.save_npz writes for a CSR matrix, written without needing scipy
        data, indices, indptr = csr_parts(*whole_graph(store, include_self=include_self))
        with atomic_path(out) as tmp, open(tmp, "wb") as f:
            np.savez(f, indices=indices, indptr=indptr, format=np.array(b"csr"),
                     shape=np.array([m.rows, m.rows]), data=data)
        files = [str(out)]
    return {"store": str(store.path), "rows": m.rows, "k": m.k, "format": fmt, "include_self": include_self,
            "ids": ids, "files": files}


def format_of(out: Path) -> str:
    """The export format ``out``'s extension names."""
    fmt = Path(out).suffix.lower().removeprefix(".")
    if fmt not in FORMATS:
        raise BadInput(out, f"unknown export format {Path(out).suffix or '(no extension)'!r}; name the file "
                            f"{', '.join('.' + f for f in FORMATS)}")
    return fmt
