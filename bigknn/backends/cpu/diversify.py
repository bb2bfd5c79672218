"""Diversification of candidate lists and GGNN's path-back check: the NumPy reference of
bigknn/backends/cuda/prune.cu (bigknn/algorithms/search_params.py states the rules and names the papers).

Pairwise keys among a row's candidates are computed in float64, so that the reference decides every
comparison the way exact arithmetic would; the kernels compute in float32 and may differ only on near-ties.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bigknn.core.metric import Metric
from bigknn.algorithms.search_params import SYM_MIDPOINT, DiversifyRule

CHUNK_BYTES = 64 << 20  # float64 temporaries of one block of rows


def rule_less(a: np.ndarray, b: np.ndarray, metric: Metric, alpha: float = 1.0) -> np.ndarray:
    """alpha d(a) < d(b) for keys a, b: d = sqrt(key) for l2 (so alpha^2 key), d = 1 + key for ip."""
    if not metric.dot_keys:
        return alpha * alpha * a < b
    return alpha * (1.0 + a) < 1.0 + b


def candidate_keys(table: np.ndarray, cands: np.ndarray, metric: Metric) -> np.ndarray:
    """(rows, c, c) float64 keys between the candidates of each row (rows of ``table``; EMPTY entries get inf)."""
    valid = cands >= 0
    v = np.asarray(table, dtype=np.float64)[np.where(valid, cands, 0)]
    dots = np.matmul(v, v.transpose(0, 2, 1))
    if metric.dot_keys:
        keys = -dots
    else:
        sq = np.einsum("rcd,rcd->rc", v, v)
        keys = np.maximum(sq[:, :, None] + sq[:, None, :] - 2.0 * dots, 0.0)
    keys[~(valid[:, :, None] & valid[:, None, :])] = np.inf
    return keys


def diversify(cands: np.ndarray, keys: np.ndarray, table: np.ndarray, metric: Metric,
              rule: DiversifyRule) -> np.ndarray:
    """Per row, its candidates ``cands`` (rows, c) (indices into ``table``, EMPTY-padded at the end) with their
    keys to the row ``keys`` (ascending): the kept mask as uint8 for a sequential rule (rng, gd), else each
    candidate's occlusion factor (int32; 0 for EMPTY slots)."""
    rows, c = cands.shape
    out = np.zeros((rows, c), np.uint8 if rule.sequential else np.int32)
    step = max(1, CHUNK_BYTES // max(1, c * (c + table.shape[1]) * 8))
    for r0 in range(0, rows, step):
        sl = slice(r0, r0 + step)
        out[sl] = _diversify_block(cands[sl], np.asarray(keys[sl], np.float64), table, metric, rule)
    return out


def _diversify_block(cands, k0, table, metric, rule):
    valid = cands >= 0
    pair = candidate_keys(table, cands, metric)  # pair[r, i, j]
    ki, kj = k0[:, :, None], k0[:, None, :]
    if rule.kind == "rng":
        occludes = pair <= kj  # a kept closer i occludes j when d(i, j) <= d(row, j)
    else:
        occludes = rule_less(ki, kj, metric, rule.alpha) & rule_less(pair, kj, metric, rule.alpha)
    occludes &= valid[:, :, None] & valid[:, None, :]
    if not metric.dot_keys:  # a twin of the row (key 0) occludes nothing: d(twin, j) = d(row, j) for every j,
        occludes &= ki > 0  # an exact tie that rounding would decide, and "<=" would settle dropping all but the twin
    c = cands.shape[1]
    if not rule.sequential:
        occludes &= ~np.eye(c, dtype=bool)[None]
        return occludes.sum(axis=1, dtype=np.int32)
    kept = np.zeros(cands.shape, bool)
    for j in range(c):  # candidates in order of distance; each is judged against the ones kept before it
        kept[:, j] = valid[:, j] & ~(kept[:, :j] & occludes[:, :j, j]).any(axis=1)
    return kept.astype(np.uint8)


def reach_back(table: np.ndarray, lists: np.ndarray, list_index: np.ndarray, x: np.ndarray, z: np.ndarray,
               z_ids: np.ndarray) -> np.ndarray:
    """GGNN §5.2 (Alg. 5, two hops): for each request (x, z), z listing x, whether x leads back to z: z is in x's
    list, or in the list of a row a of x's list that lies inside the sphere around q_m = z + 0.4 (x - z) through
    x. ``table``: vectors; ``lists`` (m, w): global ids of each table row's list (EMPTY-padded; rows whose list
    is not needed may be all EMPTY); ``list_index`` (m, w): the table row of each entry, EMPTY where it has
    none; x, z: table rows; z_ids: z's global ids. Returns a bool per request."""
    out = np.zeros(len(x), bool)
    w = lists.shape[1]
    step = reach_back_step(w, table.shape[1], CHUNK_BYTES)
    for r0 in range(0, len(x), step):
        sl = slice(r0, r0 + step)
        out[sl] = reach_back_block(np, table, lists, list_index, x[sl], z[sl], z_ids[sl])
    return out


def reach_back_step(width: int, dim: int, block_bytes: int) -> int:
    """Requests of one reach_back block: float64 rows of x, z and x's list, and the lists of x's list."""
    return max(1, block_bytes // max(1, (width + 2) * dim * 8 + width * width * 8))


def reach_back_block(xp: Any, table, lists, list_index, x, z, z_ids):
    """reach_back of one block of requests, written for NumPy and CuPy (``xp``): the CUDA backend runs it on the
    device with every array there."""
    zid = xp.asarray(z_ids, dtype=xp.int64)[:, None]
    direct = (lists[x] == zid).any(axis=1)
    xv = xp.asarray(table[x], dtype=xp.float64)
    zv = xp.asarray(table[z], dtype=xp.float64)
    qm = zv + SYM_MIDPOINT * (xv - zv)
    radius = ((xv - qm) ** 2).sum(axis=1)
    a = list_index[x]  # (r, w)
    has = a >= 0
    av = xp.asarray(table[xp.where(has, a, 0)], dtype=xp.float64)
    inside = has & (((av - qm[:, None, :]) ** 2).sum(axis=2) < radius[:, None])
    lists_of_a = lists[xp.where(has, a, 0)]  # (r, w, w)
    lists_z = (lists_of_a == zid[:, :, None]).any(axis=2)
    return direct | (inside & lists_z).any(axis=1)
