"""Recall-targeted builds: estimate recall@10 on a fixed sample of rows, and decide when a descent is done.

A descent (GNND of a shard, GGM of a pair) is given a *probe*: a few hundred rows of its own and their exact
top-10 among the descent's rows. After each iteration the probe's rows are read off the lists and compared;
the descent stops once the lower end of the estimate's interval reaches the target, and widens its lists
(raising p with them) when progress stalls below it. The same estimate, with exact top-10 over the whole input
on other rows than any probe's (bigknn/engine/recall_sample.py), is what a build records in its manifest: rows
that decided when to stop would report the luck that stopped it.

Recall@10 per row = |graph top-10 ∩ exact top-10| / 10, self excluded, ties counted: a graph neighbour whose
key is no larger than the exact 10th key is a hit even where the exact list chose another row at that key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from bigknn.core.knn_graph import EMPTY, id_dtype, merge_lists

RECALL_AT = 10  # the recall the target and every estimate speak of: recall@10 (or @k where k < 10)
PROBE_ROWS = 1000  # rows of a descent's probe: an interval of about +-0.002 at recall 0.99
ESTIMATE_ROWS = 2000  # rows of a build's recorded estimate (exact top-10 over the whole input), never probed
STOP_Z = 1.96  # a descent stops at the lower end of its probe's two-sided 95 % interval
REPORT_Z = 2.576  # a build records a two-sided 99 % interval: the promise is that it covers the truth in >= 90 %
# of any family's builds, and 20 builds of a 95 % interval fall under 18 covered one time in 13 by chance alone
TIE_RTOL = 1e-5  # relative slack on the k-th key: equal distances differ in float32 rounding
STALL_ITERS = 3  # progress is judged over this many iterations:
STALL_GAIN = 0.002  # a gain below this is a stall,
STALL_HORIZON = 10  # and so is a pace that would need more than this many such spans to close the gap,
RISING = 1.25  # unless the last iteration gained this many times the span's average (the climb speeds up)
MAX_WIDTH = 128  # widest list a descent widens to (the CUDA kernels' MAX_K)
WIDEN_STEP = 32  # lists grow by this many entries at a stall
EXACT_AFFORD = 4.0  # a descent that fell short is replaced by the exact answer only if that costs at most this
# many times the descent so far: a stalled merge of two 17M-row shards would otherwise wait ~1000 s for it


@dataclass(frozen=True)
class Estimate:
    """Mean recall@10 over ``rows`` sampled rows, with an interval [low, high] (95 % for a descent's probe, 99 %
    for a build's recorded estimate)."""

    recall: float
    low: float
    high: float
    rows: int

    def to_dict(self) -> dict:
        return {key: (round(v, 5) if isinstance(v, float) else v) for key, v in asdict(self).items()}


def estimate(got_ids: np.ndarray, got_keys: np.ndarray, truth_ids: np.ndarray, kth_key: np.ndarray) -> Estimate:
    """Recall@m of ``got`` (rows, >= m) against ``truth_ids`` (rows, m), ties by ``kth_key`` (rows,)."""
    return interval(row_recalls(got_ids, got_keys, truth_ids, kth_key))


def within_kth(keys: np.ndarray, kth_key: np.ndarray) -> np.ndarray:
    """Whether each of a row's ``keys`` (rows, m) is as near as the row's ``kth_key`` (rows,), the true k-th
    neighbour's, with TIE_RTOL to spare: a row at the same distance counts as found. The one test of a hit, for
    the estimates here, ``eval recall`` and search recall."""
    return keys <= (kth_key + TIE_RTOL * np.maximum(1.0, np.abs(kth_key)))[:, None]


def row_recalls(got_ids: np.ndarray, got_keys: np.ndarray, truth_ids: np.ndarray, kth_key: np.ndarray) -> np.ndarray:
    """Each row's recall@m (``estimate``'s terms)."""
    m = truth_ids.shape[1]
    ids = np.asarray(got_ids)[:, :m]
    keys = np.asarray(got_keys)[:, :m]
    in_truth = (ids[:, :, None] == truth_ids[:, None, :]).any(axis=2)
    tie = within_kth(keys, kth_key)
    return ((in_truth | tie) & (ids != EMPTY)).sum(axis=1) / m


def held_out_estimate(sampled: np.ndarray, known: np.ndarray, population: int) -> Estimate:
    """Mean recall over ``population`` rows from the recalls of ``known`` rows (every one measured: the rows a
    descent stopped on) and of ``sampled`` rows (a uniform sample of all the others), with its 99 % interval.
    The known rows count as what they are, not as a sample: a descent stopped when they looked good, so they
    stand for nothing but themselves; the sampled rows stand for the rest, with the finite-population
    correction (all of the rest sampled: no error left). Where the known rows are a sizeable share of the
    rows (small inputs) an estimate from the sampled rows alone would fall below the truth."""
    rest = population - len(known)
    n = len(sampled)
    if n >= rest:  # every row measured
        mean = float(np.concatenate([known, sampled]).mean()) if population else 0.0
        return Estimate(mean, mean, mean, n)
    mean = (float(known.sum()) + rest * float(sampled.mean())) / population
    half = REPORT_Z * standard_error(sampled, n / rest) * rest / population
    return Estimate(mean, max(0.0, mean - half), min(1.0, mean + half), n)


def new_entry_recall(got_ids: np.ndarray, got_keys: np.ndarray, truth_ids: np.ndarray, kth_key: np.ndarray,
                     to_find: np.ndarray) -> Estimate:
    """The share of the truth entries marked ``to_find`` that ``got`` holds, per row that has any (a row's
    misses may be made good by ties: other rows at the m-th key). Over a whole build every entry of a final
    list is found by exactly one descent (GNND of its shard, or the merge with its shard), so holding each
    descent to the target on what it had to find holds the build to it; measured over all entries, a late
    merge, whose truth is mostly its old list, would stop with much of the little it had to find missed."""
    m = truth_ids.shape[1]
    ids, keys = np.asarray(got_ids)[:, :m], np.asarray(got_keys)[:, :m]
    found = (truth_ids[:, :, None] == ids[:, None, :]).any(axis=2)
    in_truth = (ids[:, :, None] == truth_ids[:, None, :]).any(axis=2)
    ties = (~in_truth & (ids != EMPTY) & within_kth(keys, kth_key)).sum(axis=1)
    count = to_find.sum(axis=1)
    hits = (to_find & found).sum(axis=1) + np.minimum(ties, (to_find & ~found).sum(axis=1))
    has = count > 0
    if not has.any():  # nothing to find: the old lists are already the answer
        return Estimate(1.0, 1.0, 1.0, 0)
    return interval(hits[has] / count[has])


def interval(per_row: np.ndarray) -> Estimate:
    """Mean and 95 % normal interval of per-row recalls."""
    n = len(per_row)
    mean = float(per_row.mean()) if n else 0.0
    half = STOP_Z * standard_error(per_row)
    return Estimate(mean, max(0.0, mean - half), min(1.0, mean + half), n)


def standard_error(per_row: np.ndarray, sampled_share: float = 0.0) -> float:
    """The standard error of the mean of per-row recalls@RECALL_AT drawn from a population of which they are
    ``sampled_share`` (finite-population correction), at least that of their entries counted as coin flips
    with two hits and two misses added (Agresti-Coull, uncorrected): a sample without a miss has no spread,
    and a zero-width interval at 1.0 excludes a truth of 0.9999 (7 in 40 small builds until this floor)."""
    n = len(per_row)
    if n < 2:
        return 1.0
    entries = n * RECALL_AT
    p = (float(per_row.sum()) * RECALL_AT + 2.0) / (entries + 4.0)
    spread = float(per_row.std(ddof=1)) / float(np.sqrt(n)) * float(np.sqrt(max(0.0, 1.0 - sampled_share)))
    return max(spread, float(np.sqrt(p * (1.0 - p) / entries)))


@dataclass
class Probe:
    """A descent's sample: local ``rows``, their exact top-m ids and the m-th key of each.

    A merge's probe also holds what its descent cannot see: the probe rows' old lists (``outside``: global
    ids and keys), and the offsets that turn the descent's local ids global (``na``, ``offsets``): a row's
    answer after the merge is the best of its old list and the rows of the other shard, so that is both the
    truth and what the measurement merges the descent's lists with."""

    rows: np.ndarray
    truth_ids: np.ndarray
    kth_key: np.ndarray
    outside: tuple[np.ndarray, np.ndarray] | None = None
    na: int = 0
    offsets: tuple[int, int] = (0, 0)
    exact_pace: float | None = None  # seconds per (row, candidate) key of the search that found the truth

    def measure(self, row_ids: np.ndarray, row_keys: np.ndarray) -> Estimate:
        """The estimate from the probe rows' current lists (``row_ids``/``row_keys``: (len(rows), W))."""
        if self.outside is None:
            return estimate(row_ids, row_keys, self.truth_ids, self.kth_key)
        a_off, b_off = self.offsets
        local = np.asarray(row_ids).astype(np.int64)
        glob = np.where(local < self.na, local + a_off, local - self.na + b_off)
        glob = np.where(local == EMPTY, EMPTY, glob)
        ids, keys = merge_lists(np.concatenate([glob, self.outside[0]], axis=1),
                                np.concatenate([np.asarray(row_keys), self.outside[1]], axis=1),
                                self.truth_ids.shape[1])
        return new_entry_recall(ids, keys, self.truth_ids, self.kth_key, self.to_find)

    @property
    def to_find(self) -> np.ndarray:
        """(rows, m) True where a merge probe's truth entry lies in the row's other shard: what the merge must
        find (its other entries were in the old list already)."""
        return ~(self.truth_ids[:, :, None] == self.outside[0][:, None, :]).any(axis=2) & (self.truth_ids != EMPTY)


ExactFn = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]  # (queries, m) -> exact (ids, keys)


