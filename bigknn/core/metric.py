"""Distance metrics: one ``Metric`` object per metric, the one place that says how it is computed, stored and
reported.

Graphs store the metric's *ordering key*, smaller is closer: squared L2 for ``l2`` and ``-dot`` for ``ip``.
``cosine`` is ``ip`` on rows normalised when they enter the store. The Metric object itself travels through the
backend contract (bigknn/backends/base.py), and backends ask it only ``dot_keys`` (which keys to compute) and
``kernel_id`` (the CUDA kernels' compile-time ``METRIC``, common.cuh), never its name: cosine computes as ip.
The user-facing names stay in the CLI, the API and the manifest. The functions below the class are the call
sites' shorthand for ``metric(name).<method>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

HALF_RANGE = 2.0 ** 14  # largest magnitude of rows scaled for half precision (half's largest finite: 65504)


@dataclass(frozen=True)
class Metric:
    """``name``: what users ask for. ``kernel``: the metric whose keys are computed (``l2`` or ``ip``; backends
    ask ``dot_keys``). ``kernel_id``: the CUDA kernels' compile-time METRIC (common.cuh: 0 squared L2, 1 -dot).
    ``normalised``: rows are scaled to unit length when they enter the store (and queries when they are
    searched)."""

    name: str
    kernel: str
    kernel_id: int
    normalised: bool = False

    @property
    def dot_keys(self) -> bool:
        """Whether keys are -dot (else squared L2)."""
        return self.kernel == "ip"

    def stored_dtype(self, input_dtype: np.dtype) -> np.dtype:
        """Dtype of the vectors kept in the store: normalised rows need floats."""
        return np.dtype(np.float32) if self.normalised else np.dtype(input_dtype)

    def prepare(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows as they are stored: normalised to unit length where the metric says so (zero rows stay zero).
        ``out``: an array of x's shape to write them into (no temporary of the result: an in-memory build
        prepares a whole array block by block into its stored copy)."""
        if not self.normalised:
            if out is None:
                return x
            out[...] = x
            return out
        xf = np.asarray(x, dtype=np.float32)
        norms = np.sqrt(np.einsum("ij,ij->i", xf, xf))[:, None]  # no (rows, dim) temporary, as linalg.norm makes
        return np.divide(xf, np.where(norms > 0, norms, 1.0).astype(np.float32), out=out)

    def pairwise_keys(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Ordering keys between every row of ``a`` and every row of ``b`` (float32, (len(a), len(b)))."""
        a = np.asarray(a, dtype=np.float32)
        b = np.asarray(b, dtype=np.float32)
        dots = a @ b.T
        if self.dot_keys:
            return -dots
        d = np.einsum("ij,ij->i", a, a)[:, None] + np.einsum("ij,ij->i", b, b)[None, :] - 2.0 * dots
        return np.maximum(d, 0.0, out=d)

    def row_keys(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Ordering key between row i of ``a`` and row i of ``b`` (exact, for checks and evaluation)."""
        a = np.asarray(a, dtype=np.float32)
        b = np.asarray(b, dtype=np.float32)
        if self.dot_keys:
            return -np.einsum("...j,...j->...", a, b)
        diff = a - b
        return np.einsum("...j,...j->...", diff, diff)

    def distance(self, keys: np.ndarray) -> np.ndarray:
        """Stored ordering keys -> the distances users get, ascending like the keys.

        ``l2``: Euclidean distance. ``cosine``: 1 - cos, clipped at 0 (float rounding of identical directions
        must not give the small negatives that scikit-learn refuses in a precomputed graph). ``ip``: 1 - x.y,
        the inner-product distance of hnswlib: ascending as the inner product descends, the cosine distance on
        unit-length rows, and negative where x.y > 1, i.e. on rows longer than 1 (normalise them, or use
        ``cosine``, for tools that need non-negative distances).
        """
        keys = np.asarray(keys, dtype=np.float32)
        if not self.dot_keys:
            return np.sqrt(np.maximum(keys, 0.0))
        return np.maximum(1.0 + keys, 0.0) if self.normalised else 1.0 + keys

    def key_at_most(self, max_distance: float) -> np.float32:
        """The largest float32 key whose ``distance`` is <= ``max_distance``, compared exactly as
        ``distance(keys) <= max_distance`` compares: for every key but NaN, ``key <= bound`` iff its distance
        is at most ``max_distance``, so a threshold is one comparison per stored key instead of a distance
        each. NaN when no key qualifies (every comparison with it is false).

        ``distance`` is non-decreasing in the key and NaN-free over [-inf, inf], so a bisection over the float32
        values in order (their bit patterns, ``_ordered``) finds the boundary that float rounding puts where it
        does: sqrt's, 1 + key's, and cosine's clip at 0 (at max_distance 0 every key <= -1 qualifies)."""
        def within(o: int) -> bool:
            with np.errstate(over="ignore"):  # a threshold past float32's range is infinity there
                return bool((self.distance(np.array([_from_ordered(o)], np.float32)) <= max_distance)[0])

        lo, hi = _ordered(-np.inf), _ordered(np.inf)
        if not within(lo):
            return np.float32(np.nan)
        if within(hi):
            return np.float32(np.inf)
        while hi - lo > 1:  # within(lo) and not within(hi)
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if within(mid) else (lo, mid)
        return _from_ordered(lo)


def _ordered(x: float) -> int:
    """A float32 as an integer in the order of the floats (-0.0 and 0.0 both 0), for bisection."""
    bits = int(np.array([x], np.float32).view(np.uint32)[0])
    return -(bits & 0x7FFFFFFF) if bits >> 31 else bits


def _from_ordered(o: int) -> np.float32:
    bits = (0x80000000 | -o) if o < 0 else o
    return np.array([bits], np.uint32).view(np.float32)[0]


L2 = Metric("l2", "l2", 0)
IP = Metric("ip", "ip", 1)
COSINE = Metric("cosine", "ip", 1, normalised=True)
BY_NAME = {m.name: m for m in (L2, IP, COSINE)}
METRICS = tuple(BY_NAME)
# the names pynndescent, scikit-learn, Faiss and cuVS users type, and the metric each is here
ALIASES = {"euclidean": "l2", "sqeuclidean": "l2", "inner_product": "ip", "dot": "ip"}
METRIC_NAMES = METRICS + tuple(ALIASES)
METRIC_HELP = ("l2 (or euclidean, sqeuclidean): nearest by Euclidean distance, and the distances given are "
               "Euclidean, not squared as Faiss and cuVS give them (square them to compare); ip (or "
               "inner_product, dot): largest inner product first, distance 1 - x.y; cosine: distance 1 - cos.")


def canonical_metric(name: str) -> str:
    """The metric a user's name stands for: one of METRICS, or one of its ALIASES.

    >>> canonical_metric("euclidean"), canonical_metric("dot"), canonical_metric("cosine")
    ('l2', 'ip', 'cosine')
    """
    metric = ALIASES.get(name, name)
    if metric not in METRICS:
        raise ValueError(f"unknown metric {name!r}; choose one of {', '.join(METRIC_NAMES)}")
    return metric


def metric(name: str) -> Metric:
    """The Metric called ``name``; ValueError naming the choices for any other."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown metric {name!r}; choose one of {', '.join(METRICS)}") from None


def stored_dtype(name: str, input_dtype: np.dtype) -> np.dtype:
    return metric(name).stored_dtype(input_dtype)


def prepare_rows(x: np.ndarray, name: str) -> np.ndarray:
    return metric(name).prepare(x)


def pairwise_keys(a: np.ndarray, b: np.ndarray, name: str) -> np.ndarray:
    return metric(name).pairwise_keys(a, b)


def row_keys(a: np.ndarray, b: np.ndarray, name: str) -> np.ndarray:
    return metric(name).row_keys(a, b)


def user_distance(keys: np.ndarray, name: str) -> np.ndarray:
    return metric(name).distance(keys)


def half_scale(amax: float) -> float:
    """The power of two that brings rows whose largest magnitude is ``amax`` into half's range (HALF_RANGE):
    keys of scaled rows (and queries) are the keys times its square, in the same order."""
    return 2.0 ** math.floor(math.log2(HALF_RANGE / amax)) if amax > 0 else 1.0
