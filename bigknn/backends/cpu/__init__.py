"""The CPU backend: the NumPy reference implementation, and the one that runs where no GPU exists, with its
descent loops compiled by numba (kernels.py) unless the reference is asked for."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Iterable

import numpy as np

from bigknn.backends.cpu import descent
from bigknn.backends.cpu.descent import DescentState, Target, cut, descend
from bigknn.backends.cpu.exact import exact_knn
from bigknn.backends.cpu.halves import as_float
from bigknn.backends.cpu.search_calls import SearchReference
from bigknn.backends.base import CallShape
from bigknn.backends.cpu.threads import use_threads
from bigknn.core.errors import BadInput
from bigknn.algorithms.merge_setup import exact_merge, finish_merge, merge_stop_frac, start_merge
from bigknn.core.knn_graph import EMPTY, LOCAL_ID_DTYPE, KnnGraph, ShardPart, drop_self, merge_lists, through
from bigknn.core.metric import Metric
from bigknn.algorithms.partition.nearest import nearest_numpy
from bigknn.core.params import (CPU_AUTO_SAMPLES, CPU_HARD_BELOW, CPU_HARD_SAMPLES, CPU_HARD_WIDTH, EXACT_ROWS,
                                GnndParams)
from bigknn.algorithms.edge_lists import verdict_columns
from bigknn.algorithms.recall_target import Probe, Stopper, make_merge_probe, make_probe
from bigknn.algorithms.search_params import NO_LAMBDA, DiversifyRule


RP_TREES = 20  # RP trees seeding the compiled GNND's lists (rptree.py): fewer iterations than 6 on every family,
# while 48 lifted text's first estimate past the hard-set bar (docs/perf-notes.md, "Measurements behind the constants")


def _row_keys(compiled: bool):
    """The per-row key pass: compiled, or the NumPy reference."""
    if compiled:
        from bigknn.backends.cpu import compiled as fast

        return fast.row_keys
    return descent.row_keys_local


def exact_l2_keys(x: np.ndarray, state: DescentState, compiled: bool) -> None:
    """descent.exact_l2_keys, compiled or not."""
    if compiled:
        from bigknn.backends.cpu import compiled as fast

        fast.exact_l2_keys(x, state)
    else:
        descent.exact_l2_keys(x, state)


def exact_graph(x: np.ndarray, width: int, metric: Metric, compiled: bool = False) -> KnnGraph:
    """The exact graph of a small set: every row's ``width`` nearest others (EMPTY-padded if fewer)."""
    n = len(x)
    g = exact_knn(x, min(width + 1, n), metric, [(0, x)], compiled)
    ids, dists = drop_self(g.ids, g.dists, np.arange(n))
    if not metric.dot_keys:
        state = DescentState(ids.copy(), dists.copy(), np.zeros(ids.shape, bool))
        exact_l2_keys(x, state, compiled)
        ids, dists = state.ids, state.dists
    pad = width - ids.shape[1]
    return KnnGraph(np.pad(ids, ((0, 0), (0, pad)), constant_values=EMPTY),
                    np.pad(dists, ((0, 0), (0, pad)), constant_values=np.inf))


def random_init(x: np.ndarray, k: int, metric: Metric, rng: np.random.Generator,
                compiled: bool = False) -> DescentState:
    """k random neighbours per row (never itself), keys computed, sorted, all NEW.

    Repeated draws within a row are dropped by the merge; the empty slots fill during descent.
    """
    n = x.shape[0]
    sq = np.einsum("ij,ij->i", x, x)
    draw = rng.integers(0, n - 1, size=(n, k), dtype=np.int64)
    rows = np.arange(n)
    draw += draw >= rows[:, None]  # skip self
    ids = draw.astype(LOCAL_ID_DTYPE)
    ids, dists = merge_lists(ids, _row_keys(compiled)(x, sq, rows, ids, metric), k)
    return DescentState(ids, dists, np.ones_like(ids, dtype=bool))


