"""Exact top-k of wide rows with most keys ruled out in a few dimensions (exact.exact_knn, compiled).

A key is never below its bound in the rows' principal subspace: for l2, |q - t|^2 = |P(q - t)|^2 + |R(q - t)|^2 and
|R(q - t)| >= | |R(q - m)| - |R(t - m)| | (P the projection on the subspace, R = 1 - P, m the rows' mean); for inner
products, q.t = Pq.Pt + Rq.Rt <= Pq.Pt + |Rq||Rt|. The bounds of a tile come from one BLAS product in
``BOUND_DIMS`` dimensions; only the columns whose bound beats a row's running k-th key get their key in full.
Where the data's variance lies mostly in a few directions (embeddings of low intrinsic dimension) that is a small
share of the columns; where it does not, ``worth_it`` hands the tile back to the full product. The result is the
same top-k as the full product's, up to keys within float32 rounding of the k-th (which the product's own rounding
decides as well).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from bigknn.backends.cpu.kernels import _sift_in
from bigknn.backends.cpu.keyblock import FAST, dots4
from bigknn.backends.cpu.keypass import _tile_key

BOUND_DIMS = 64  # dimensions of the subspace the bounds are computed in
MIN_DIM = 4 * BOUND_DIMS  # narrower rows: the full product costs little more than the bounds
FILL_COLS = 1024  # the first tile, whose keys are all computed (the lists fill), is this narrow where bounds are used
PILOT_ROWS = 16  # queries that try the bounds first: where they do not pay, the rest of the batch takes the product
FIT_ROWS = 4096  # rows the subspace is fitted on,
FIT_EXTRA = 16  # with this many directions beyond BOUND_DIMS iterated,
FIT_ITERS = 2  # this many times
SLACK = 1e-5  # a bound is lowered by this share of the rows' squared norms about the mean and the origin (a key's
# own float32 rounding is relative to the latter): a key is skipped only where it could not beat the k-th by more
# than that rounding
PASS_COLS = 32  # bounded_merge lists a row's columns that pass their bound this many at a time (the k-th tightens
# between runs, so few keys are computed against a stale one)
FULL_KEY_COST = 20.0  # a key computed alone (its column gathered) costs about this many times its share of a BLAS
# product (2 cores, docs/perf-notes.md, session 41); bounds pay while fewer than (1 - BOUND_DIMS / d) / FULL_KEY_COST
# of the pairs get their full key in vain


@dataclass
class Subspace:
    """The principal directions of a set of rows (``basis``: d x BOUND_DIMS, orthonormal) about ``mean``, and the
    share of the fitted rows' variance about it that they hold (``kept``)."""

    basis: np.ndarray
    mean: np.ndarray
    kept: float

    @classmethod
    def fit(cls, rows: np.ndarray, is_l2: bool) -> "Subspace":
        """Fitted on up to FIT_ROWS of ``rows`` (spread over them) by subspace iteration on their covariance (any
        orthonormal basis gives valid bounds; the leading directions give tight ones). Inner products are bounded
        about the origin (the bound needs Pq.Pt + Rq.Rt = q.t), l2 keys about the rows' mean."""
        sample = rows[np.linspace(0, len(rows) - 1, min(len(rows), FIT_ROWS)).astype(np.int64)]
        mean = sample.mean(axis=0) if is_l2 else np.zeros(rows.shape[1], np.float32)
        centred = sample - mean
        cov = centred.T @ centred
        start = np.random.default_rng(0).standard_normal((rows.shape[1], BOUND_DIMS + FIT_EXTRA)).astype(np.float32)
        q = np.linalg.qr(cov @ start)[0]
        for _ in range(FIT_ITERS):
            q = np.linalg.qr(cov @ q)[0]
        values, vectors = np.linalg.eigh(q.T @ cov @ q)  # the iterated directions, leading ones first
        basis = np.ascontiguousarray(q @ vectors[:, ::-1][:, :BOUND_DIMS], dtype=np.float32)
        total = float(np.trace(cov))
        kept = float(values[::-1][:BOUND_DIMS].sum()) / total if total > 0 else 0.0
        return cls(basis, mean.astype(np.float32), kept)

    def project(self, rows: np.ndarray, sq: np.ndarray) -> "Projected":
        """Each row's coordinates in the subspace with the norm of the rest appended (so that one product gives
        Pq.Pt + |Rq||Rt|), and its squared norm less the slack (``sq``: the rows' squared norms, as the keys
        have them)."""
        centred = rows - self.mean
        inside = np.ascontiguousarray(centred @ self.basis)
        norm2 = np.einsum("ij,ij->i", centred, centred)
        rest = np.sqrt(np.maximum(norm2 - np.einsum("ij,ij->i", inside, inside), 0.0))
        coords = np.concatenate([inside, rest[:, None].astype(np.float32)], axis=1)
        slack = SLACK * (norm2 + sq)
        return Projected(coords, (norm2 - slack).astype(np.float32), slack.astype(np.float32))


