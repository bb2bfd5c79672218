"""The compiled CPU loops (bigknn/backends/cpu/kernels.py) against the NumPy reference they must equal.

Inputs are fresh random draws of odd sizes and both metrics. Without equal keys the compiled iterations must
give the very same lists (cross-matching differs only in float32 rounding, which on these draws never
decides); with duplicated rows (ties at key 0, where either order is right) the same recall. Everything stays small: each kernel compiles once for the
one signature the backend uses, and the suite pays that once.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from bigknn.backends import get_backends
from bigknn.backends.cpu import CpuBackend, compiled, descent, exact_l2_keys, random_init
from bigknn.backends.cpu.bounds import BOUND_DIMS
from bigknn.backends.cpu.rptree import _quantise, principal_rows, split_rows, tree_init
from bigknn.core.errors import BadInput
from bigknn.core.knn_graph import EMPTY, ShardPart
from bigknn.core.params import GnndParams
from bigknn.core.synth import synth
from bigknn.core.metric import IP, L2, metric as metric_of

from conftest import check_graph, recall_at


def rows_with_twins(n: int, dim: int, seed: int, twins: bool = True) -> np.ndarray:
    """Gaussian rows, a few of them repeated exactly (ties at key 0 and between equal candidates)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    if twins:
        x[rng.choice(n, n // 20, replace=False)] = x[rng.choice(n, n // 20, replace=False)]
    return x


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_reverse_fill_equals_the_reference_whatever_its_split(parts):
    """The compiled fill groups the entries by target in ``parts`` ranges (one a thread): any split must give
    the reference's lists, entry for entry (odd sizes: ranges of unequal length, lists that overflow 2p)."""
    rng = np.random.default_rng(parts)
    n, p = 997, 6
    fwd = np.full((n, p), EMPTY, np.int32)
    for i in range(n):
        picks = rng.choice(np.delete(np.arange(n), i), size=int(rng.integers(0, p + 1)), replace=False)
        fwd[i, :len(picks)] = picks
    fwd[p:p + 50, :] = np.arange(p)  # rows 0..p-1 are in 50 more lists: theirs overflow and keep 2p by rank
    want = descent._with_reverse(fwd, p, np.random.default_rng(9))
    got = compiled.kernels.reverse_fill(fwd, descent.reverse_salt(np.random.default_rng(9)), p, parts)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("cross_shard", [False, True])
def test_iterations_equal_the_reference(metric, cross_shard):
    """Same draws, same lists: at most a few slots apart, where float32 rounding decided a near tie."""
    x = rows_with_twins(1237, 13, seed=5 + cross_shard, twins=False)
    sq = np.einsum("ij,ij->i", x, x)
    ref = random_init(x, 21, metric_of(metric), np.random.default_rng(1), compiled=False)
    part = None
    if cross_shard:  # GGM's set-up: entries into the other shard are the NEW fill, the own shard's are OLD
        part = (np.arange(len(x)) >= 600).astype(np.int8)
        ref.is_new = part[ref.ids] != part[:, None]
    fast = copy.deepcopy(ref)
    for it in range(4):
        want = descent._iteration(x, sq, ref, metric_of(metric), 5, np.random.default_rng(it), part)
        got = compiled.iteration(x, sq, fast, metric_of(metric), 5, np.random.default_rng(it), part)
        assert want > 0 and abs(got - want) <= 0.002 * want
        assert (fast.ids != ref.ids).mean() <= 0.001
        same = fast.ids == ref.ids
        np.testing.assert_allclose(fast.dists[same], ref.dists[same], rtol=1e-5, atol=1e-4)
        assert (fast.is_new[same] == ref.is_new[same]).all()


def test_insert_keeps_the_nearest_new_entries_once():
    """Candidates naming ids already listed, repeated ones, and more than k for one target; every key is
    the pair's (a table), as in a descent, where a listed id comes back with the key it is listed at."""
    rng = np.random.default_rng(9)
    n, k, m = 97, 6, 900
    table = rng.random((n, n)).astype(np.float32)
    ids = np.stack([rng.choice(np.arange(1, n), k, replace=False) for _ in range(n)]).astype(np.int32)
    dists = np.take_along_axis(table, ids, axis=1)
    order = np.argsort(dists, axis=1)
    ids, dists = np.take_along_axis(ids, order, axis=1), np.take_along_axis(dists, order, axis=1)
    ids[::7, -2:], dists[::7, -2:] = EMPTY, np.inf  # lists with room
    state = descent.DescentState(ids, dists, rng.random((n, k)) < 0.5)
    targets = rng.integers(0, n, m).astype(np.int32)
    cands = np.where(rng.random(m) < 0.3, ids[targets, 0], rng.integers(0, n, m)).astype(np.int32)
    keys = table[targets, cands]
    closer = keys < dists[targets, -1]  # cross_match's bound, which the kernel relies on
    targets, cands, keys = targets[closer], cands[closer], keys[closer]
    before = copy.deepcopy(state)
    want = descent._insert(state, targets, cands, keys)
    slots = np.full((n, len(targets)), EMPTY, np.int32)  # the kernel's (lists, slots) layout
    slots[np.arange(len(targets)) % n, np.arange(len(targets))] = targets
    for parts in (1, 2, 3, 7):  # the slots grouped in ranges, a thread each: the same lists
        fast = copy.deepcopy(before)
        got = compiled.kernels.insert(fast.ids, fast.dists, fast.is_new, slots, np.tile(cands, (n, 1)),
                                      np.tile(keys, (n, 1)), parts)
        assert got == want > 0
        np.testing.assert_array_equal(fast.ids, state.ids)
        np.testing.assert_array_equal(fast.dists, state.dists)
        np.testing.assert_array_equal(fast.is_new, state.is_new)


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("cross_only", [False, True])
def test_cross_match_chooses_the_references_candidates(metric, cross_only):
    """Each list's chosen pairs, against descent._match_lists: sample lists of every fill (none, one, odd
    counts, EMPTY gaps) where some ids are both NEW and OLD (never a pair), lists that end the range while
    the next list's rows are prefetched, and a bound that drops some candidates."""
    rng = np.random.default_rng(17 + cross_only)
    n, w, dim = 301, 14, 37
    x = rng.standard_normal((n, dim)).astype(np.float32)
    sq = np.einsum("ij,ij->i", x, x)
    new_s = np.full((n, w), EMPTY, np.int32)
    old_s = np.full((n, w), EMPTY, np.int32)
    for i in range(n):
        nn, no = rng.integers(0, w + 1, 2)
        picks = rng.choice(n, nn + no, replace=False)
        new, old = np.sort(picks[:nn]), np.sort(picks[nn:])
        if nn and no and i % 3 == 0:
            old[0] = new[-1]  # shared by both lists
            old.sort()
        new_s[i, np.sort(rng.choice(w, nn, replace=False))] = new  # ascending, EMPTY gaps anywhere
        old_s[i, np.sort(rng.choice(w, no, replace=False))] = old
    keys_all = descent._keys(x[None], x[None], sq, np.arange(n)[None], np.arange(n)[None], metric_of(metric))[0]
    near = np.sort(keys_all, axis=1)[:, n // 5:n // 5 + 2]
    bound = near.mean(axis=1).astype(np.float32)  # halfway between two keys: rounding cannot decide a side
    want_t, want_c, want_k = descent._match_lists(x, sq, new_s, old_s, metric_of(metric), cross_only)
    keep = want_k < bound[want_t]
    got_t, got_c, got_k = compiled.kernels.cross_match(x, sq, new_s, old_s, bound, metric == "l2", cross_only)
    used = got_t != EMPTY
    want = sorted(zip(want_t[keep].tolist(), want_c[keep].tolist()))
    assert sorted(zip(got_t[used].tolist(), got_c[used].tolist())) == want and len(want) > n
    order_w = np.lexsort((want_c[keep], want_t[keep]))
    order_g = np.lexsort((got_c[used], got_t[used]))
    np.testing.assert_allclose(got_k[used][order_g], want_k[keep][order_w], rtol=1e-4, atol=1e-4)
    assert not (got_t[used] == got_c[used]).any()


def test_candidates_group_by_target_in_slot_order_whatever_the_ranges():
    """insert's counting sort in ranges of slots, one a thread: entry for entry the serial sort's (each
    target's candidates in slot order), with EMPTY slots and targets that get none."""
    rng = np.random.default_rng(21)
    n = 301
    targets = np.where(rng.random((97, 13)) < 0.8, rng.integers(0, n - 50, (97, 13)), EMPTY).astype(np.int32)
    cands = rng.integers(0, n, targets.shape).astype(np.int32)
    keys = rng.random(targets.shape).astype(np.float32)
    flat = targets.ravel()
    order = np.argsort(np.where(flat == EMPTY, n, flat), kind="stable")[:(flat != EMPTY).sum()]
    for parts in (1, 2, 3, 7, 40):
        starts, gc, gk = compiled.kernels._group(targets, cands, keys, n, parts)
        per_target = np.bincount(flat[flat >= 0], minlength=n)
        np.testing.assert_array_equal(starts, np.concatenate([[0], np.cumsum(per_target)]))
        np.testing.assert_array_equal(gc, cands.ravel()[order])
        np.testing.assert_array_equal(gk, keys.ravel()[order])


def test_exact_l2_keys_and_row_keys_equal_the_reference():
    x = rows_with_twins(503, 11, seed=3, twins=False)
    x[1:500:2] = x[0:500:2]  # rows 2i and 2i + 1 are twins, and list each other
    state = random_init(x, 9, L2, np.random.default_rng(2), compiled=True)
    state.ids[:500, 0] = np.arange(500) ^ 1
    state.ids[::5, -3:] = EMPTY
    ref = copy.deepcopy(state)
    exact_l2_keys(x, ref, compiled=False)
    exact_l2_keys(x, state, compiled=True)
    np.testing.assert_allclose(state.dists, ref.dists, rtol=1e-5, atol=1e-5)
    assert (state.dists[:500, 0] == 0).all() and (state.ids[:500, 0] == np.arange(500) ^ 1).all()
    np.testing.assert_array_equal(np.sort(state.ids, axis=1), np.sort(ref.ids, axis=1))
    sq = np.einsum("ij,ij->i", x, x)
    rows = np.arange(0, len(x), 3)
    for metric in (L2, IP):
        np.testing.assert_allclose(compiled.row_keys(x, sq, rows, state.ids[rows], metric),
                                   descent.row_keys_local(x, sq, rows, state.ids[rows], metric), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("metric,k", [("l2", 1), ("ip", 12)])
def test_gnnd_and_ggm_reach_the_reference_recall(metric, k):
    """Whole descents, compiled and reference: GNND of two shards, then their merge (GGM), the recall target
    met alike (ids differ only where rounding broke a tie differently)."""
    x = rows_with_twins(5003, 16, seed=11)
    half = 2601
    params = GnndParams(k=k)
    rows = np.arange(0, len(x), 5)
    got = {}
    for name, be in (("fast", CpuBackend(threads=2)), ("ref", CpuBackend(reference=True))):
        ga = be.gnnd(x[:half], metric_of(metric), params, seed=4)
        gb = be.gnnd(x[half:], metric_of(metric), params, seed=5)
        gb.ids[gb.ids >= 0] += half
        ma, mb = be.ggm(ShardPart(0, x[:half], ga), ShardPart(half, x[half:], gb), metric_of(metric), params, seed=6)
        got[name] = recall_at(np.concatenate([ma.ids, mb.ids])[rows], x, rows, min(k, 10), metric)
    assert got["fast"] >= 0.99 and abs(got["fast"] - got["ref"]) <= 0.005, got


def test_threads_are_checked_and_used():
    """--threads reaches the backend, which runs its calls' kernels on that many threads."""
    import numba

    be = get_backends("cpu", threads=1)[0]
    assert be.threads == 1
    be.gnnd(rows_with_twins(100, 4, seed=1), L2, GnndParams(k=3), seed=0)
    assert numba.get_num_threads() == 1
    CpuBackend().gnnd(rows_with_twins(100, 4, seed=1), L2, GnndParams(k=3), seed=0)
    assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS
    with pytest.raises(BadInput, match="--threads 0"):
        CpuBackend(threads=0)


def test_tree_init_seeds_near_neighbours():
    """RP-tree lists: valid graphs with exact keys, far nearer than random ones; duplicated rows (no
    hyperplane separates them) still end in leaves; without trees the lists fill with random rows."""
    x = synth(3001, 24, seed=8)
    x[:400] = x[0]  # one clump of identical rows
    state = tree_init(x, 16, L2, 4, np.random.default_rng(0))
    check_graph(state.ids, state.dists, x, "l2", rtol=1e-2)
    assert state.is_new.all()
    rows = np.arange(400, len(x), 3)
    assert recall_at(state.ids[rows], x, rows, 10) >= 0.5
    assert recall_at(random_init(x, 16, L2, np.random.default_rng(0)).ids[rows], x, rows, 10) < 0.05
    rand = tree_init(x[400:901], 16, IP, 0, np.random.default_rng(1))  # no trees: random rows only
    check_graph(rand.ids, rand.dists, x[400:901], "ip", rtol=1e-2)
    for _ in range(3):  # the random rows follow the seed alone, whichever thread fills a list and whatever it drew
        tree_init(x[:700], 16, L2, 0, np.random.default_rng(5))
        again = tree_init(x[400:901], 16, IP, 0, np.random.default_rng(1))
        np.testing.assert_array_equal(again.ids, rand.ids)


def test_split_rows_keep_the_split_sides():
    """The trees split int8 rows: centred, one scale, clipped. Against float32, the side of the hyperplane halfway
    between two rows agrees for nearly every row, also where every row is offset far from the origin (without
    the centring all would round to the same values); identical rows give zeros, not a division by zero."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2001, 37)).astype(np.float32) + 100.0
    q = split_rows(x).astype(np.float32)
    agree = []
    for a, b in rng.integers(0, len(x), (40, 2)):
        if a == b:
            continue
        exact = (x - (x[a] + x[b]) / 2) @ (x[a] - x[b]) > 0
        approx = (q - (q[a] + q[b]) / 2) @ (q[a] - q[b]) > 0
        agree.append((exact == approx).mean())
    assert np.mean(agree) >= 0.97 and q.std() > 10
    np.testing.assert_array_equal(split_rows(np.ones((9, 5), np.float32)), 0)


def test_wide_rows_of_few_intrinsic_dimensions_are_split_in_their_principal_directions():
    """300-d rows of 12 intrinsic dimensions are split in BOUND_DIMS principal coordinates: the side of the
    hyperplane halfway between two rows agrees with the full rows' for nearly every row, and the trees seed lists
    as well as from the full rows. Rows whose variance is spread over every dimension keep their full width, as
    do narrow rows (nothing to save there)."""
    rng = np.random.default_rng(6)
    x = synth(3000, 300, seed=3)
    p = principal_rows(x)
    assert p is not None and p.shape == (3000, BOUND_DIMS) and p.dtype == np.int8
    np.testing.assert_array_equal(split_rows(x), p)
    q = p.astype(np.float32)
    agree = []
    for a, b in rng.integers(0, len(x), (40, 2)):
        if a != b:
            exact = (x - (x[a] + x[b]) / 2) @ (x[a] - x[b]) > 0
            agree.append((exact == ((q - (q[a] + q[b]) / 2) @ (q[a] - q[b]) > 0)).mean())
    assert np.mean(agree) >= 0.97, np.mean(agree)
    full = _quantise(x, x.mean(axis=0), np.float32(4.0))
    rows = rng.choice(len(x), 300, replace=False)
    seeded = [recall_at(tree_init(x, 16, L2, 8, np.random.default_rng(2), r).ids[rows], x, rows, 10) for r in (p, full)]
    assert seeded[0] >= seeded[1] - 0.03 and seeded[1] >= 0.5, seeded
    spread = rng.standard_normal((3000, 300)).astype(np.float32)
    assert principal_rows(spread) is None and split_rows(spread).shape == (3000, 300)
    assert principal_rows(synth(3000, 96, seed=3)) is None


def test_rows_in_order_are_made_in_place_only_in_an_array_the_caller_owns():
    """The descent's rows in locality order: in the widened copy itself (every cycle of the permutation followed,
    the identity, a single long cycle, one row), else a new array with the caller's rows untouched."""
    from bigknn.backends.cpu.rptree import rows_in_order

    rng = np.random.default_rng(8)
    x = rng.standard_normal((1001, 13)).astype(np.float32)
    n = len(x)
    for order in (rng.permutation(n), np.arange(n), np.roll(np.arange(n), 1), rng.permutation(n)[::-1]):
        order = order.astype(np.int32)
        mine = x.copy()
        got = rows_in_order(mine, order, own=True)
        assert got is mine
        np.testing.assert_array_equal(got, x[order])
        theirs = x.copy()
        got = rows_in_order(theirs, order, own=False)
        assert got is not theirs
        np.testing.assert_array_equal(got, x[order])
        np.testing.assert_array_equal(theirs, x)
    one = x[:1].copy()
    np.testing.assert_array_equal(rows_in_order(one, np.zeros(1, np.int32), own=True), x[:1])


def test_a_gnnd_leaves_the_callers_rows_as_they_were(tmp_path):
    """The descent's rows in locality order are made in place only in the backend's own widened copy: float32 rows
    given as a writable memory map (an ndarray subclass, which the widening sees through a view of the same memory)
    or as a strided view come back unchanged."""
    x = synth(3001, 24, seed=4)
    mapped = np.memmap(tmp_path / "rows.f32", dtype=np.float32, mode="w+", shape=x.shape)
    mapped[:] = x
    wide = np.zeros((len(x), 48), np.float32)
    wide[:, ::2] = x
    for rows in (mapped, wide[:, ::2]):
        g = CpuBackend().gnnd(rows, L2, GnndParams(k=8), seed=1)
        np.testing.assert_array_equal(rows, x)
        rows_checked = np.arange(0, len(x), 7)
        assert recall_at(g.ids[rows_checked], x, rows_checked, 8) >= 0.9
    mapped.flush()
    np.testing.assert_array_equal(np.fromfile(tmp_path / "rows.f32", np.float32).reshape(x.shape), x)


def test_half_rows_widen_to_numpys_floats_bit_for_bit():
    """halves.as_float looks every half value up in a table on every core; it must give NumPy's cast exactly:
    every one of the 65,536 bit patterns (subnormals, -0, Inf, NaN payloads), strided and empty inputs, and
    other dtypes through NumPy itself."""
    from bigknn.backends.cpu.halves import as_float

    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16).reshape(256, 256)
    np.testing.assert_array_equal(as_float(every).view(np.uint32), every.astype(np.float32).view(np.uint32))
    strided = every[::3, 1::2]
    got = as_float(strided)
    assert got.flags.c_contiguous and got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), strided.astype(np.float32).view(np.uint32))
    assert as_float(np.empty((0, 7), np.float16)).shape == (0, 7)
    rows = np.arange(12, dtype=np.uint8).reshape(3, 4)
    np.testing.assert_array_equal(as_float(rows), rows.astype(np.float32))
    buffer = np.full(every.size + 5, np.nan, np.float32)
    got = as_float(strided, into=buffer)
    assert np.shares_memory(got, buffer) and got.shape == strided.shape
    np.testing.assert_array_equal(got.view(np.uint32), strided.astype(np.float32).view(np.uint32))


def test_an_exact_search_of_half_rows_over_many_tiles_equals_the_float_ones():
    """The exact search widens each tile of half rows into one reused buffer: over more than one tile (the last
    one short), on every path (the first keys, then the bounds of wide rows), the lists are those of the same
    rows given as float32."""
    from bigknn.backends.cpu.exact import TILE_COLS, exact_knn

    rng = np.random.default_rng(9)
    for dim in (12, BOUND_DIMS * 4 + 3):
        rows = rng.standard_normal((TILE_COLS + 777, dim)).astype(np.float16)
        queries = rows[rng.choice(len(rows), 300, replace=False)]
        for metric in (L2, IP):
            half = exact_knn(queries, 7, metric, [(5, rows)], compiled=True)
            full = exact_knn(queries, 7, metric, [(5, rows.astype(np.float32))], compiled=True)
            np.testing.assert_array_equal(half.ids, full.ids)
            np.testing.assert_array_equal(half.dists, full.dists)
