"""The refusals of ``bigknn merge STORE OTHER...``, all made before anything is written: each names the store and
the field that keeps it out (exit 2)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from bigknn.core.errors import BadInput
from bigknn.core.knn_graph import id_dtype
from bigknn.shards import Store, user_ids
from bigknn.shards.sections import PendingWrite

STORE_KEY = "store_sha256"  # an ``inputs`` record that stands for a merged store: its manifest's sha256
# what must be equal for two stores' graphs to be one graph: rows of one dim and dtype, one ordering, lists of
# one length (a graph of another k or list width would be cut or padded)
SAME_FIELDS = ("dim", "dtype", "metric", "k", "list_width")


def digest(store: Store) -> str:
    """A store's identity as merged: the sha256 of its manifest (a store changed since it was merged is another
    one)."""
    return hashlib.sha256(store.manifest.to_json().encode()).hexdigest()


def merged_digests(store: Store, staged: bool = True) -> set[str]:
    """The stores already merged into ``store`` (by ``digest``): committed, and with ``staged`` those of a
    pending merge."""
    m = store.manifest
    records = m.inputs + (m.pending.inputs if m.pending and staged else [])
    return {rec[STORE_KEY] for rec in records if STORE_KEY in rec}


def staged(pending: PendingWrite | None) -> bool:
    """Whether a store's pending section is a merge of stores (not an ingest)."""
    return pending is not None and any(STORE_KEY in rec for rec in pending.inputs)


def check_store(store: Store) -> None:
    """STORE itself: finished, and not in the middle of an ingest (its pending rows would be numbered where the
    merged stores' go)."""
    store.manifest.require_complete(store.path)
    pending = store.manifest.pending
    if pending and not staged(pending):
        raise BadInput(store.path, "pending: an ingest was interrupted; finish it first (`bigknn merge "
                                   f"{store.path}` with no other store)")


def check_other(store: Store, other: Store, seen: list[Store]) -> None:
    """OTHER: another finished, contiguous store whose graph fits STORE's (``SAME_FIELDS``, user ids)."""
    if _same_dir(store.path, other.path):
        raise BadInput(other.path, f"is the store merged into ({store.path}): a store cannot be merged into itself")
    for earlier in seen:
        if _same_dir(earlier.path, other.path):
            raise BadInput(other.path, "is named twice")
    m, o = store.manifest, other.manifest
    if o.pending:
        raise BadInput(other.path, "pending: an ingest or merge into it was interrupted; finish it first "
                                   f"(`bigknn merge {other.path}`)")
    o.require_complete(other.path)
    mine, theirs = _fields(store), _fields(other)
    for name in SAME_FIELDS:
        if mine[name] != theirs[name]:
            raise BadInput(other.path, f"has {name} {theirs[name]}; {store.path} has {name} {mine[name]}: only stores "
                                       f"of one {name} merge")
    if o.partition is not None:
        raise BadInput(other.path, f"partition is {o.partition_method}: only contiguous stores merge into another "
                                   "(build it with --partition contiguous)")
    have, their = user_ids.stored_kind(store.path, m.rows), user_ids.stored_kind(other.path, o.rows)
    if have != their:
        raise BadInput(other.path, f"user ids: it keeps {their or 'none'}; {store.path} keeps {have or 'none'}: "
                                   "both keep ids of one kind (--id-column) or neither does")
    held = {(rec.get("size"), rec.get("sha256")) for rec in m.inputs if rec.get("sha256")}
    for rec in o.inputs:
        if rec.get("sha256") and (rec.get("size"), rec["sha256"]) in held:
            raise BadInput(other.path, f"inputs: {store.path} already holds the rows of {rec.get('path')} (same size "
                                       "and sha256): they would be in it twice")


def check_id_room(store: Store, rows: int) -> None:
    """A format-1 store (no checksums) cannot take ids past int32 (``ingest`` refuses the same)."""
    m = store.manifest
    if not m.checksummed and id_dtype(rows).itemsize > m.id_dtype.itemsize:
        raise BadInput(store.path, f"format {m.format}: the merge would take it to {rows:,} rows, past int32 ids, "
                                   "which format-1 stores (no checksums) cannot hold: rebuild it with this bigknn "
                                   "first")


def _fields(store: Store) -> dict:
    m = store.manifest
    return {"dim": m.dim, "dtype": np.dtype(m.dtype).name, "metric": m.metric, "k": m.k, "list_width": m.params.width()}


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()