@dataclass
class Projected:
    """A bound on the key of q and t: l2 ``norm2[q] + norm2[t] - 2 coords[q].coords[t]`` (|q - m|^2 and |t - m|^2
    less the slack; the last coordinate makes the product Pq.Pt + |Rq||Rt|), inner product ``-coords[q].coords[t]
    - slack[q] - slack[t]``."""

    coords: np.ndarray  # (rows, BOUND_DIMS + 1)
    norm2: np.ndarray  # |x - m|^2 less the slack
    slack: np.ndarray  # SLACK (|x - m|^2 + |x|^2)


def wide_enough(dim: int) -> bool:
    """Whether rows of ``dim`` dimensions are bounded at all."""
    return dim >= MIN_DIM


def worth_it(wasted: int, pairs: int, dim: int) -> bool:
    """Whether bounds that let ``wasted`` keys of ``pairs`` row-column pairs through in vain paid for themselves."""
    return wasted * FULL_KEY_COST < pairs * (1.0 - BOUND_DIMS / dim)


@njit(cache=True, parallel=True, fastmath=FAST)
def bounded_merge(bound_dots, q_norm2, q_slack, t_norm2, t_slack, q, tile, qsq, tsq, first_id, best_ids, best_d,
                  is_l2):
    """keypass.tile_merge with each column's key computed only where its bound beats the row's k-th key
    (``bound_dots``: the rows' and the tile's Projected coordinates multiplied). The columns of each run of
    PASS_COLS that pass are listed first and their keys computed four per pass over the row (``_dots4``); each
    then enters in column order, against the k-th as it is then (what offering them one by one gives). Returns
    how many keys were computed in full and did not enter: the bounds' waste (the keys that enter are computed
    either way, and early tiles, against lists of few columns' best, have many)."""
    nq, nt = bound_dots.shape
    k = best_ids.shape[1]
    wasted = np.zeros(nq, np.int64)
    for r in prange(nq):
        ids, d = best_ids[r], best_d[r]
        cols = np.empty(PASS_COLS, np.int32)
        dots = np.empty(4, np.float32)
        for j0 in range(0, nt, PASS_COLS):
            m = 0
            for j in range(j0, min(nt, j0 + PASS_COLS)):
                if is_l2:
                    bound = (q_norm2[r] + t_norm2[j]) - np.float32(2.0) * bound_dots[r, j]
                else:
                    bound = -bound_dots[r, j] - (q_slack[r] + t_slack[j])
                if bound < d[k - 1]:
                    cols[m] = j
                    m += 1
            for b in range(0, m, 4):
                n4 = min(4, m - b)
                _dots4(q, r, tile, cols, b, n4, dots)
                for u in range(n4):
                    j = cols[b + u]
                    key = _tile_key(dots[u], qsq[r], tsq[j], is_l2)
                    if key < d[k - 1]:
                        _sift_in(ids, d, k - 1, first_id + j, key)
                    else:
                        wasted[r] += 1
    return wasted.sum()


@njit(cache=True, fastmath=FAST, inline="always")
def _dots4(q, r, tile, cols, at, n, out):
    """out[:n] = q[r] . tile[cols[at + u]] for u < n <= 4, in one pass over q[r] (keyblock.dots4)."""
    last = at + n - 1  # fewer than four: the last column again, its extra dots unused
    out[0], out[1], out[2], out[3] = dots4(q, r, tile, cols[at], cols[min(at + 1, last)], cols[min(at + 2, last)],
                                           cols[min(at + 3, last)])
