"""GNND iterations in NumPy (GNND paper §4, docs/design.md), vectorised over rows: the reference for the CUDA
kernels.

One iteration: sample <= p NEW and <= p OLD neighbours per list (sampled NEW become OLD), add bounded
reverse samples (each sample list holds at most 2p ids), cross-match NEW x NEW and NEW x OLD inside each
list, keep only each sample's nearest candidate per group (selective update), and merge the candidates
into the lists. The paper merges per-segment inserts after the iteration; here the whole insertion is
one batched merge, which gives the same lists up to the order in which equal keys are kept.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

from bigknn.backends.cpu.kernels import mix64
from bigknn.core.knn_graph import EMPTY, LOCAL_ID_DTYPE, sortable_float_bits
from bigknn.core.metric import Metric
from bigknn.algorithms.recall_target import Probe, Stopper

GATHER_BYTES = 32 << 20  # bytes of gathered sample vectors per cross-matching batch
THREADS = min(4, os.cpu_count() or 1)


@dataclass
class DescentState:
    """A graph under refinement: local ids, keys, NEW flags."""

    ids: np.ndarray
    dists: np.ndarray
    is_new: np.ndarray


def row_keys_local(x: np.ndarray, sq: np.ndarray, rows: np.ndarray, ids: np.ndarray, metric: Metric) -> np.ndarray:
    """Keys between each row and each id of its (rows, m) id block (EMPTY ids get +inf), in batches."""
    out = np.empty(ids.shape, np.float32)
    step = max(1, GATHER_BYTES // (ids.shape[1] * x.shape[1] * 4))
    for s in range(0, ids.shape[0], step):
        r, i = rows[s:s + step], ids[s:s + step]
        safe = np.where(i == EMPTY, 0, i)
        out[s:s + step] = _keys(x[r][:, None, :], x[safe], sq, r[:, None], safe, metric)[:, 0, :]
    out[ids == EMPTY] = np.inf
    return out


def exact_l2_keys(x: np.ndarray, state: DescentState) -> None:
    """Replace every l2 key by the direct sum of squared differences, then re-sort each list.

    The descent computes |a|^2 + |b|^2 - 2ab, whose rounding leaves identical rows at a small non-zero
    distance; direct differences give exactly 0 there (deduplication relies on it).
    """
    n, w = state.ids.shape
    step = max(1, GATHER_BYTES // (w * x.shape[1] * 4))
    for s in range(0, n, step):
        ids = state.ids[s:s + step]
        diff = x[np.where(ids == EMPTY, 0, ids)] - x[s:s + step, None, :]
        keys = np.einsum("imd,imd->im", diff, diff)
        keys[ids == EMPTY] = np.inf
        order = np.argsort(keys, axis=1, kind="stable")
        state.ids[s:s + step] = np.take_along_axis(ids, order, axis=1)
        state.dists[s:s + step] = np.take_along_axis(keys, order, axis=1)
        state.is_new[s:s + step] = np.take_along_axis(state.is_new[s:s + step], order, axis=1)


@dataclass
class Target:
    """A recall target for a descent: its probe, the stopper, p for a given list width, and the key of the
    empty slots a widening adds (+inf, or a seeded merge's per-row bound)."""

    probe: Probe
    stopper: Stopper
    samples_at: Callable[[int], int]
    pad_key: np.ndarray | float = np.inf
    hard_below: float = 0.0  # a first estimate below this marks a hard set (text embeddings: from 20 RP
    hard_samples_at: Callable[[int], int] | None = None  # trees 0.57-0.75, synth 0.99): p from here on,
    hard_width: int = 0  # and lists this wide (they would stall at the narrower width and widen later)


def descend(x: np.ndarray, state: DescentState, metric: Metric, samples: int, iters: int,
            min_update_frac: float, rng: np.random.Generator, part: np.ndarray | None = None,
            on_iter=None, target: Target | None = None, compiled: bool = False) -> list[int]:
    """Refine ``state`` in place; return the update count of each iteration.

    ``part``: optional per-row label; when given, only pairs with different labels are matched
    (GGM's cross-shard-only mode). ``target``: stop by the probe's recall estimate instead of the update
    fraction, and widen the lists (``state`` grows) where it stalls; the caller cuts them back.
    ``compiled``: run each iteration through the numba kernels (compiled.py) instead of this NumPy.
    """
    sq = np.einsum("ij,ij->i", x, x)
    step = _iteration
    if compiled:  # imported here: the reference alone never loads numba
        from bigknn.backends.cpu.compiled import iteration as step
    history: list[int] = []
    for _ in range(iters):
        n, k = state.ids.shape
        t = time.perf_counter()
        updates = step(x, sq, state, metric, samples, rng, part)
        history.append(updates)
        if on_iter is not None:
            on_iter(updates)
        if target is None:
            if updates < min_update_frac * n * k:
                break
            continue
        rows = target.probe.rows
        est = target.probe.measure(state.ids[rows], state.dists[rows])
        if not target.stopper.trace and target.hard_samples_at is not None and est.recall < target.hard_below:
            target.samples_at = target.hard_samples_at  # more samples per list: fewer iterations, no stall at 48
            if target.hard_width > state.ids.shape[1]:
                target.stopper.start_wider(target.hard_width)
                widen(state, target.stopper.width, target.pad_key)  # the stopper's: at most MAX_WIDTH
            samples = target.samples_at(state.ids.shape[1])
        action = target.stopper.after(est, time.perf_counter() - t)  # the iteration and its measure
        if action == "stop":
            break
        if action == "widen":
            widen(state, target.stopper.width, target.pad_key)
            samples = target.samples_at(target.stopper.width)
    return history


def _iteration(x: np.ndarray, sq: np.ndarray, state: DescentState, metric: Metric, p: int,
               rng: np.random.Generator, part: np.ndarray | None) -> int:
    """Sample, cross-match, insert: one iteration in NumPy; return entries inserted."""
    new_s, old_s = _sample(state, p, rng, part)
    targets, cands, keys = _cross_match(x, sq, new_s, old_s, metric, part)
    return _insert(state, targets, cands, keys)


def widen(state: DescentState, width: int, pad_key: np.ndarray | float) -> None:
    """Grow every list to ``width`` entries: empty slots (id EMPTY, key ``pad_key``, OLD) at the end."""
    n, k = state.ids.shape
    extra = width - k
    key = np.broadcast_to(np.asarray(pad_key, np.float32).reshape(-1, 1), (n, 1))
    state.ids = np.concatenate([state.ids, np.full((n, extra), EMPTY, LOCAL_ID_DTYPE)], axis=1)
    state.dists = np.concatenate([state.dists, np.repeat(key, extra, axis=1)], axis=1)
    state.is_new = np.concatenate([state.is_new, np.zeros((n, extra), bool)], axis=1)


def cut(state: DescentState, width: int) -> None:
    """Keep the first ``width`` entries of every list (after a widened descent)."""
    state.ids = np.ascontiguousarray(state.ids[:, :width])
    state.dists = np.ascontiguousarray(state.dists[:, :width])
    state.is_new = np.ascontiguousarray(state.is_new[:, :width])


def _sample(state: DescentState, p: int, rng: np.random.Generator,
            part: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Sample lists (n, 2p): first p NEW / OLD of each list, then reverse samples up to 2p, deduplicated.

    Cross-shard mode (``part`` given): only pairs NEW (other shard) x OLD (own shard) can be cross-shard,
    so NEW samples come from the other shard's entries and OLD samples from the row's own shard's; then
    every matched pair is cross-shard by construction, and no sample slot is spent on one that is not.
    """
    valid = state.ids != EMPTY
    new_mask = state.is_new & valid
    old_mask = ~state.is_new & valid
    if part is not None:
        same = part[np.where(valid, state.ids, 0)] == part[:, None]
        new_mask &= ~same
        old_mask &= same
    fwd_new, take_new = _first_p(state.ids, new_mask, p)
    fwd_old, _ = _first_p(state.ids, old_mask, p)
    state.is_new &= ~take_new  # sampled NEW neighbours are OLD from now on
    return _with_reverse(fwd_new, p, rng), _with_reverse(fwd_old, p, rng)


def reverse_salt(rng: np.random.Generator) -> int:
    """The one draw a reverse fill takes from the descent's generator (both paths draw alike)."""
    return int(rng.integers(0, 1 << 62))


def _first_p(ids: np.ndarray, mask: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray]:
    """The first p ids of each row where ``mask`` holds, compacted into (n, p) (EMPTY padded)."""
    rank = np.cumsum(mask, axis=1) - 1
    take = mask & (rank < p)
    out = np.full((ids.shape[0], p + 1), EMPTY, dtype=LOCAL_ID_DTYPE)
    rows = np.broadcast_to(np.arange(ids.shape[0])[:, None], ids.shape)
    out[rows[take], rank[take]] = ids[take]
    return out[:, :p], take


def _with_reverse(fwd: np.ndarray, p: int, rng: np.random.Generator) -> np.ndarray:
    """Append reverse samples: for v in fwd[s], s joins list v while it holds fewer than 2p ids.

    On the GPU the order of these appends is decided by racing atomics; here a list takes its reverse samples in
    the order of a hash of the entry (mix64(mix64(salt) ^ e), e the entry's row-major place), so no list prefers
    low row numbers. A hash, not a permutation of the entries: drawing that cost ~1.2 s of a 100K text build.
    """
    n = fwd.shape[0]
    counts = (fwd != EMPTY).sum(axis=1)
    src, col = np.nonzero(fwd != EMPTY)
    dst = fwd[src, col]
    rank = mix64(mix64(np.uint64(reverse_salt(rng))) ^ np.arange(dst.size, dtype=np.uint64))
    order = np.lexsort((rank, dst))
    src, dst = src[order], dst[order]
    starts = np.searchsorted(dst, np.arange(n))
    slot = counts[dst] + (np.arange(dst.size) - starts[dst])
    keep = slot < 2 * p
    out = np.full((n, 2 * p), EMPTY, dtype=LOCAL_ID_DTYPE)
    out[:, :p] = fwd
    out[dst[keep], slot[keep]] = src[keep]
    out.sort(axis=1)
    dup = np.zeros_like(out, dtype=bool)
    dup[:, 1:] = (out[:, 1:] == out[:, :-1]) & (out[:, 1:] != EMPTY)
    out[dup] = EMPTY
    return out


def _cross_match(x, sq, new_s, old_s, metric, part):
    """Selective update candidates (target, candidate id, key) from every list's samples.

    Batches of lists run on a small thread pool: the batched matmuls and reductions release the GIL.
    """
    n, w = new_s.shape
    batch = max(1, GATHER_BYTES // (3 * w * x.shape[1] * 4))
    spans = [(s, min(n, s + batch)) for s in range(0, n, batch)]
    with ThreadPoolExecutor(THREADS) as pool:
        parts = list(pool.map(lambda sp: _match_lists(x, sq, new_s[sp[0]:sp[1]], old_s[sp[0]:sp[1]],
                                                      metric, part is not None), spans))
    return tuple(np.concatenate([pt[i] for pt in parts]) for i in range(3))


def _match_lists(x, sq, ns, os_, metric, cross_only):
    w = ns.shape[1]
    nsafe = np.where(ns == EMPTY, 0, ns)
    osafe = np.where(os_ == EMPTY, 0, os_)
    # cross-shard mode: NEW samples lie in the list owner's other shard, OLD samples in its own (see
    # _sample), so NEW x OLD pairs are all cross-shard and NEW x NEW pairs all same-shard: skipped
    # (paper §5.1: cross-shard distances only)
    others = osafe if cross_only else np.concatenate([osafe, nsafe], axis=1)
    other_ids = os_ if cross_only else np.concatenate([os_, ns], axis=1)
    d = _keys(x[nsafe], x[others], sq, nsafe, others, metric)
    bad = (ns[:, :, None] == EMPTY) | (other_ids[:, None, :] == EMPTY) | (ns[:, :, None] == other_ids[:, None, :])
    d[bad] = np.inf
    d_no = d[:, :, :w]
    groups = [(ns, os_, d_no), (os_, ns, d_no.transpose(0, 2, 1))]
    if not cross_only:
        groups.append((ns, ns, d[:, :, w:]))
    out_t, out_c, out_k = [], [], []
    for owners, cands, dg in groups:
        best = dg.argmin(axis=2)
        bk = np.take_along_axis(dg, best[:, :, None], axis=2)[:, :, 0]
        ok = np.isfinite(bk)
        out_t.append(owners[ok])
        out_c.append(np.take_along_axis(cands, best, axis=1)[ok])
        out_k.append(bk[ok].astype(np.float32))
    return np.concatenate(out_t), np.concatenate(out_c), np.concatenate(out_k)


def _keys(xa, xb, sq, ia, ib, metric):
    dots = np.matmul(xa, xb.transpose(0, 2, 1))
    if metric.dot_keys:
        return np.negative(dots, out=dots)
    d = sq[ia][:, :, None] + sq[ib][:, None, :] - 2.0 * dots
    return np.maximum(d, 0.0, out=d)


def _insert(state: DescentState, targets, cands, keys) -> int:
    """Merge candidates into the lists (at most k per target, nearest first); return entries inserted.

    Candidates already in the list, or repeated for the same target, are dropped first, so the merge
    is a plain sort by key and every entry keeps its NEW/OLD flag.
    """
    n, k = state.ids.shape
    closer = keys < state.dists[targets, -1]  # no worse than the list's last entry: cannot enter
    targets, cands, keys = targets[closer], cands[closer], keys[closer]
    if targets.size == 0:
        return 0
    order = np.argsort((targets.astype(np.int64) << 32) | sortable_float_bits(keys).astype(np.int64))
    targets, cands, keys = targets[order], cands[order], keys[order]
    starts = np.searchsorted(targets, np.arange(n))
    rank = np.arange(targets.size) - starts[targets]
    width = int(min(k, rank.max() + 1))
    keep = rank < width
    cid = np.full((n, width), EMPTY, dtype=LOCAL_ID_DTYPE)
    ckey = np.full((n, width), np.inf, dtype=np.float32)
    cid[targets[keep], rank[keep]] = cands[keep]
    ckey[targets[keep], rank[keep]] = keys[keep]
    in_list = (cid[:, :, None] == state.ids[:, None, :]).any(axis=2)
    later = np.triu(np.ones((width, width), dtype=bool), 1)
    repeated = ((cid[:, None, :] == cid[:, :, None]) & later).any(axis=1)
    ckey[in_list | repeated | (cid == EMPTY)] = np.inf
    all_keys = np.concatenate([state.dists, ckey], axis=1)
    pick = np.argsort(all_keys, axis=1)[:, :k]
    state.ids = np.take_along_axis(np.concatenate([state.ids, cid], axis=1), pick, axis=1)
    state.dists = np.take_along_axis(all_keys, pick, axis=1)
    state.ids[np.isinf(state.dists)] = EMPTY
    inserted = pick >= k
    state.is_new = np.take_along_axis(state.is_new, np.minimum(pick, k - 1), axis=1) | inserted
    return int((inserted & (state.ids != EMPTY)).sum())