def recall_target(xf: np.ndarray, metric: Metric, params: GnndParams, seed: int, pad_key: np.ndarray | float = np.inf,
                  pair: tuple[ShardPart, ShardPart] | None = None, compiled: bool = False,
                  probe: Probe | None = None) -> Target | None:
    """The recall target of a descent over the rows of ``xf`` (None without one): a probe of its rows with
    their exact neighbours among ``xf``, or for the merge of ``pair`` (xf = [a | b]) among their old lists and
    the other shard (bigknn/algorithms/recall_target.py). Drawn from its own generator, so the descent's draws stay those of an
    untargeted run. The probe's own exact search, timed and scaled to all rows, prices the exact answer that
    may replace a stalled descent (``Stopper.exact_s``): a stalled 1M-row shard must not wait hours for it.
    A ``probe`` given (a GNND's, from the build's recall sample) is used as it is, priced at its own pace."""
    if params.recall <= 0:
        return None
    rng = np.random.default_rng((seed, 1))
    clock = _ExactClock()
    all_pairs = len(xf) * len(xf)
    if probe is None and pair is None:
        def exact(rows, m):
            g = clock.run(lambda: exact_knn(xf[rows], m, metric, [(0, xf)], compiled), len(rows) * len(xf))
            return g.ids, g.dists

        probe = make_probe(len(xf), params.width(), exact, rng)
    elif probe is None:
        a, b = pair

        def exact(rows, m, other_is_b):
            other = b if other_is_b else a
            g = clock.run(lambda: exact_knn(xf[rows], m, metric, [(other.offset, other.vectors)], compiled),
                          len(rows) * len(other.vectors))
            return g.ids, g.dists

        probe = make_merge_probe(a, b, params.width(), exact, rng)
        all_pairs = 2 * len(a.vectors) * len(b.vectors)  # exact_merge: each shard's rows against the other's
    exact_s = clock.predict(all_pairs) if probe.exact_pace is None else probe.exact_pace * all_pairs
    return Target(probe, Stopper(params.recall, params.width(), exact_s),
                  lambda w: params.sample_count(w, CPU_AUTO_SAMPLES), pad_key)


