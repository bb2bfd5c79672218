"""GNND's hot loops compiled with numba, on every core: sampling, cross-matching with selective update and
list insertion (the key passes outside an iteration: keypass.py).

The NumPy code in descent.py is the definition: these kernels compute the same lists (sampling and
insertion bit for bit; cross-matching up to the rounding of its float32 dot products, which may swap
candidates at near-equal keys). The reference pays for its vectorisation with temporaries of
(rows, 2p, 4p) keys and whole-array sorts; here each list is matched in registers and cache, EMPTY
sample slots cost nothing, NEW x NEW keys are computed once for both ends, and a candidate no better
than its target's last entry is dropped before it is written. pynndescent and UMAP compile their
NN-Descent the same way, and this measured faster than the vectorised NumPy (docs/perf-notes.md).

Every kernel takes one fixed signature (float32 vectors, int32 ids, C order), so a process compiles
each once and ``cache=True`` keeps the machine code between runs.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from bigknn.backends.cpu.keyblock import EMPTY, FAST, keys_block, prefetch_per_pair
from bigknn.backends.cpu.prefetch import prefetch_rows


@njit(cache=True, parallel=True)
def first_p(ids, is_new, part, cross_only, p):
    """Forward samples, as descent._sample/_first_p: the first p NEW and the first p OLD ids of each list
    (cross-shard mode: NEW ones of the other shard, OLD ones of the own shard); sampled NEW become OLD."""
    n, k = ids.shape
    fwd_new = np.full((n, p), EMPTY, np.int32)
    fwd_old = np.full((n, p), EMPTY, np.int32)
    for i in prange(n):
        nn = 0
        no = 0
        for j in range(k):
            v = ids[i, j]
            if v == EMPTY:
                continue
            same = part[v] == part[i]
            if is_new[i, j]:
                if nn < p and not (cross_only and same):
                    fwd_new[i, nn] = v
                    nn += 1
                    is_new[i, j] = False
            elif no < p and not (cross_only and not same):
                fwd_old[i, no] = v
                no += 1
    return fwd_new, fwd_old


@njit(cache=True, inline="always")
def mix64(z):
    """splitmix64's finaliser (uint64 in, uint64 out; wraps): the CPU's hashed draws (RP-tree fill, the order of
    reverse samples), compiled or called from NumPy on arrays."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True, inline="always")
def _group_range(out, own, first, t, parts, pos, g_src, g_rank, base, count):
    """reverse_fill's counting sort for the entries whose target v lies in range t of ``parts``, every entry
    scanned: counted into pos[v + 1] (``count``), else placed at pos[v] with its rank."""
    n = out.shape[0]
    v0, v1 = n * t // parts, n * (t + 1) // parts
    for i in range(n):
        for j in range(own[i]):
            v = out[i, j]
            if v0 <= v < v1:
                if count:
                    pos[v + 1] += 1
                else:
                    q = pos[v]
                    g_src[q] = i
                    g_rank[q] = mix64(base ^ np.uint64(first[i] + j))
                    pos[v] = q + 1


