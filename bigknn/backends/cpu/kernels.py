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

from bigknn.backends.cpu.prefetch import prefetch_rows

EMPTY = -1  # bigknn.graph.EMPTY (numba needs it as a global constant)
PREFETCH_AHEAD = 1  # the cross-match asks for the sample rows of the list this many ahead (prefetch.py)
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
def _keys_row(x, sq, a, cols, lo, hi, out, is_l2):
    """out[b] = _key(a, cols[b]) for b in [lo, hi): four columns per pass over a's vector, so each of its
    loads feeds four products (the single dot is bound by its two loads per multiply-add)."""
    b = lo
    while b + 4 <= hi:
        c0, c1, c2, c3 = cols[b], cols[b + 1], cols[b + 2], cols[b + 3]
        s0 = np.float32(0.0)
        s1 = np.float32(0.0)
        s2 = np.float32(0.0)
        s3 = np.float32(0.0)
        for j in range(x.shape[1]):
            v = x[a, j]
            s0 += v * x[c0, j]
            s1 += v * x[c1, j]
            s2 += v * x[c2, j]
            s3 += v * x[c3, j]
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
def _keys_block(x, sq, ns, nn, cols, no, out, upper, is_l2):
    """out[a, b] = key(ns[a], cols[b]) for a < nn and b < no (``upper``: only b > a, the NEW x NEW
    triangle, where cols is ns), rows taken two at a time (_keys_2rows)."""
    a = 0
    while a + 2 <= nn:
        lo = a + 1 if upper else 0
        if upper:  # the pair (a, a + 1) belongs to row a alone
            _keys_row(x, sq, ns[a], cols, lo, lo + 1, out[a], is_l2)
            lo += 1
        _keys_2rows(x, sq, ns[a], ns[a + 1], cols, lo, no, out[a], out[a + 1], is_l2)
        a += 2
    if a < nn:
        _keys_row(x, sq, ns[a], cols, a + 1 if upper else 0, no, out[a], is_l2)


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

    Returns (targets, candidates, keys), (n, 3 * 2p) each, target EMPTY on unused slots.
    """
    n, w = new_s.shape
    out_t = np.full((n, 3 * w), EMPTY, np.int32)
    out_c = np.empty((n, 3 * w), np.int32)
    out_k = np.empty((n, 3 * w), np.float32)
    for i in prange(n):
        if i + PREFETCH_AHEAD < n:
            prefetch_rows(x, new_s[i + PREFETCH_AHEAD], EMPTY)
            prefetch_rows(x, old_s[i + PREFETCH_AHEAD], EMPTY)
        ns = np.empty(w, np.int32)
        os_ = np.empty(w, np.int32)
        nn = 0
        no = 0
        for j in range(w):
            if new_s[i, j] != EMPTY:
                ns[nn] = new_s[i, j]
                nn += 1
            if old_s[i, j] != EMPTY:
                os_[no] = old_s[i, j]
                no += 1
        if nn == 0:
            continue
        d_no = np.empty((nn, no), np.float32)  # keys first, in tight loops; the choices after
        _keys_block(x, sq, ns, nn, os_, no, d_no, False, is_l2)
        best_n = np.full(nn, np.inf, np.float32)  # NEW u: nearest OLD
        arg_n = np.empty(nn, np.int32)
        best_o = np.full(no, np.inf, np.float32)  # OLD v: nearest NEW
        arg_o = np.empty(no, np.int32)
        for a in range(nn):
            for b in range(no):
                d = d_no[a, b]
                if d < best_n[a] and ns[a] != os_[b]:
                    best_n[a] = d
                    arg_n[a] = os_[b]
                if d < best_o[b] and ns[a] != os_[b]:
                    best_o[b] = d
                    arg_o[b] = ns[a]
        best_nn = np.full(nn, np.inf, np.float32)  # NEW u: nearest other NEW
        arg_nn = np.empty(nn, np.int32)
        if not cross_only:
            d_nn = np.empty((nn, nn), np.float32)
            _keys_block(x, sq, ns, nn, ns, nn, d_nn, True, is_l2)
            for a in range(nn):
                for b in range(a + 1, nn):
                    d = d_nn[a, b]
                    if d < best_nn[a]:
                        best_nn[a] = d
                        arg_nn[a] = ns[b]
                    if d < best_nn[b]:
                        best_nn[b] = d
                        arg_nn[b] = ns[a]
        m = _emit(out_t[i], out_c[i], out_k[i], 0, ns[:nn], arg_n, best_n, bound)
        m = _emit(out_t[i], out_c[i], out_k[i], m, os_[:no], arg_o, best_o, bound)
        _emit(out_t[i], out_c[i], out_k[i], m, ns[:nn], arg_nn, best_nn, bound)
    return out_t, out_c, out_k


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
