"""UMAP's fuzzy membership strengths (McInnes, Healy, Melville, *UMAP*, 2018, §3; umap-learn's
``smooth_knn_dist`` and ``compute_membership_strengths``), computed per row from its own list, so a shard at
a time: rho is the row's nearest non-zero distance, sigma solves sum_j exp(-(d_j - rho) / sigma) = log2(n)
by bisection, where n = k + 1 counts the row itself as UMAP's ``n_neighbors`` does (local_connectivity 1,
bandwidth 1). The symmetric pass then joins a row's strength a and its neighbour's b as a + b - ab (union)
or ab (mutual)."""

from __future__ import annotations

import numpy as np

from bigknn.products.edges import shard_edges
from bigknn.shards import Store

BISECTION_STEPS = 64  # umap-learn's n_iter
TOLERANCE = 1e-5  # umap-learn's SMOOTH_K_TOLERANCE
MIN_SCALE = 1e-3  # umap-learn's MIN_K_DIST_SCALE: sigma is at least this times the mean distance


def mean_distance(store: Store, k: int) -> float:
    """The mean of every list's distances with the row itself at 0 counted (umap-learn's ``mean_distances``,
    the floor of sigma for rows whose every neighbour lies at distance 0): one streamed pass."""
    total, count = 0.0, 0
    for _, ids, dists in shard_edges(store, k):
        total += float(np.where(ids >= 0, dists, 0.0).sum(dtype=np.float64))
        count += dists.shape[0] * (dists.shape[1] + 1)
    return total / max(count, 1)


def smooth_knn_dist(dists: np.ndarray, mean_all: float) -> tuple[np.ndarray, np.ndarray]:
    """(sigma, rho) of each row of ``dists`` ((rows, k) ascending, self excluded), both float32."""
    d = np.asarray(dists, np.float32)
    rows, k = d.shape
    positive = d > 0
    rho = np.where(positive.any(axis=1), d[np.arange(rows), positive.argmax(axis=1)], 0).astype(np.float32)
    target = np.log2(k + 1)
    shifted = (d - rho[:, None]).astype(np.float64)  # float32 difference, as umap-learn's
    lo, hi, mid = np.zeros(rows), np.full(rows, np.inf), np.ones(rows)
    active = np.ones(rows, bool)
    for _ in range(BISECTION_STEPS):
        if not active.any():
            break
        a = np.nonzero(active)[0]
        s = shifted[a]
        psum = np.where(s > 0, np.exp(-np.maximum(s, 0) / mid[a, None]), 1.0).sum(axis=1)
        done = np.abs(psum - target) < TOLERANCE
        over = (psum > target) & ~done
        under = ~over & ~done
        hi[a[over]] = mid[a[over]]
        lo[a[under]] = mid[a[under]]
        grow = a[under][np.isinf(hi[a[under]])]
        mid[a[over]] = (lo[a[over]] + hi[a[over]]) / 2
        mid[grow] *= 2
        halve = a[under][~np.isinf(hi[a[under]])]
        mid[halve] = (lo[halve] + hi[halve]) / 2
        active[a[done]] = False
    floor = MIN_SCALE * np.where(rho > 0, d.sum(axis=1, dtype=np.float64) / (k + 1), mean_all)
    return np.maximum(mid, floor).astype(np.float32), rho


def memberships(dists: np.ndarray, mean_all: float) -> np.ndarray:
    """The directed strength of each list entry (rows, k): exp(-(d - rho) / sigma), 1 where d <= rho."""
    sigma, rho = smooth_knn_dist(dists, mean_all)
    shifted = np.asarray(dists, np.float32) - rho[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):  # sigma 0 and d <= rho take the 1 below
        w = np.exp(-(np.maximum(shifted, 0) / sigma[:, None].astype(np.float64)))
    return np.where((shifted <= 0) | (sigma[:, None] == 0), 1.0, w).astype(np.float32)