@njit(cache=True, parallel=True)
def reverse_fill(fwd, salt, p, parts):
    """descent._with_reverse: append s to list v for each forward sample v of s (in the order of the entries'
    ranks, mix64(mix64(salt) ^ e) for the e-th row-major valid entry) while v holds fewer than 2p ids;
    sort each list and blank its repeats. The entries are grouped by v first, so that the lists fill in
    parallel, each taking its entries in rank order."""
    n = fwd.shape[0]
    out = np.full((n, 2 * p), EMPTY, np.int32)
    own = np.zeros(n, np.int64)  # forward samples of each row: entries first[i]:first[i] + own[i]
    for i in prange(n):
        for j in range(p):
            if fwd[i, j] != EMPTY:
                out[i, own[i]] = fwd[i, j]
                own[i] += 1
    first = np.zeros(n + 1, np.int64)
    for i in range(n):
        first[i + 1] = first[i] + own[i]
    base = mix64(np.uint64(salt))
    # entries grouped by their target v (a counting sort) in ``parts`` ranges of v, one a thread: run serially,
    # the sort's random writes were most of the fill (0.11-0.13 s a call, 100K x 40 entries, 2 cores)
    starts = np.zeros(n + 1, np.int64)
    g_src = np.empty(first[n], np.int32)
    g_rank = np.empty(first[n], np.uint64)
    for t in prange(parts):
        _group_range(out, own, first, t, parts, starts, g_src, g_rank, base, True)
    for v in range(n):
        starts[v + 1] += starts[v]
    pos = starts[:-1].copy()
    for t in prange(parts):
        _group_range(out, own, first, t, parts, pos, g_src, g_rank, base, False)
    for v in prange(n):
        lo, hi = starts[v], starts[v + 1]
        for e in range(lo + 1, hi):  # insertion sort of v's entries by rank (a handful each)
            r, src = g_rank[e], g_src[e]
            f = e
            while f > lo and g_rank[f - 1] > r:
                g_rank[f] = g_rank[f - 1]
                g_src[f] = g_src[f - 1]
                f -= 1
            g_rank[f] = r
            g_src[f] = src
        for e in range(lo, min(hi, lo + 2 * p - own[v])):
            out[v, own[v] + e - lo] = g_src[e]
    _sort_blank_repeats(out)
    return out


@njit(cache=True, parallel=True)
def _sort_blank_repeats(out):
    for i in prange(out.shape[0]):
        row = out[i]
        for a in range(1, row.size):  # insertion sort: 2p ids, and numba's sort costs more per call
            v = row[a]
            b = a
            while b > 0 and row[b - 1] > v:
                row[b] = row[b - 1]
                b -= 1
            row[b] = v
        for j in range(row.size - 1, 0, -1):
            if row[j] != EMPTY and row[j] == row[j - 1]:
                row[j] = EMPTY


