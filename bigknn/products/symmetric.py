"""The symmetric kNN graph: the union (an edge where either row lists the other) or the mutual graph (where
both do), with distances, UMAP's fuzzy strengths or plain 1s, in two streamed passes (``edges``): every list
entry is filed under both its rows' blocks, then each row block is sorted, its pairs joined, and handed on
as CSR rows (columns ascending, scipy's canonical order). A CSR in memory (``symmetric_csr``) where the
caller asks for one; ``.npz`` (scipy's CSR file) or Parquet edges (``write_symmetric``) written block by
block otherwise."""

from __future__ import annotations

import tempfile
import zipfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from bigknn.core.atomic import atomic_path
from bigknn.core.errors import BadInput, disk_full_named
from bigknn.formats.write import npy_header
from bigknn.operations.readout import neighbours_per_row
from bigknn.products import fuzzy
from bigknn.products.edges import Buckets, block_rows, both_ways, default_budget, shard_edges
from bigknn.shards import Store

MODES = ("union", "mutual")
WEIGHTS = ("distance", "umap", "none")
FORMATS = ("npz", "parquet")
COPY_ITEMS = 1 << 22  # values per write when a CSR array is copied into the .npz
# (rows, cols, weights) -> weights: the reachability transform of a distance graph
Transform = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def check(store: Store, mode: str, weights: str | None) -> str:
    """``mode`` and ``weights`` checked (None: plain 1s, the same as "none"); returns the weights' name."""
    weights = "none" if weights is None else weights
    if mode not in MODES:
        raise BadInput(store.path, f"unknown symmetric mode {mode!r}; choose {' or '.join(MODES)}")
    if weights not in WEIGHTS:
        raise BadInput(store.path, f"unknown weights {weights!r}; choose {', '.join(WEIGHTS)}")
    return weights


def symmetric_blocks(store: Store, mode: str = "union", weights: str | None = "distance", k: int | None = None,
                     host_mem: int | None = None, tmp_parent: Path | None = None,
                     transform: Transform | None = None) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """(first row, entries per row, columns int64, weights float32) of each row block of the symmetric graph.

    ``host_mem`` bounds a block's edges (default: half the RAM); where the whole graph's edges exceed it they
    wait on disk in a temporary directory under ``tmp_parent`` (default: the system's)."""
    weights = check(store, mode, weights)
    m = store.manifest
    m.require_complete(store.path)
    k = neighbours_per_row(store, k)
    mean_all = fuzzy.mean_distance(store, k) if weights == "umap" else 0.0
    block = block_rows(m.rows, k, default_budget() if host_mem is None else host_mem)
    with Buckets(m.rows, block, tmp_parent) as buckets:
        for rows, ids, dists in shard_edges(store, k):
            w = fuzzy.memberships(dists, mean_all) if weights == "umap" else dists
            for s in range(0, len(rows), block):  # a block's rows at a time: their edges fit the budget too
                buckets.add(both_ways(rows[s:s + block], ids[s:s + block], w[s:s + block]))
        for lo, hi, edges in buckets.blocks():
            rows, cols, w = join_pairs(edges, lo, m.rows, mode, weights)
            if transform is not None:
                w = transform(rows, cols, w)
            yield lo, np.bincount(rows - lo, minlength=hi - lo), cols, w


def join_pairs(edges: np.ndarray, lo: int, n: int, mode: str, weights: str) -> tuple[np.ndarray, ...]:
    """One block's edges, each pair (row, col) once, sorted by row then column: (rows, cols, weights).

    A pair arrives at most twice: from row's own list (fwd) and as the reverse of col's entry for row."""
    key = (edges["row"] - lo) * n + edges["col"]
    order = np.argsort(key, kind="stable")
    edges, key = edges[order], key[order]
    first = np.ones(len(key), bool)
    first[1:] = key[1:] != key[:-1]
    pair = np.cumsum(first) - 1
    fwd = edges["fwd"] == 1
    own, other = np.full(int(first.sum()), np.nan, np.float32), np.full(int(first.sum()), np.nan, np.float32)
    own[pair[fwd]] = edges["w"][fwd]
    other[pair[~fwd]] = edges["w"][~fwd]
    keep = ~np.isnan(own) & ~np.isnan(other) if mode == "mutual" else np.ones(len(own), bool)
    if weights == "umap":
        a, b = np.nan_to_num(own, nan=0.0), np.nan_to_num(other, nan=0.0)
        w = a + b - a * b if mode == "union" else a * b
        keep &= w > 0  # umap-learn drops zero strengths (eliminate_zeros)
    elif weights == "distance":
        w = np.fmin(own, other)  # the same distance both ways, up to the rounding of two computations
    else:
        w = np.ones(len(own), np.float32)
    return edges["row"][first][keep], edges["col"][first][keep], w[keep].astype(np.float32)


