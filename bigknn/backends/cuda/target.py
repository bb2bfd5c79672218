"""A recall target on the GPU: the probe rows' lists are read off the device after each iteration, and
the lists are widened in place of a stall (bigknn/algorithms/recall_target.py decides; this module moves the arrays)."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from bigknn.core.knn_graph import ShardPart
from bigknn.core.metric import Metric
from bigknn.backends.cuda.compile import MAX_P
from bigknn.backends.cuda.exact import exact_knn, exact_seconds
from bigknn.backends.cuda.gpu import Gpu
from bigknn.backends.cuda.rows import numeric
from bigknn.core.params import GnndParams
from bigknn.algorithms.recall_target import Probe, Stopper, make_merge_probe, make_probe


PROBE_KEY_BYTES = 64 << 20  # scratch of the probe's exact keys: rows gathered per step


class DeviceTarget:
    """Probe + stopper of one descent on the device. ``fits(width, p)``: whether lists of ``width`` with p
    samples still fit the memory budget (a widening that does not fit ends the descent instead).

    The probe rows' keys are recomputed in float32 from ``rows`` (the descent's rows as numbers) before each
    measurement, as the returned lists' keys are: the lists hold half-precision (scaled) or norm-expansion
    keys, and the tie rule compares keys with the exact 10th key (1000 x width distances: milliseconds)."""

    def __init__(self, probe: Probe, stopper: Stopper, params: GnndParams, fits: Callable[[int, int], bool],
                 rows, metric: Metric):
        import cupy as cp

        self.probe = probe
        self.stopper = stopper
        self.params = params
        self.fits = fits
        self.all_rows = rows  # (n, d) device rows, numeric (rows.numeric)
        self.metric = metric
        self.rows = cp.asarray(probe.rows)
        self.p = self.samples(stopper.width)
        self.clock = time.perf_counter()  # when the last iteration (or the descent) started

    def samples(self, width: int) -> int:
        return max(1, min(self.params.sample_count(width), MAX_P))

    def after_iteration(self, ids, keys) -> str:
        """"stop", "go" or "widen", from the probe rows' current lists (reading them waits for the iteration,
        so the clock gives its cost)."""
        ids, keys = self.exact_lists(ids[self.rows])
        now = time.perf_counter()
        action = self.stopper.after(self.probe.measure(ids, keys), now - self.clock)
        self.clock = now
        if action == "widen":
            if not self.fits(self.stopper.width, self.samples(self.stopper.width)):
                return self.stopper.cannot_widen("wider ones do not fit the GPU memory budget")
            self.p = self.samples(self.stopper.width)  # the caller widens the lists (descent.py widened)
        return action

    def exact_lists(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """The probe rows' lists ``ids`` (device, (P, W) local ids) with float32 keys, sorted by key: host arrays."""
        import cupy as cp

        p, w = ids.shape
        d = self.all_rows.shape[1]
        keys = cp.empty((p, w), dtype=cp.float32)
        step = max(1, PROBE_KEY_BYTES // (4 * w * d))
        for i in range(0, p, step):
            q = self.all_rows[self.rows[i:i + step]].astype(cp.float32)[:, None, :]
            nb = self.all_rows[cp.maximum(ids[i:i + step], 0)].astype(cp.float32)
            keys[i:i + step] = -(nb * q).sum(axis=2) if self.metric.dot_keys else ((nb - q) ** 2).sum(axis=2)
        keys[ids < 0] = np.inf
        order = cp.argsort(keys, axis=1)
        return cp.take_along_axis(ids, order, axis=1).get(), cp.take_along_axis(keys, order, axis=1).get()

def device_target(gpu: Gpu, xd, d: int, metric: Metric, params: GnndParams, seed: int, fits: Callable[[int, int], bool],
                  pair: tuple[ShardPart, ShardPart] | None = None, probe: Probe | None = None) -> DeviceTarget | None:
    """The recall target of a descent over the device rows ``xd`` (local ids; None without a target):
    a probe of its rows with their exact neighbours among ``xd``, or for the merge of ``pair`` (xd = [a | b])
    among their old lists and the other shard (bigknn/algorithms/recall_target.py); a GNND's ``probe`` given by the caller is
    used as it is. ``fits(width, p)``: whether lists of that width still fit the memory budget."""
    if params.recall <= 0:
        return None
    import cupy as cp

    rows_all = numeric(xd, d)
    rng = np.random.default_rng((seed, 1))
    n = xd.shape[0]
    if pair is None:
        exact_s = exact_seconds(n, n, d)
    else:
        na = len(pair[0].vectors)
        exact_s = exact_seconds(na, n - na, d) + exact_seconds(n - na, na, d)
    if probe is None and pair is None:
        def exact(rows, k):
            g = exact_knn(gpu, rows_all[cp.asarray(rows)], k, metric, [(0, rows_all)])
            return g.ids, g.dists

        probe = make_probe(xd.shape[0], params.width(), exact, rng)
    elif probe is None:
        a, b = pair
        na = len(a.vectors)

        def exact(rows, k, other_is_b):
            block = (b.offset, rows_all[na:]) if other_is_b else (a.offset, rows_all[:na])
            g = exact_knn(gpu, rows_all[cp.asarray(rows)], k, metric, [block])
            return g.ids, g.dists

        probe = make_merge_probe(a, b, params.width(), exact, rng)
    return DeviceTarget(probe, Stopper(params.recall, params.width(), exact_s), params, fits, rows_all, metric)
