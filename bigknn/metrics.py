"""Distance metrics and their ordering keys.

Graphs store the metric's *ordering key*, smaller is closer: squared L2 for ``l2`` and ``-dot`` for ``ip``.
``cosine`` is ``ip`` on rows normalised when they enter the store, so backends only ever see ``l2`` or ``ip``.
"""

from __future__ import annotations

import numpy as np

METRICS = ("l2", "ip", "cosine")


def kernel_metric(metric: str) -> str:
    """The metric the backends compute for a user-facing metric."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    return "ip" if metric == "cosine" else metric


def stored_dtype(metric: str, input_dtype: np.dtype) -> np.dtype:
    """Dtype of the vectors kept in the store: normalised cosine rows need floats."""
    return np.dtype(np.float32) if metric == "cosine" else np.dtype(input_dtype)


def prepare_rows(x: np.ndarray, metric: str) -> np.ndarray:
    """Rows as they are stored: cosine rows are normalised to unit length (zero rows stay zero)."""
    if metric != "cosine":
        return x
    xf = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(xf, axis=1, keepdims=True)
    return xf / np.where(norms > 0, norms, 1.0).astype(np.float32)


def pairwise_keys(a: np.ndarray, b: np.ndarray, metric: str) -> np.ndarray:
    """Ordering keys between every row of ``a`` and every row of ``b`` (float32, shape (len(a), len(b)))."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    dots = a @ b.T
    if metric == "ip":
        return -dots
    d = np.einsum("ij,ij->i", a, a)[:, None] + np.einsum("ij,ij->i", b, b)[None, :] - 2.0 * dots
    return np.maximum(d, 0.0, out=d)


def row_keys(a: np.ndarray, b: np.ndarray, metric: str) -> np.ndarray:
    """Ordering key between row i of ``a`` and row i of ``b`` (exact, for checks and evaluation)."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    if metric == "ip":
        return -np.einsum("...j,...j->...", a, b)
    diff = a - b
    return np.einsum("...j,...j->...", diff, diff)