def make_probe(n: int, width: int, exact: ExactFn, rng: np.random.Generator, size: int = PROBE_ROWS) -> Probe:
    """Draw ``size`` of ``n`` rows and find their exact top-min(10, width) among the n rows with ``exact``
    (the backend's exact k-NN over the descent's own vectors; self comes back first). The lists' width, not
    the user's k: later merges start from these lists, so they must be right beyond the first k."""
    rows = np.sort(rng.choice(n, size=min(size, n), replace=False))
    m = probe_m(width, n)
    ids, keys = exact(rows, m + 1)
    ids, keys = without_self(np.asarray(ids), np.asarray(keys), rows, m)
    return Probe(rows, ids, keys[:, -1].copy())


def probe_m(width: int, n: int) -> int:
    """The neighbours per row a GNND's probe holds, over ``n`` rows with lists ``width`` wide (make_probe)."""
    return min(RECALL_AT, width, n - 1)


PairExactFn = Callable[[np.ndarray, int, bool], tuple[np.ndarray, np.ndarray]]
# (local rows of [a | b], m, whether the other shard is b) -> exact top-m among the other shard's rows
# (global ids, keys)


def make_merge_probe(a, b, width: int, exact: PairExactFn, rng: np.random.Generator,
                     size: int = PROBE_ROWS) -> Probe:
    """The probe of a merge of shards ``a`` and ``b`` (ShardParts; local rows [a | b]): each probe row's truth
    is the best m of its old list and the exact m nearest rows of the other shard. Rows of the same shard
    are never compared in a merge (GNND paper §5.1): those the old list no longer holds were pushed out by
    closer rows of shards merged before, and are no loss.

    Half the probe is drawn from each shard (all of a shard smaller than its half): a probe in proportion to
    the sizes holds few rows of an ingested batch beside a full shard, and the old rows, converged already,
    stopped the merge while the batch's rows were still far from their neighbours (new-row recall 0.957 on a
    k-means store, docs/design.md)."""
    na, nb = len(a.vectors), len(b.vectors)
    rows = np.sort(np.concatenate([rng.choice(n, size=take, replace=False) + first for n, take, first
                                   in zip((na, nb), _halves(na, nb, size), (0, na))]))
    m = min(RECALL_AT, width)
    in_a = rows < na
    gid = np.result_type(a.graph.ids, b.graph.ids, id_dtype(max(a.offset + na, b.offset + nb)))  # store-wide ids
    out_ids = np.full((len(rows), max(a.graph.k, b.graph.k)), EMPTY, gid)
    out_keys = np.full(out_ids.shape, np.inf, np.float32)
    ex_ids = np.full((len(rows), m), EMPTY, gid)
    ex_keys = np.full((len(rows), m), np.inf, np.float32)
    for mine, own, other_rows, first in ((in_a, a, nb, 0), (~in_a, b, na, na)):
        if not mine.any():
            continue
        local = rows[mine]
        out_ids[mine, :own.graph.k] = own.graph.ids[local - first]
        out_keys[mine, :own.graph.k] = own.graph.dists[local - first]
        ids, keys = exact(local, min(m, other_rows), own is a)
        ex_ids[mine, :ids.shape[1]], ex_keys[mine, :ids.shape[1]] = ids, keys
    truth, keys = merge_lists(np.concatenate([out_ids, ex_ids], axis=1),
                              np.concatenate([out_keys, ex_keys], axis=1), m)
    return Probe(rows, truth, keys[:, -1].copy(), (out_ids, out_keys), na, (a.offset, b.offset))


