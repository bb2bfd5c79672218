"""Query sets: read from a file or taken from an array and checked against the store. A search hands the rows
to its backend as they are (the backend checks and prepares each batch where it searches it: on the GPU, the
host does nothing per query); exact truth and recall take them prepared on the host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bigknn.operations.input_arrays import host_array
from bigknn.core.errors import BadInput
from bigknn.algorithms.search_index import host_queries
from bigknn.formats import open_vectors
from bigknn.core.metric import metric as metric_of
from bigknn.shards.manifest import Manifest

ARRAY_NAME = "queries"  # what an error about a row of a query array names


def read_queries(source: Any, m: Manifest) -> tuple[np.ndarray, str]:
    """(queries, name): (queries, dim) C-order rows as given (their own dtype), and the name an error about one of them
    gives (the file, or "queries"). ``source``: a vector file (any input format) or an array (one vector is one
    query). Refused (exit 2, naming the file) when empty or of another dimension; the rows themselves are judged
    by ``load_queries`` or the backend's ``searched_queries``."""
    if isinstance(source, (str, Path)):
        name = str(source)
        vf = open_vectors(source)
        if vf.dim != m.dim:
            raise BadInput(name, f"queries have dim {vf.dim}; the store's rows have dim {m.dim}")
        q = vf.read(0, vf.rows)
    else:
        name = ARRAY_NAME
        q = host_array(source[None, :] if getattr(source, "ndim", 2) == 1 else source)
        if q.shape[1] != m.dim:
            raise BadInput(name, f"have dim {q.shape[1]}; the store's rows have dim {m.dim}")
    if len(q) == 0:
        raise BadInput(name, "holds no queries")
    return np.ascontiguousarray(q), name


def load_queries(source: Any, m: Manifest) -> np.ndarray:
    """``read_queries``, then every row checked (NaN / Inf and the overflow checks of the input, naming the
    first bad row) and prepared on the host as the search computes it (the backends' ``host_queries``): what
    exact truth and recall compare."""
    q, name = read_queries(source, m)
    return host_queries(q, metric_of(m.metric), name, 0)