class _ExactClock:
    """Seconds per key of the exact searches run through it: their time over the (query, row) pairs."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.pairs = 0

    def run(self, search: Callable[[], KnnGraph], pairs: int) -> KnnGraph:
        t = time.perf_counter()
        g = search()
        self.seconds += time.perf_counter() - t
        self.pairs += pairs
        return g

    def predict(self, pairs: int) -> float:
        """Seconds of an exact search over ``pairs`` (query, row) pairs at the pace measured."""
        return self.seconds * pairs / max(1, self.pairs)


class CpuBackend(SearchReference):
    """``threads``: cores the compiled loops run on (None: all this process may use). ``reference``: run the
    NumPy reference instead of the compiled loops (the same lists, slower; what the kernels are tested
    against)."""

    name = "cpu"

    def __init__(self, threads: int | None = None, reference: bool = False):
        if threads is not None and threads < 1:
            raise BadInput(f"--threads {threads}", "takes a number of threads >= 1")
        self.threads = threads
        self.compiled = not reference

    def diversify_lists(self, cands: np.ndarray, keys: np.ndarray, table: np.ndarray, metric: Metric,
                        rule: DiversifyRule, width: int) -> tuple[np.ndarray, np.ndarray]:
        """The reference's lists (SearchReference.diversify_lists), the verdicts compiled (diversify_kernels.py)."""
        if not self.compiled:
            return super().diversify_lists(cands, keys, table, metric, rule, width)
        from bigknn.backends.cpu.diversify_kernels import diversify

        use_threads(self.threads)
        verdict = diversify(cands, keys, table, metric, rule)
        return verdict_columns(np, verdict, cands >= 0, rule.sequential, width, NO_LAMBDA)

    def reach_back(self, table: np.ndarray, lists: np.ndarray, list_index: np.ndarray, x: np.ndarray,
                   z: np.ndarray, z_ids: np.ndarray) -> np.ndarray:
        """SearchReference.reach_back, compiled (diversify_kernels.py)."""
        if not self.compiled:
            return super().reach_back(table, lists, list_index, x, z, z_ids)
        from bigknn.backends.cpu.diversify_kernels import reach_back

        use_threads(self.threads)
        return reach_back(table, lists, list_index, x, z, z_ids)

    def gnnd(self, x: np.ndarray, metric: Metric, params: GnndParams, seed: int, on_iter=None,
             probe: Probe | None = None) -> KnnGraph:
        use_threads(self.threads)
        xf = as_float(x)
        if len(xf) <= EXACT_ROWS:
            return exact_graph(xf, params.width(), metric, self.compiled)
        if not self.compiled:
            return self._descent(xf, metric, params, seed, on_iter, probe)
        from bigknn.backends.cpu.rptree import locality_order, rows_in_order, split_rows

        split = split_rows(xf)  # the order's tree and the seeding trees split the same rows
        order = locality_order(split, params.width(), seed)
        own = not np.may_share_memory(xf, x)  # a widened copy; never the caller's rows, even seen through a view
        g = self._descent(rows_in_order(xf, order, own), metric, params, seed, on_iter,
                          None if probe is None else in_order(probe, order), split[order])
        return from_order(g, order)

    def _descent(self, xf: np.ndarray, metric: Metric, params: GnndParams, seed: int, on_iter,
                 probe: Probe | None, split: np.ndarray | None = None) -> KnnGraph:
        """GNND of the float rows ``xf`` from RP-tree seeds (compiled; ``split``: xf's split rows, if made) or
        random lists (the NumPy reference)."""
        rng = np.random.default_rng(seed)
        width = params.width()
        if self.compiled:  # RP-tree seeds, drawn from their own generator (rptree.py)
            from bigknn.backends.cpu.rptree import tree_init

            state = tree_init(xf, width, metric, RP_TREES, np.random.default_rng((seed, 2)), split)
        else:
            state = random_init(xf, width, metric, rng)
        target = recall_target(xf, metric, params, seed, compiled=self.compiled, probe=probe)
        if target is not None and params.samples == 0:  # a hard set (first estimate low) takes more samples
            target.hard_below = CPU_HARD_BELOW
            target.hard_samples_at = lambda w: max(CPU_HARD_SAMPLES, params.sample_count(w, CPU_AUTO_SAMPLES))
            target.hard_width = CPU_HARD_WIDTH
        descend(xf, state, metric, params.sample_count(cap=CPU_AUTO_SAMPLES), params.iters, params.min_update_frac, rng,
                on_iter=on_iter, target=target, compiled=self.compiled)
        if target is not None and target.stopper.fell_short():
            target.stopper.exact_instead()
            g = exact_graph(xf, width, metric, self.compiled)
            return KnnGraph(g.ids, g.dists, target.stopper.report())
        cut(state, width)
        if not metric.dot_keys:
            exact_l2_keys(xf, state, self.compiled)
        return KnnGraph(state.ids, state.dists, target.stopper.report() if target else None)

    def spanning(self, others: list) -> None:
        """None: one CPU worker already runs on every core it was given (make_backends makes just one)."""
        return None

    def ggm(self, a: ShardPart, b: ShardPart, metric: Metric, params: GnndParams, seed: int,
            on_iter=None, vias: list[ShardPart] | None = None) -> tuple[KnnGraph, KnnGraph]:
        use_threads(self.threads)
        rng = np.random.default_rng(seed)
        xf = as_float(np.concatenate([a.vectors, b.vectors]))
        setup = start_merge(a, b, rng, vias)
        fill = setup.fill_mask
        sq = np.einsum("ij,ij->i", xf, xf)
        filled = np.nonzero(fill.any(axis=1))[0]  # rows with a fill: the last setup.fill columns
        setup.dists[filled, -setup.fill:] = _row_keys(self.compiled)(xf, sq, filled, setup.ids[filled, -setup.fill:],
                                                                     metric)
        ids, dists, is_new = merge_lists(setup.ids, setup.dists, setup.ids.shape[1], extra=fill)
        dists = np.where(ids == EMPTY, setup.bound[:, None], dists)
        state = DescentState(ids, dists, is_new)
        stop = merge_stop_frac(params.min_update_frac, len(a.vectors), len(b.vectors))
        width = ids.shape[1]
        target = None if vias else recall_target(xf, metric, params, seed, setup.bound, (a, b), self.compiled)
        samples = params.sample_count(cap=CPU_AUTO_SAMPLES, seeded=bool(vias))
        descend(xf, state, metric, samples, params.merge_iters, stop, rng,
                part=setup.part, on_iter=on_iter, target=target, compiled=self.compiled)
        if target is not None and target.stopper.fell_short():
            target.stopper.exact_instead()
            ga, gb = exact_merge(a, b, width, lambda own, other, m: exact_knn(
                own.vectors, m, metric, [(other.offset, other.vectors)], self.compiled))
        else:
            cut(state, width)
            if not metric.dot_keys:
                exact_l2_keys(xf, state, self.compiled)
            ga, gb = finish_merge(a, b, state.ids, state.dists)
        ga.report = gb.report = target.stopper.report() if target else None
        return ga, gb

    def exact_knn(self, queries: np.ndarray, k: int, metric: Metric,
                  blocks: Iterable[tuple[int, np.ndarray]]) -> KnnGraph:
        return exact_knn(queries, k, metric, blocks, self.compiled)

    def nearest_centroids(self, x: np.ndarray, count: int, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """NumPy's GEMM by blocks (nearest_numpy), not the exact k-NN: much faster against a few centroids."""
        return nearest_numpy(x, count, centroids)

    @property
    def last_stats(self) -> dict:
        return {}

    def memory_budget(self) -> None:
        """No device memory bounds a CPU shard (bigknn/operations/plan_model.py sizes them)."""
        return None

    def warm_up(self, say: Callable[[str], None], like: CallShape | None = None) -> float:
        """numba compiles the loops on a machine's first run (minutes on 2 cores), then loads them (warmup.py);
        one signature each, whatever ``like`` says."""
        from bigknn.backends.cpu.warmup import warm_up

        return warm_up(self, say)

    def stage(self, arrays: Iterable[np.ndarray]) -> None:
        """Nothing to copy ahead: the CPU computes on the host arrays themselves."""


def available() -> bool:
    """The CPU backend runs everywhere (the registry's availability check)."""
    return True


def make_backends(gpus: list[int] | str | None, gpu_mem_bytes: int | None, threads: int | None) -> list[CpuBackend]:
    """A single CPU worker on ``threads`` cores (None: all); ``gpus`` and ``gpu_mem_bytes`` are a device's."""
    return [CpuBackend(threads=threads)]


def in_order(probe: Probe, order: np.ndarray) -> Probe:
    """A GNND's probe with its rows and truth renumbered to the rows' positions in ``order``."""
    at = np.empty(len(order), np.int64)
    at[order] = np.arange(len(order))
    truth = np.asarray(probe.truth_ids)
    return replace(probe, rows=at[np.asarray(probe.rows)],
                   truth_ids=through(at, truth).astype(truth.dtype))


def from_order(g: KnnGraph, order: np.ndarray) -> KnnGraph:
    """A graph of the rows ``x[order]`` as the graph of ``x``: rows put back and ids mapped."""
    ids, dists = np.empty_like(g.ids), np.empty_like(g.dists)
    ids[order] = through(order, g.ids)
    dists[order] = g.dists
    return KnnGraph(ids, dists, g.report)
