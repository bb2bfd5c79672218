"""``bigknn export``: the final graph in input order, as ``.ibin``, ``.npy`` or ``.npz`` (scipy CSR).

Row i holds the neighbours of global row i, nearest first, self excluded unless asked for (then first, at
distance 0), with the distances of ``bigknn.metrics.user_distance``: Euclidean for ``l2``, 1 - cos for
``cosine``, 1 - x.y for ``ip``. The format follows the output's extension. Ids are the store's (int32, or int64
past 2^31 rows: ``.ibin`` holds int32 ids only, so such a store exports to ``.npy`` or ``.npz``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from bigknn.atomic import atomic_path
from bigknn.errors import BadInput
from bigknn.formats import npy_writer, truth_writer
from bigknn.pipeline.readout import csr_parts, neighbours_per_row, shard_blocks
from bigknn.shards import Store

FORMATS = ("ibin", "npy", "npz")


def export(store: Store, out: Path, include_self: bool = False) -> dict:
    """Write the finished graph to ``out`` in the format its extension names; return a summary."""
    m = store.manifest
    m.require_complete(store.path)
    cols = neighbours_per_row(store, None) + include_self
    files = write_graph_file(Path(out), m.rows, cols, m.id_dtype,
                             lambda: shard_blocks(store, include_self=include_self))
    return {"store": str(store.path), "rows": m.rows, "k": m.k, "format": format_of(out),
            "include_self": include_self, "files": files}


def write_graph_file(out: Path, rows: int, cols: int, id_dtype: np.dtype,
                     blocks: Callable[[], Iterable[tuple[slice | np.ndarray, np.ndarray, np.ndarray]]]) -> list[str]:
    """Write a graph of ``rows`` lists of ``cols`` entries to ``out`` in the format its extension names, from
    ``blocks()``: (input rows, ids, distances) in any order (a store's shards, or one block of arrays held in
    memory). Returns the files written."""
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
                ids[where] = block_ids
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
