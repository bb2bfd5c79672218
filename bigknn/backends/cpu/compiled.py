"""One GNND iteration and the per-row key passes through the numba kernels (kernels.py, keypass.py): the fast path of
descent.py, drawing the same random numbers as the NumPy reference so both walk the same way."""

from __future__ import annotations

import numba
import numpy as np

from bigknn.backends.cpu import kernels, keypass
from bigknn.backends.cpu.descent import reverse_salt
from bigknn.core.metric import Metric


def iteration(x: np.ndarray, sq: np.ndarray, state, metric: Metric, p: int, rng: np.random.Generator,
              part: np.ndarray | None) -> int:
    """Sample, cross-match and insert (descent._sample, _cross_match, _insert); return entries inserted."""
    cross_only = part is not None
    labels = part.astype(np.int32) if cross_only else np.zeros(len(state.ids), np.int32)
    fwd_new, fwd_old = kernels.first_p(state.ids, state.is_new, labels, cross_only, p)
    new_s = _with_reverse(fwd_new, p, rng)
    old_s = _with_reverse(fwd_old, p, rng)
    bound = np.ascontiguousarray(state.dists[:, -1])
    targets, cands, keys = kernels.cross_match(x, sq, new_s, old_s, bound, not metric.dot_keys, cross_only)
    return int(kernels.insert(state.ids, state.dists, state.is_new, targets, cands, keys, numba.get_num_threads()))


def _with_reverse(fwd: np.ndarray, p: int, rng: np.random.Generator) -> np.ndarray:
    """descent._with_reverse: the same salt drawn here, the fill compiled."""
    return kernels.reverse_fill(fwd, reverse_salt(rng), p, numba.get_num_threads())


def row_keys(x: np.ndarray, sq: np.ndarray, rows: np.ndarray, ids: np.ndarray, metric: Metric) -> np.ndarray:
    """descent.row_keys_local, compiled."""
    return keypass.row_keys(x, sq, rows.astype(np.int64), np.ascontiguousarray(ids, np.int32), not metric.dot_keys)


def exact_l2_keys(x: np.ndarray, state) -> None:
    """descent.exact_l2_keys, compiled."""
    keypass.exact_l2_resort(x, state.ids, state.dists, state.is_new)