def _halves(na: int, nb: int, size: int) -> tuple[int, int]:
    """Probe rows from each of two shards: half of ``size`` each, a smaller shard's unused share to the other."""
    take_a = min(na, max(size // 2, size - nb))
    return take_a, min(nb, size - take_a)


def without_self(ids: np.ndarray, keys: np.ndarray, rows: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Drop each row's own id (or, where a duplicate pushed it out, the last entry); keep m."""
    is_self = ids == rows[:, None]
    drop = np.where(is_self.any(axis=1), is_self.argmax(axis=1), ids.shape[1] - 1)
    keep = np.ones(ids.shape, bool)
    keep[np.arange(len(rows)), drop] = False
    return ids[keep].reshape(len(rows), -1)[:, :m], keys[keep].reshape(len(rows), -1)[:, :m]


class Stopper:
    """What a recall-targeted descent does after each iteration: ``"stop"``, ``"go"`` on, or ``"widen"``.

    Stops when the estimate's lower bound reaches ``target``: the probe's rows are a sample, so its mean alone
    would stop, at the first iteration it crosses the target, on rows that happen to lie above the truth; the
    lower end of the 95 % interval (a one-sided 97.5 % bound) leaves that luck out. Widens the lists (up to
    ``MAX_WIDTH``) when the last ``STALL_ITERS`` iterations gained less than ``STALL_GAIN``, or so little that
    closing the gap at that pace would take more than ``STALL_HORIZON`` such spans while the pace is not
    rising; stops when it stalls and can widen no more, unless its slow pace still reaches the target within
    STALL_HORIZON spans. The reason is kept for the report.

    A large set's descent starts slowly and speeds up (50M rows: recall 0.07 after four iterations, still
    climbing faster each time): judging that start by its pace widened at once, and where the wider lists did
    not fit the GPU the descent stopped there (a one-shard build of 50M x 96 on an H200, 2026-11-28). So a pace
    that rises is never a stall, and lists that cannot be widened (``cannot_widen``) keep descending.

    A stall whose mean has reached the target but whose lower end has not widens like any other: stopping there
    (as builds did until 2026-11-28) left the truth below the target about half the time (held-out text: 0.987
    delivered for 0.99 asked, docs/perf-notes.md).
    """

    def __init__(self, target: float, width: int, exact_s: float | None = None):
        self.target = target
        self.width = width
        self.exact_s = exact_s  # predicted seconds of the exact answer the descent could give instead
        self.history: list[float] = []  # estimates since the last widening
        self.trace: list[float] = []  # every estimate, for the report
        self.reason = "iteration cap"
        self.last: Estimate | None = None
        self.widened = 0
        self.projected_s: float | None = None  # the rest of the descent, when that made the exact answer cheaper
        self.spent_s = 0.0  # seconds of the iterations so far
        self.max_width = MAX_WIDTH  # lowered by cannot_widen where the caller's memory ends sooner
        self._undo: tuple[int, list[float], bool] = (width, [], False)  # before the last widening (cannot_widen)
        self.limit = ""  # why the widest lists are narrower than MAX_WIDTH, if they are

    def after(self, est: Estimate, seconds: float = 0.0) -> str:
        """The action after an iteration that took ``seconds`` and left the probe at ``est``."""
        self.last = est
        self.spent_s += seconds
        self.history.append(est.recall)
        self.trace.append(round(est.recall, 4))
        if est.low >= self.target:
            self.reason = "target met"
            return "stop"
        if self._exact_is_cheaper(seconds):
            self.reason = "exact is cheaper"
            return "stop"
        h = self.history
        if len(h) <= STALL_ITERS:
            return "go"
        gain = h[-1] - h[-1 - STALL_ITERS]
        stalled = gain < STALL_GAIN
        rising = h[-1] - h[-2] > RISING * gain / STALL_ITERS  # the last step beat the span's average
        if not (stalled or (gain * STALL_HORIZON < self.target - h[-1] and not rising)):
            return "go"
        if self.width >= self.max_width:
            if not stalled or self._finishing(gain, est):  # climbing, and no wider lists to try: on at this width
                return "go"
            self.reason = self._stalled_at_widest()
            return "stop"
        self._undo = (self.width, self.history, stalled and not self._finishing(gain, est))
        self.width = min(self.max_width, self.width + WIDEN_STEP)
        self.history = []
        self.widened += 1
        return "widen"

    def cannot_widen(self, why: str) -> str:
        """The caller could not widen as ``after`` asked (``why``: the memory it lacks): the lists stay as they
        were, now the widest. The action instead: "stop" where the descent had stalled, else "go" on."""
        self.width, self.history, stalled = self._undo
        self.max_width = self.width
        self.widened -= 1
        self.limit = why
        if stalled:
            self.reason = self._stalled_at_widest()
            return "stop"
        return "go"

    def _finishing(self, gain: float, est: Estimate) -> bool:
        """Whether a pace under STALL_GAIN still reaches the target (its lower end) within STALL_HORIZON spans:
        near the end of a descent at the widest lists gains shrink to a few 1e-4 an iteration, and stopping
        there left the truth below the target (held-out text, 750K rows: 0.987 for 0.99, docs/perf-notes.md)."""
        return gain > 0 and gain * STALL_HORIZON >= self.target - est.low

    def _stalled_at_widest(self) -> str:
        """The stop reason of a stall at the widest lists, with why they are no wider where the caller said."""
        return "stalled at the widest lists" + (f" ({self.limit})" if self.limit else "")

    def start_wider(self, width: int) -> None:
        """The caller widened the lists before any stall (a hard set, known from its first estimate): judge
        progress from here, at ``width``; counted as a widening."""
        self.width = min(MAX_WIDTH, width)
        self.history = []
        self.widened += 1

    def _exact_is_cheaper(self, seconds: float) -> bool:
        """Whether the rest of the descent, at the pace of its last STALL_ITERS iterations and the cost of the
        last one, would take more than STALL_HORIZON iterations and longer than the exact answer
        (``exact_s``): rows too spread out for NN-Descent (iid-like, high intrinsic dimension) show a slow,
        steady climb from the start. A stalled pace is left to the widening rule: wider lists climb again,
        and their cost is not known yet."""
        h = self.history
        if self.exact_s is None or len(h) <= STALL_ITERS:
            return False
        pace = (h[-1] - h[-1 - STALL_ITERS]) / STALL_ITERS
        if pace < STALL_GAIN / STALL_ITERS:
            return False
        iters_left = (self.target - h[-1]) / pace
        projected = iters_left * seconds
        if iters_left <= STALL_HORIZON or projected <= self.exact_s:  # near its target: a descent, whatever
            return False  # the timings say (they are noisy at a few milliseconds)
        self.projected_s = projected
        return True

    def fell_short(self) -> bool:
        """Whether the caller should compute the exact answer instead: the descent ended below its target with
        no way forward (stalled at the widest lists, or out of iterations with its whole interval below the
        target) and the exact answer costs at most EXACT_AFFORD times the descent so far, or it is cheaper than
        the rest of the descent would be. Such rows are too spread out for NN-Descent (iid-like, high intrinsic
        dimension); where the exact answer is dear (large shards), the descent's lists are kept and the report
        says how far short they are."""
        if self.reason == "exact is cheaper":
            return True
        short = self.reason.startswith("stalled") or (
            self.reason == "iteration cap" and self.last is not None and self.last.high < self.target)
        return short and (self.exact_s is None or self.exact_s <= EXACT_AFFORD * self.spent_s)

    def exact_instead(self) -> None:
        """Record that the exact answer replaced the descent's (its recall is 1 by construction)."""
        got = self.last.recall if self.last else 0.0
        if self.reason == "exact is cheaper":
            self.reason = (f"exact graph: cheaper than the descent from {got:.3f} on (about {self.projected_s:.2f} s "
                           f"more at its pace, exact {self.exact_s:.2f} s)")
        else:
            why = "ran out of iterations" if self.reason == "iteration cap" else "stalled"
            self.reason = f"exact graph: the descent {why} at {got:.3f} with lists of {self.width}"
        rows = self.last.rows if self.last else 0
        self.last = Estimate(1.0, 1.0, 1.0, rows)

    def report(self) -> dict:
        return {"target": self.target, "stop": self.reason, "width": self.width, "widened": self.widened,
                "spent_s": round(self.spent_s, 3),
                "exact_s": None if self.exact_s is None else round(self.exact_s, 3),
                "estimate": self.last.to_dict() if self.last else None, "trace": self.trace}
