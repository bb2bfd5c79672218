"""Recall-targeted builds: estimate recall@10 on a fixed sample of rows, and decide when a descent is done.

A descent (GNND of a shard, GGM of a pair) is given a *probe*: a few hundred rows of its own and their exact
top-10 among the descent's rows. After each iteration the probe's rows are read off the lists and compared;
the descent stops once the lower end of the estimate's interval reaches the target, and widens its lists
(raising p with them) when progress stalls below it. The same estimate, with a larger sample and exact
top-10 over the whole input, is what a build records in its manifest.

Recall@10 per row = |graph top-10 ∩ exact top-10| / 10, self excluded, ties counted: a graph neighbour whose
key is no larger than the exact 10th key is a hit even where the exact list chose another row at that key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from bigknn.graph import EMPTY

RECALL_AT = 10  # the recall the target and every estimate speak of: recall@10 (or @k where k < 10)
PROBE_ROWS = 1000  # rows of a descent's probe: an interval of about +-0.002 at recall 0.99
ESTIMATE_ROWS = 2000  # rows of a build's recorded estimate (exact top-10 over the whole input)
Z = 1.96  # two-sided 95 % interval
TIE_RTOL = 1e-5  # relative slack on the 10th key: equal distances differ in float32 rounding
STALL_ITERS = 3  # progress is judged over this many iterations:
STALL_GAIN = 0.002  # a gain below this is a stall,
STALL_HORIZON = 10  # and so is a pace that would need more than this many such spans to close the gap
MAX_WIDTH = 128  # widest list a descent widens to (the CUDA kernels' MAX_K)
WIDEN_STEP = 32  # lists grow by this many entries at a stall


@dataclass(frozen=True)
class Estimate:
    """Mean recall@10 over ``rows`` sampled rows, with its 95 % interval [low, high]."""

    recall: float
    low: float
    high: float
    rows: int

    def to_dict(self) -> dict:
        return {key: (round(v, 5) if isinstance(v, float) else v) for key, v in asdict(self).items()}


def estimate(got_ids: np.ndarray, got_keys: np.ndarray, truth_ids: np.ndarray, kth_key: np.ndarray) -> Estimate:
    """Recall@m of ``got`` (rows, >= m) against ``truth_ids`` (rows, m), ties by ``kth_key`` (rows,)."""
    m = truth_ids.shape[1]
    ids = np.asarray(got_ids)[:, :m]
    keys = np.asarray(got_keys)[:, :m]
    in_truth = (ids[:, :, None] == truth_ids[:, None, :]).any(axis=2)
    slack = TIE_RTOL * np.maximum(1.0, np.abs(kth_key))
    tie = keys <= (kth_key + slack)[:, None]
    per_row = ((in_truth | tie) & (ids != EMPTY)).sum(axis=1) / m
    return interval(per_row)


def interval(per_row: np.ndarray) -> Estimate:
    """Mean and 95 % normal interval of per-row recalls."""
    n = len(per_row)
    mean = float(per_row.mean()) if n else 0.0
    half = Z * float(per_row.std(ddof=1)) / float(np.sqrt(n)) if n > 1 else 1.0
    return Estimate(mean, max(0.0, mean - half), min(1.0, mean + half), n)


@dataclass
class Probe:
    """A descent's sample: local ``rows``, their exact top-m local ids and the m-th key of each."""

    rows: np.ndarray
    truth_ids: np.ndarray
    kth_key: np.ndarray

    def measure(self, row_ids: np.ndarray, row_keys: np.ndarray) -> Estimate:
        """The estimate from the probe rows' current lists (``row_ids``/``row_keys``: (len(rows), W))."""
        return estimate(row_ids, row_keys, self.truth_ids, self.kth_key)


ExactFn = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]  # (queries, m) -> exact (ids, keys)


def make_probe(n: int, width: int, exact: ExactFn, rng: np.random.Generator, size: int = PROBE_ROWS) -> Probe:
    """Draw ``size`` of ``n`` rows and find their exact top-min(10, width) among the n rows with ``exact``
    (the backend's exact k-NN over the descent's own vectors; self comes back first). The lists' width, not
    the user's k: later merges start from these lists, so they must be right beyond the first k."""
    rows = np.sort(rng.choice(n, size=min(size, n), replace=False))
    m = min(RECALL_AT, width, n - 1)
    ids, keys = exact(rows, m + 1)
    ids, keys = _without_self(np.asarray(ids), np.asarray(keys), rows, m)
    return Probe(rows, ids, keys[:, -1].copy())


def _without_self(ids: np.ndarray, keys: np.ndarray, rows: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Drop each row's own id (or, where a duplicate pushed it out, the last entry); keep m."""
    is_self = ids == rows[:, None]
    drop = np.where(is_self.any(axis=1), is_self.argmax(axis=1), ids.shape[1] - 1)
    keep = np.ones(ids.shape, bool)
    keep[np.arange(len(rows)), drop] = False
    return ids[keep].reshape(len(rows), -1)[:, :m], keys[keep].reshape(len(rows), -1)[:, :m]


class Stopper:
    """What a recall-targeted descent does after each iteration: ``"stop"``, ``"go"`` on, or ``"widen"``.

    Stops when the estimate's lower bound reaches ``target``; widens the lists (up to ``MAX_WIDTH``) when the
    last ``STALL_ITERS`` iterations gained less than ``STALL_GAIN``, or so little that closing the gap at that
    pace would take more than ``STALL_HORIZON`` such spans; stops when it can widen no more. The reason is
    kept for the report."""

    def __init__(self, target: float, width: int):
        self.target = target
        self.width = width
        self.history: list[float] = []
        self.reason = "iteration cap"
        self.last: Estimate | None = None
        self.widened = 0

    def after(self, est: Estimate) -> str:
        self.last = est
        self.history.append(est.recall)
        if est.low >= self.target:
            self.reason = "target met"
            return "stop"
        h = self.history
        gain = h[-1] - h[-1 - STALL_ITERS] if len(h) > STALL_ITERS else None
        if gain is not None and (gain < STALL_GAIN or gain * STALL_HORIZON < self.target - h[-1]):
            if self.width >= MAX_WIDTH:
                self.reason = "stalled at the widest lists"
                return "stop"
            self.width = min(MAX_WIDTH, self.width + WIDEN_STEP)
            self.history = []
            self.widened += 1
            return "widen"
        return "go"

    def report(self) -> dict:
        return {"target": self.target, "stop": self.reason, "width": self.width, "widened": self.widened,
                "estimate": self.last.to_dict() if self.last else None}
