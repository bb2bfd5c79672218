"""Diversification and GGNN's path-back check compiled (numba): the CPU backend's fast path of diversify.py's NumPy
reference, the same rules (bigknn/algorithms/search_params.py DiversifyRule), a row (a request) a task on every core.

The reference gathers each block's candidate rows in float64 and computes every pair's key with a matrix product:
on 128-d rows, 96 candidates a row, that took 60 s of a 50K-row prune on 2 cores. Here a row's candidates are
gathered once into a float32 block, and a pair's key is computed only where a rule asks for it (a sequential rule
judges a candidate against the kept ones only; an occlusion factor only counts closer candidates): l2 by direct
differences (integer-valued rows, e.g. uint8, give exact keys, as the reference's float64 does), ip as the dot
product; keys are compared in float64, as the reference compares them. On float rows a near-tie may be decided
the other way (float32 sums against float64), as on the GPU (prune.cu).

The path-back check (``reach_back``) computes in float64 as the reference does, and reads a list entry's row only
when that entry's own list holds z (the reference computes every entry's distance first).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from bigknn.backends.cpu.halves import as_float
from bigknn.backends.cpu.keyblock import FAST
from bigknn.core.metric import Metric
from bigknn.algorithms.search_params import SYM_MIDPOINT, DiversifyRule


def _numeric(table: np.ndarray) -> np.ndarray:
    """The rows as the compiled loops read them: numba has no half arithmetic, so float16 tables become float32
    (the values as the descent reads them); every other dtype as it is."""
    table = np.asarray(table)
    return as_float(table) if table.dtype == np.float16 else table


def diversify(cands: np.ndarray, keys: np.ndarray, table: np.ndarray, metric: Metric,
              rule: DiversifyRule) -> np.ndarray:
    """diversify.diversify, compiled: the kept mask (uint8) under a sequential rule, else each candidate's
    occlusion factor (int32; 0 for EMPTY slots)."""
    rows, c = cands.shape
    out = np.zeros((rows, c), np.uint8 if rule.sequential else np.int32)
    if rows and c:
        _verdicts(np.ascontiguousarray(cands, np.int64), np.ascontiguousarray(keys, np.float32), _numeric(table),
                  not metric.dot_keys, rule.kind == "rng", rule.sequential, float(rule.alpha), out)
    return out


@njit(cache=True, parallel=True, fastmath=FAST)
def _verdicts(cands, keys, table, is_l2, rng_rule, sequential, alpha, out):
    rows, c = cands.shape
    d = table.shape[1]
    for r in prange(rows):
        block = np.empty((c, d), np.float32)
        for i in range(c):
            if cands[r, i] >= 0:
                for e in range(d):
                    block[i, e] = np.float32(table[cands[r, i], e])
        if sequential:
            kept = np.zeros(c, np.bool_)
            for j in range(c):
                if cands[r, j] < 0:
                    continue
                blocked = False
                for i in range(j):
                    if kept[i] and _occludes(block, i, j, keys[r, i], keys[r, j], is_l2, rng_rule, alpha):
                        blocked = True
                        break
                kept[j] = not blocked
                out[r, j] = 0 if blocked else 1
        else:
            for j in range(c):
                if cands[r, j] < 0:
                    continue
                count = 0
                for i in range(c):
                    if i != j and cands[r, i] >= 0 and _occludes(block, i, j, keys[r, i], keys[r, j], is_l2,
                                                                  rng_rule, alpha):
                        count += 1
                out[r, j] = count


@njit(cache=True, fastmath=FAST, inline="always")
def _occludes(block, i, j, key_i, key_j, is_l2, rng_rule, alpha):
    """diversify._diversify_block's ``occludes[i, j]`` for valid i and j: the pair's key only when needed."""
    ki, kj = np.float64(key_i), np.float64(key_j)
    if is_l2 and not ki > 0.0:  # a twin of the row occludes nothing (the reference's rule and why)
        return False
    if rng_rule:
        return _pair_key(block, i, j, is_l2) <= kj
    if not _less(ki, kj, is_l2, alpha):
        return False
    return _less(_pair_key(block, i, j, is_l2), kj, is_l2, alpha)


@njit(cache=True, fastmath=FAST, inline="always")
def _less(a, b, is_l2, alpha):
    """diversify.rule_less: alpha d(a) < d(b), with d = sqrt(key) (l2) or 1 + key (ip)."""
    if is_l2:
        return alpha * alpha * a < b
    return alpha * (1.0 + a) < 1.0 + b


@njit(cache=True, fastmath=FAST, inline="always")
def _pair_key(block, i, j, is_l2):
    s = np.float32(0.0)
    if is_l2:
        for e in range(block.shape[1]):
            t = block[i, e] - block[j, e]
            s += t * t
        return np.float64(s)
    for e in range(block.shape[1]):
        s += block[i, e] * block[j, e]
    return -np.float64(s)


def reach_back(table: np.ndarray, lists: np.ndarray, list_index: np.ndarray, x: np.ndarray, z: np.ndarray,
               z_ids: np.ndarray) -> np.ndarray:
    """diversify.reach_back, compiled: for each request (x, z), whether x leads back to z within two hops."""
    out = np.zeros(len(x), np.bool_)
    if len(x):
        _reach_back(_numeric(table), np.ascontiguousarray(lists, np.int64), np.ascontiguousarray(list_index, np.int64),
                    np.ascontiguousarray(x, np.int64), np.ascontiguousarray(z, np.int64),
                    np.ascontiguousarray(z_ids, np.int64), SYM_MIDPOINT, out)
    return out


@njit(cache=True, parallel=True)
def _reach_back(table, lists, list_index, x, z, z_ids, midpoint, out):
    d = table.shape[1]
    w = lists.shape[1]
    for t in prange(len(x)):
        xr, zr, zid = x[t], z[t], z_ids[t]
        found = False
        for j in range(w):
            if lists[xr, j] == zid:
                found = True
                break
        if not found:
            qm = np.empty(d, np.float64)
            radius = 0.0
            for e in range(d):
                xv, zv = np.float64(table[xr, e]), np.float64(table[zr, e])
                qm[e] = zv + midpoint * (xv - zv)
                radius += (xv - qm[e]) ** 2
            for j in range(w):
                a = list_index[xr, j]
                if a < 0 or not _lists_hold(lists, a, zid):
                    continue
                dist = 0.0
                for e in range(d):
                    dist += (np.float64(table[a, e]) - qm[e]) ** 2
                if dist < radius:
                    found = True
                    break
        out[t] = found


@njit(cache=True, inline="always")
def _lists_hold(lists, a, zid):
    for j in range(lists.shape[1]):
        if lists[a, j] == zid:
            return True
    return False