@njit(cache=True, parallel=True, fastmath=FAST)
def cross_match(x, sq, new_s, old_s, bound, is_l2, cross_only):
    """Selective-update candidates of every list, as descent._match_lists: each NEW sample's nearest OLD
    and (unless ``cross_only``) nearest other NEW sample, each OLD sample's nearest NEW one. A candidate is
    kept only if its key is below its target's ``bound`` (the list's last key: nothing else can enter).
    The next list's sample rows are prefetched while this one computes (keys_block).

    Returns (targets, candidates, keys), (n, 3 * 2p) each, target EMPTY on unused slots.
    """
    n, w = new_s.shape
    out_t = np.full((n, 3 * w), EMPTY, np.int32)
    out_c = np.empty((n, 3 * w), np.int32)
    out_k = np.empty((n, 3 * w), np.float32)
    for i in prange(n):
        ahead = np.full(2 * w, EMPTY, np.int32)
        if i + 1 < n:
            ahead[:w] = new_s[i + 1]
            ahead[w:] = old_s[i + 1]
        ns, nn = _compact(new_s[i])
        os_, no = _compact(old_s[i])
        if nn == 0:
            prefetch_rows(x, ahead, EMPTY)
            continue
        per = prefetch_per_pair(2 * w, (nn // 2) * (1 if cross_only else 2))
        d_no = np.empty((nn, no), np.float32)  # keys first, in tight loops; the choices after
        at = keys_block(x, sq, ns, nn, os_, no, d_no, False, is_l2, ahead, 0, per)
        for a in range(nn):  # an id that is both NEW and OLD here is no pair
            for b in range(no):
                if ns[a] == os_[b]:
                    d_no[a, b] = np.inf
        best_n, arg_n = _nearest_in_rows(d_no, os_)  # NEW u: nearest OLD
        best_o, arg_o = _nearest_in_cols(d_no, ns, os_)  # OLD v: nearest NEW
        best_nn = np.full(nn, np.inf, np.float32)  # NEW u: nearest other NEW
        arg_nn = np.empty(nn, np.int32)
        if not cross_only:
            d_nn = np.empty((nn, nn), np.float32)
            at = keys_block(x, sq, ns, nn, ns, nn, d_nn, True, is_l2, ahead, at, per)
            best_nn, arg_nn = _nearest_in_triangle(d_nn, ns)
        prefetch_rows(x, ahead[at:], EMPTY)
        m = _emit(out_t[i], out_c[i], out_k[i], 0, ns, arg_n, best_n, bound)
        m = _emit(out_t[i], out_c[i], out_k[i], m, os_, arg_o, best_o, bound)
        _emit(out_t[i], out_c[i], out_k[i], m, ns, arg_nn, best_nn, bound)
    return out_t, out_c, out_k


@njit(cache=True, inline="always")
def _compact(samples):
    """The ids of a sample list without its EMPTY slots (an array of that length) and their count."""
    out = np.empty(samples.size, np.int32)
    m = 0
    for v in samples:
        if v != EMPTY:
            out[m] = v
            m += 1
    return out[:m], m


# The choices below are branch-free (select, not if): which key is smallest is data, and mispredicted branches
# cost the cross-match as much as a third of its key arithmetic (text 100K, 2 cores: 0.78 -> 0.68 s an iteration
# with the rows cache-resident). Each takes the first of equal keys, as argmin does in the reference.

@njit(cache=True, fastmath=FAST, inline="always")
def _nearest_in_rows(d, cols):
    """For each row a: the smallest finite d[a, b] and that column's id (EMPTY if none)."""
    best = np.empty(d.shape[0], np.float32)
    arg = np.empty(d.shape[0], np.int32)
    for a in range(d.shape[0]):
        m = np.float32(np.inf)
        ib = -1
        for b in range(cols.size):
            v = d[a, b]
            lt = v < m
            m = v if lt else m
            ib = b if lt else ib
        best[a] = m
        arg[a] = cols[ib] if ib >= 0 else EMPTY
    return best, arg


@njit(cache=True, fastmath=FAST, inline="always")
def _nearest_in_cols(d, rows, cols):
    """For each column b: the smallest finite d[a, b] and that row's id (EMPTY if none)."""
    best = np.full(cols.size, np.inf, np.float32)
    ia = np.full(cols.size, -1, np.int32)
    for a in range(rows.size):
        for b in range(cols.size):
            v = d[a, b]
            lt = v < best[b]
            best[b] = v if lt else best[b]
            ia[b] = a if lt else ia[b]
    arg = np.empty(cols.size, np.int32)
    for b in range(cols.size):
        arg[b] = rows[ia[b]] if ia[b] >= 0 else EMPTY
    return best, arg


@njit(cache=True, fastmath=FAST, inline="always")
def _nearest_in_triangle(d, ids):
    """For each a: the smallest key to another of ``ids`` (distinct), whose keys are d's upper triangle."""
    nn = ids.size
    best = np.full(nn, np.inf, np.float32)
    ib = np.full(nn, -1, np.int32)
    for a in range(nn):
        m = best[a]
        ia = ib[a]
        for b in range(a + 1, nn):
            v = d[a, b]
            lt = v < m
            m = v if lt else m
            ia = b if lt else ia
            lt_b = v < best[b]  # b's candidate a: earlier rows came first, as argmin over b's full row
            best[b] = v if lt_b else best[b]
            ib[b] = a if lt_b else ib[b]
        best[a] = m
        ib[a] = ia
    arg = np.empty(nn, np.int32)
    for a in range(nn):
        arg[a] = ids[ib[a]] if ib[a] >= 0 else EMPTY
    return best, arg


@njit(cache=True, inline="always")
def _emit(out_t, out_c, out_k, m, owners, args, best, bound):
    """Write each owner's candidate from slot m on, where it beats the owner's bound; return the next slot."""
    for a in range(owners.size):
        if best[a] < bound[owners[a]]:
            out_t[m] = owners[a]
            out_c[m] = args[a]
            out_k[m] = best[a]
            m += 1
    return m


@njit(cache=True, parallel=True)
def _group(targets, cands, keys, n, parts):
    """Counting sort of the candidates by target: (starts (n + 1,), their ids, their keys), each target's
    in slot order; grouped once here, so that each list then reads its candidates from one place. The slots go
    in ``parts`` consecutive ranges, one a thread, each counted into its own histogram and then scattered from
    its own offsets (serially the sort was 0.32 s of a 0.45 s insert: 100K text lists of 120 slots, 2 cores)."""
    flat = targets.ravel()
    c_flat = cands.ravel()
    k_flat = keys.ravel()
    size = flat.size
    counts = np.zeros((parts, n), np.int64)
    for p in prange(parts):
        for s in range(size * p // parts, size * (p + 1) // parts):
            t = flat[s]
            if t != EMPTY:
                counts[p, t] += 1
    starts = np.zeros(n + 1, np.int64)
    for r in range(n):  # each range's first slot for target r: after the earlier ranges' and targets'
        at = starts[r]
        for p in range(parts):
            c = counts[p, r]
            counts[p, r] = at
            at += c
        starts[r + 1] = at
    gc = np.empty(starts[n], np.int32)
    gk = np.empty(starts[n], np.float32)
    for p in prange(parts):
        for s in range(size * p // parts, size * (p + 1) // parts):
            t = flat[s]
            if t != EMPTY:
                q = counts[p, t]
                gc[q] = c_flat[s]
                gk[q] = k_flat[s]
                counts[p, t] = q + 1
    return starts, gc, gk


@njit(cache=True, inline="always")
def place(ids, dists, is_new, c, key):
    """Put id ``c`` at ``key`` into a sorted list (after the entries of equal key), NEW; the last falls out."""
    pos = ids.size - 1
    while pos > 0 and dists[pos - 1] > key:
        ids[pos] = ids[pos - 1]
        dists[pos] = dists[pos - 1]
        is_new[pos] = is_new[pos - 1]
        pos -= 1
    ids[pos] = c
    dists[pos] = key
    is_new[pos] = True


@njit(cache=True, inline="always")
def _sift_in(ids, keys, last, c, key):
    """Put (c, key) into the key-sorted ids[:last + 1] / keys[:last + 1], after the entries of equal key; slot
    ``last`` is free, or its entry falls out."""
    pos = last
    while pos > 0 and keys[pos - 1] > key:
        ids[pos] = ids[pos - 1]
        keys[pos] = keys[pos - 1]
        pos -= 1
    ids[pos] = c
    keys[pos] = key


@njit(cache=True, inline="always")
def _holds(ids, m, c):
    """Whether ids[:m] holds ``c``: every slot compared, without an early exit, so that LLVM can compare
    several at a time (the insert on text lists of 80: 0.61 -> 0.57 s an iteration, docs/perf-notes.md)."""
    hit = False
    for j in range(m):
        hit |= ids[j] == c
    return hit


@njit(cache=True, parallel=True)
def insert(ids, dists, is_new, targets, cands, keys, parts):
    """Merge the candidates into the lists in place, as descent._insert: per target, its k nearest
    candidates (repeats and ids already listed dropped) enter where they beat the last entry, marked NEW.
    ``parts``: ranges of slots grouped at once (_group). Returns the number of entries inserted."""
    n, k = ids.shape
    starts, gc, gk = _group(targets, cands, keys, n, parts)
    added = np.zeros(n, np.int64)
    for r in prange(n):
        m = starts[r + 1] - starts[r]
        if m == 0:
            continue
        cid = np.empty(m, np.int32)  # the row's candidates, sorted by key (stable insertion sort: m is small)
        ckey = np.empty(m, np.float32)
        for a in range(m):
            _sift_in(cid, ckey, a, gc[starts[r] + a], gk[starts[r] + a])
        for a in range(min(k, m)):
            c, key = cid[a], ckey[a]
            if key >= dists[r, k - 1]:
                break
            if _holds(cid, a, c) or _holds(ids[r], k, c):
                continue
            place(ids[r], dists[r], is_new[r], c, key)
            added[r] += 1
    return added.sum()
