"""The shape of manifest.json: each field and the type the code relies on.

A manifest that was edited by hand or damaged (a JSON list, a shard's ``rows`` written as a string) must
stop a command at once with one line naming the field, not with a traceback far from the cause (a sum of
strings in ``info``, an index error in a merge). This checks types and signs only; whether the manifest
agrees with the arrays on disk is ``bigknn verify``'s job.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Callable

import numpy as np

from bigknn.core.metric import METRICS
from bigknn.core.params import GnndParams

Check = tuple[Callable[[object], bool], str]  # (test, what the field must be)


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _dtype(v: object) -> bool:
    try:
        return isinstance(v, str) and np.dtype(v).kind in "iuf"
    except TypeError:
        return False


def _pair(v: object) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(_int(i) and i >= 0 for i in v)


COUNT: Check = (lambda v: _int(v) and v > 0, "a positive integer")
INDEX: Check = (lambda v: _int(v) and v >= 0, "a non-negative integer")
DTYPE: Check = (_dtype, "a numeric dtype like '<f4'")
OBJECT: Check = (lambda v: isinstance(v, dict), "an object")
BOOL: Check = (lambda v: isinstance(v, bool), "true or false")
LIST: Check = (lambda v: isinstance(v, list), "a list")
PAIRS: Check = (lambda v: isinstance(v, list) and all(_pair(p) for p in v), "a list of [i, j] shard pairs")
PARAMS: Check = (lambda v: isinstance(v, dict) and set(v) <= {f.name for f in fields(GnndParams)}
                 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v.values()),
                 "an object of GNND parameters")

TOP: dict[str, Check] = {
    "dim": COUNT, "dtype": DTYPE, "metric": (lambda v: v in METRICS, f"one of {METRICS}"),
    "k": COUNT, "shard_rows": COUNT, "params": PARAMS, "seed": (_int, "an integer"), "format": COUNT,
    "inputs": LIST, "shards": LIST, "merged": PAIRS, "timings": OBJECT,
    "pending": (lambda v: v is None or isinstance(v, dict), "an object or null"),
    "estimate": (lambda v: v is None or isinstance(v, dict), "an object or null"),
    "search": (lambda v: v is None or isinstance(v, dict), "an object or null"),
    "partition": (lambda v: v is None or (isinstance(v, dict) and isinstance(v.get("method"), str)
                                          and isinstance(v.get("arrays"), list) and _int(v.get("shards"))),
                  "null or an object with a method, its arrays and its shard count"),
    "pairs": (lambda v: v is None or PAIRS[0](v), "null or a list of [i, j] shard pairs"),
    "ids": (lambda v: v in ("int32", "int64"), "int32 or int64"),
}
OPTIONAL = {"inputs", "shards", "merged", "timings", "pending", "estimate", "search", "partition", "pairs", "ids"}
SHARD: dict[str, Check] = {"id": INDEX, "offset": INDEX, "rows": COUNT,
                           "graph": (lambda v: v is None or (_int(v) and v >= 0), "a non-negative integer or null"),
                           # vectors referenced in an input file (bigknn/shards/referenced.py)
                           "source": (lambda v: v is None or (isinstance(v, dict) and _int(v.get("input")) and
                                                              _int(v.get("byte_offset"))),
                                      "null or an object with integers input and byte_offset"),
                           "rows_with_graph": BOOL}
INPUT: dict[str, Check] = {
    "path": (lambda v: isinstance(v, str), "a string"), "size": INDEX, "mtime_ns": (_int, "an integer"),
    "sha256": (lambda v: v is None or isinstance(v, str), "a string or null"), "rows": COUNT,
    "dtype": DTYPE, "first_id": INDEX,
    # a small ingest's join (bigknn/operations/ingest_join.py): its effort, and whether its recall was checked
    "join_effort": COUNT, "join_checked": BOOL, "join_declined": BOOL,
}
SEARCH: dict[str, Check] = {
    "version": COUNT, "method": (lambda v: isinstance(v, str), "a string"), "degree": COUNT, "rows": COUNT,
    "graphs": (lambda v: isinstance(v, list) and all(x is None or (_int(x) and x >= 0) for x in v),
               "a list of graph versions"),
}
PENDING: dict[str, Check] = {"inputs": LIST, "shards": LIST, "merged": PAIRS,
                             "near": (lambda v: v is None or (isinstance(v, list) and all(INDEX[0](i) for i in v)),
                                      "null or a list of shard ids"),
                             "graphs": (lambda v: isinstance(v, dict) and all(_int(x) and x >= 0 for x in v.values()),
                                        "an object of shard id -> graph version")}


def check_manifest(raw: object) -> None:
    """Raise ValueError naming the first field of ``raw`` (a parsed manifest.json) that is missing, unknown
    or of the wrong type."""
    if not isinstance(raw, dict):
        raise ValueError(f"the manifest is a JSON {_json_type(raw)}, not an object")
    _check_object(raw, TOP, "", optional=OPTIONAL)
    for i, shard in enumerate(raw.get("shards", [])):
        _check_object(shard, SHARD, f"shards[{i}].", optional={"graph", "source", "rows_with_graph"})
    for i, rec in enumerate(raw.get("inputs", [])):
        _check_object(rec, INPUT, f"inputs[{i}].", optional=set(INPUT) - {"path"}, closed=False)
    if raw.get("search") is not None:  # what readers of the search graph rely on; the rest is a record
        _check_object(raw["search"], SEARCH, "search.", closed=False)
    pending = raw.get("pending")
    if pending is not None:
        _check_object(pending, PENDING, "pending.", optional={"near"})
        for i, shard in enumerate(pending["shards"]):
            _check_object(shard, SHARD, f"pending.shards[{i}].", optional={"graph", "rows_with_graph"})
        for i, rec in enumerate(pending["inputs"]):
            _check_object(rec, INPUT, f"pending.inputs[{i}].", optional=set(INPUT) - {"path"},
                          closed=False)
        bad_key = next((key for key in pending["graphs"] if not key.isdigit()), None)
        if bad_key is not None:
            raise ValueError(f"pending.graphs has the key {bad_key!r}, expected a shard id")
    _check_sequence(raw.get("shards", []), "shards", 0, 0)
    if pending is not None:
        done = raw.get("shards", [])
        _check_sequence(pending["shards"], "pending.shards", len(done),
                        done[-1]["offset"] + done[-1]["rows"] if done else 0)


def _check_sequence(shards: list[dict], where: str, first_id: int, first_row: int) -> None:
    """Shards number on from ``first_id`` and their rows follow one another from ``first_row``: a gap or an
    overlap would give rows two ids or none."""
    expect_id, expect_row = first_id, first_row
    for i, shard in enumerate(shards):
        if shard["id"] != expect_id:
            raise ValueError(f"{where}[{i}].id is {shard['id']}, expected {expect_id} (shards number on in order)")
        if shard["offset"] != expect_row:
            raise ValueError(f"{where}[{i}].offset is {shard['offset']}, expected {expect_row} (the rows of the "
                             "shards before it): a gap or an overlap of row ids")
        expect_id, expect_row = expect_id + 1, expect_row + shard["rows"]


def _check_object(obj: object, schema: dict[str, Check], where: str, optional: set[str] = frozenset(),
                  closed: bool = True) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"{where.rstrip('.')} is a JSON {_json_type(obj)}, expected an object")
    for key, (test, want) in schema.items():
        if key not in obj:
            if key not in optional:
                raise ValueError(f"{where}{key} is missing")
        elif not test(obj[key]):
            raise ValueError(f"{where}{key} is {_json_type(obj[key])} {_shown(obj[key])}, expected {want}")
    unknown = sorted(set(obj) - set(schema)) if closed else []
    if unknown:
        raise ValueError(f"{where}{unknown[0]} is not a manifest field")


def _json_type(v: object) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if v is None else names.get(type(v), type(v).__name__)


def _shown(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."
