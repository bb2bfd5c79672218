"""Query sets: read from a file or taken from an array, checked against the store, as the search computes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bigknn.operations.input_arrays import host_array
from bigknn.core.errors import BadInput
from bigknn.formats import check_rows, open_vectors
from bigknn.core.metric import prepare_rows
from bigknn.shards.manifest import Manifest


def load_queries(source: Any, m: Manifest) -> np.ndarray:
    """(queries, dim) float32 rows as the store holds its own (cosine: unit length). ``source``: a vector file
    (any input format) or an array. Refused (exit 2, naming the file) when empty, of another dimension, or
    holding NaN / Inf."""
    if isinstance(source, (str, Path)):
        name = str(source)
        vf = open_vectors(source)
        if vf.dim != m.dim:
            raise BadInput(name, f"queries have dim {vf.dim}; the store's rows have dim {m.dim}")
        q = vf.read(0, vf.rows)
    else:
        name = "queries"
        q = host_array(source[None, :] if getattr(source, "ndim", 2) == 1 else source)
        if q.shape[1] != m.dim:
            raise BadInput(name, f"have dim {q.shape[1]}; the store's rows have dim {m.dim}")
    if len(q) == 0:
        raise BadInput(name, "holds no queries")
    check_rows(name, 0, q)
    return as_searched(q, m.metric)


def as_searched(rows: np.ndarray, metric: str) -> np.ndarray:
    """Checked query rows as the search computes them: float32, C order, unit length under cosine."""
    return np.ascontiguousarray(prepare_rows(rows.astype(np.float32, copy=False), metric), dtype=np.float32)
