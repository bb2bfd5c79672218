"""The key micro-kernels every compiled CPU pass shares: one key, a row against a run of columns, and a block of
rows against columns (two rows by four columns per pass, the cross-match's and the RP-tree leaves' work).

These compute the descent's keys as descent._keys does: |a|^2 + |b|^2 - 2ab clamped at 0 (l2), or -ab (ip).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from bigknn.backends.cpu.prefetch import prefetch_rows

EMPTY = -1  # bigknn.core.knn_graph.EMPTY (numba needs it as a global constant)
FAST = {"reassoc", "contract"}  # let LLVM vectorise the dot products (sums reassociated); inf/nan stay exact.
# An inlined helper compiles under its CALLER's flags: every kernel that computes keys must carry FAST.


@njit(cache=True, fastmath=FAST, inline="always")
def _dot(x, a, b):
    s = np.float32(0.0)
    for j in range(x.shape[1]):
        s += x[a, j] * x[b, j]
    return s


@njit(cache=True, fastmath=FAST, inline="always")
def _key(x, sq, a, b, is_l2):
    """The descent's key: |a|^2 + |b|^2 - 2ab clamped at 0 (l2), or -ab (ip), as descent._keys."""
    d = _dot(x, a, b)
    if is_l2:
        k = sq[a] + sq[b] - np.float32(2.0) * d
        return k if k > 0 else np.float32(0.0)
    return -d


@njit(cache=True, fastmath=FAST, inline="always")
def _clamp(x, sq, a, b, d, is_l2):
    """_key from a computed dot product ``d``."""
    if is_l2:
        k = sq[a] + sq[b] - np.float32(2.0) * d
        return k if k > 0 else np.float32(0.0)
    return -d


@njit(cache=True, fastmath=FAST, inline="always")
def dots4(xa, a, xb, c0, c1, c2, c3):
    """xa[a] . xb[c] for four rows c of xb in one pass over xa[a], so each of its loads feeds four products (a
    single dot is bound by its two loads per multiply-add)."""
    s0 = np.float32(0.0)
    s1 = np.float32(0.0)
    s2 = np.float32(0.0)
    s3 = np.float32(0.0)
    for j in range(xa.shape[1]):
        v = xa[a, j]
        s0 += v * xb[c0, j]
        s1 += v * xb[c1, j]
        s2 += v * xb[c2, j]
        s3 += v * xb[c3, j]
    return s0, s1, s2, s3


@njit(cache=True, fastmath=FAST, inline="always")
def _keys_row(x, sq, a, cols, lo, hi, out, is_l2):
    """out[b] = _key(a, cols[b]) for b in [lo, hi), four columns per pass (dots4)."""
    b = lo
    while b + 4 <= hi:
        c0, c1, c2, c3 = cols[b], cols[b + 1], cols[b + 2], cols[b + 3]
        s0, s1, s2, s3 = dots4(x, a, x, c0, c1, c2, c3)
        out[b] = _clamp(x, sq, a, c0, s0, is_l2)
        out[b + 1] = _clamp(x, sq, a, c1, s1, is_l2)
        out[b + 2] = _clamp(x, sq, a, c2, s2, is_l2)
        out[b + 3] = _clamp(x, sq, a, c3, s3, is_l2)
        b += 4
    while b < hi:
        out[b] = _key(x, sq, a, cols[b], is_l2)
        b += 1


@njit(cache=True, fastmath=FAST, inline="always")
def _keys_2rows(x, sq, a0, a1, cols, lo, hi, out0, out1, is_l2):
    """_keys_row for rows a0 and a1 at once: two rows by four columns per pass, so each load feeds 8/6
    products instead of 4/5 (eight accumulators and six loads still fit AVX2's sixteen registers)."""
    b = lo
    while b + 4 <= hi:
        c0, c1, c2, c3 = cols[b], cols[b + 1], cols[b + 2], cols[b + 3]
        s0 = np.float32(0.0)
        s1 = np.float32(0.0)
        s2 = np.float32(0.0)
        s3 = np.float32(0.0)
        t0 = np.float32(0.0)
        t1 = np.float32(0.0)
        t2 = np.float32(0.0)
        t3 = np.float32(0.0)
        for j in range(x.shape[1]):
            u = x[a0, j]
            v = x[a1, j]
            y0 = x[c0, j]
            y1 = x[c1, j]
            y2 = x[c2, j]
            y3 = x[c3, j]
            s0 += u * y0
            s1 += u * y1
            s2 += u * y2
            s3 += u * y3
            t0 += v * y0
            t1 += v * y1
            t2 += v * y2
            t3 += v * y3
        out0[b] = _clamp(x, sq, a0, c0, s0, is_l2)
        out0[b + 1] = _clamp(x, sq, a0, c1, s1, is_l2)
        out0[b + 2] = _clamp(x, sq, a0, c2, s2, is_l2)
        out0[b + 3] = _clamp(x, sq, a0, c3, s3, is_l2)
        out1[b] = _clamp(x, sq, a1, c0, t0, is_l2)
        out1[b + 1] = _clamp(x, sq, a1, c1, t1, is_l2)
        out1[b + 2] = _clamp(x, sq, a1, c2, t2, is_l2)
        out1[b + 3] = _clamp(x, sq, a1, c3, t3, is_l2)
        b += 4
    _keys_row(x, sq, a0, cols, b, hi, out0, is_l2)
    _keys_row(x, sq, a1, cols, b, hi, out1, is_l2)


@njit(cache=True, fastmath=FAST, inline="always")
def keys_block(x, sq, ns, nn, cols, no, out, upper, is_l2, ahead, at, per):
    """out[a, b] = key(ns[a], cols[b]) for a < nn and b < no (``upper``: only b > a, the NEW x NEW
    triangle, where cols is ns), rows taken two at a time (_keys_2rows).

    Before each pair of rows it prefetches ``per`` rows of ``ahead`` (the next block's rows) from ``at`` on, and
    returns where it stopped: spread over the block's work, the ~1,400 lines of a text list's rows arrive while
    this block computes, where asking for them all at once stalled on the core's queue of misses."""
    a = 0
    while a + 2 <= nn:
        if at < ahead.size:
            prefetch_rows(x, ahead[at:at + per], EMPTY)
            at += per
        lo = a + 1 if upper else 0
        if upper:  # the pair (a, a + 1) belongs to row a alone
            _keys_row(x, sq, ns[a], cols, lo, lo + 1, out[a], is_l2)
            lo += 1
        _keys_2rows(x, sq, ns[a], ns[a + 1], cols, lo, no, out[a], out[a + 1], is_l2)
        a += 2
    if a < nn:
        _keys_row(x, sq, ns[a], cols, a + 1 if upper else 0, no, out[a], is_l2)
    return at


@njit(cache=True, inline="always")
def prefetch_per_pair(rows, pairs):
    """Rows of ``rows`` to prefetch before each of ``pairs`` row pairs (keys_block) so that all are asked for."""
    return max(1, (rows + pairs - 1) // max(1, pairs))