def symmetric_csr(store: Store, mode: str = "union", weights: str | None = "distance", k: int | None = None,
                  host_mem: int | None = None, tmp_parent: Path | None = None,
                  transform: Transform | None = None) -> Any:
    """The symmetric graph as one ``scipy.sparse.csr_matrix`` (rows, rows) in memory."""
    from scipy import sparse

    counts, cols, data = [], [], []
    for _, c, col, w in symmetric_blocks(store, mode, weights, k, host_mem, tmp_parent, transform):
        counts.append(c)
        cols.append(col)
        data.append(w)
    n = store.manifest.rows
    indptr = np.concatenate([[0], np.cumsum(np.concatenate(counts))])
    index = index_dtype(n, int(indptr[-1]))
    return sparse.csr_matrix((np.concatenate(data), np.concatenate(cols).astype(index), indptr.astype(index)),
                             shape=(n, n))


def index_dtype(rows: int, nnz: int) -> type:
    """scipy's choice for CSR indices: int32 while rows and entries fit, int64 beyond."""
    return np.int32 if max(rows, nnz) <= np.iinfo(np.int32).max else np.int64


def write_symmetric(store: Store, out: Path, mode: str = "union", weights: str | None = "distance",
                    k: int | None = None, host_mem: int | None = None) -> dict:
    """Write the symmetric graph block by block: ``.npz`` (``scipy.sparse.load_npz`` reads it) or
    ``.parquet`` edges (row, col, weight: each pair both ways). Temporary files live next to ``out``."""
    weights = check(store, mode, weights)
    out = Path(out)
    fmt = out.suffix.lower().removeprefix(".")
    if fmt not in FORMATS:
        raise BadInput(out, f"a symmetric graph is written as {' or '.join('.' + f for f in FORMATS)}, not "
                            f"{out.suffix or '(no extension)'!r}")
    if fmt == "parquet":
        _require_pyarrow(out)
    with atomic_path(out) as tmp, tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as work:
        blocks = symmetric_blocks(store, mode, weights, k, host_mem, Path(work))
        nnz = (_write_parquet if fmt == "parquet" else _write_npz)(blocks, tmp, Path(work), store.manifest.rows)
    return {"store": str(store.path), "rows": store.manifest.rows, "symmetric": mode, "weights": weights,
            "entries": nnz, "format": fmt, "files": [str(out)]}


def _write_parquet(blocks, tmp: Path, work: Path, n: int) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("row", pa.int64()), ("col", pa.int64()), ("weight", pa.float32())])
    nnz = 0
    with disk_full_named(tmp, None), pq.ParquetWriter(tmp, schema) as writer:
        for lo, counts, cols, w in blocks:
            rows = np.repeat(np.arange(lo, lo + len(counts), dtype=np.int64), counts)
            writer.write_table(pa.table({"row": rows, "col": cols, "weight": w}, schema=schema))
            nnz += len(cols)
    return nnz


def _write_npz(blocks, tmp: Path, work: Path, n: int) -> int:
    """Columns and weights go to two raw files while the blocks stream; then the zip scipy reads is made
    from them (indptr, O(rows), stays in memory)."""
    counts = []
    with ExitStack() as files:
        cols_f = files.enter_context(open(work / "indices.raw", "wb"))
        data_f = files.enter_context(open(work / "data.raw", "wb"))
        with disk_full_named(work, None):
            for _, c, cols, w in blocks:
                counts.append(c)
                cols.astype(np.int64).tofile(cols_f)
                w.astype(np.float32).tofile(data_f)
    indptr = np.concatenate([[0], np.cumsum(np.concatenate(counts))])
    nnz = int(indptr[-1])
    index = index_dtype(n, nnz)
    with disk_full_named(tmp, None), zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        _member(z, "indices", np.memmap(work / "indices.raw", np.int64, "r") if nnz else np.zeros(0, np.int64),
                index)
        _member(z, "indptr", indptr, index)
        _member(z, "format", np.array(b"csr"), None)
        _member(z, "shape", np.array([n, n]), None)
        _member(z, "data", np.memmap(work / "data.raw", np.float32, "r") if nnz else np.zeros(0, np.float32),
                np.float32)
    return nnz


def _member(z: zipfile.ZipFile, name: str, values: np.ndarray, dtype: type | None) -> None:
    """One ``.npy`` member of the zip, copied in pieces (and converted to ``dtype``) so a memmap stays on disk."""
    dtype = np.dtype(values.dtype if dtype is None else dtype)
    with z.open(f"{name}.npy", "w", force_zip64=True) as f:
        f.write(npy_header(dtype, values.shape))
        flat = values.reshape(-1)
        for start in range(0, max(len(flat), 1), COPY_ITEMS):
            f.write(np.ascontiguousarray(flat[start:start + COPY_ITEMS], dtype).tobytes())


def _require_pyarrow(out: Path) -> None:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise BadInput(out, "writing Parquet needs pyarrow: pip install 'bigknn[parquet]', or write .npz") from None
