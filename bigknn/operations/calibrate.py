"""Rates for ``bigknn plan``: a short calibration run on this machine, or a store's recorded timings.

Calibration times GNND and GGM on the rows the build will see: the input's first rows as the build stores
them (its dtype, its distribution), or synthetic rows of ``--dtype`` when planning from --rows and --dim.
Both run once, untimed, at the smaller size before anything is timed: the first call of each loads or
compiles its kernels (a first GGM timed cold made the plan of a 100M x 128 uint8 build on 2 x H200 say
1.14M pair rows/s where the build merged 2.85M), some only at the sizes that use them (a CPU warm-up of
2,048 rows left the first 5,000-row GNND compiling: 211 rows/s, 6,000 once compiled). Rates change with
shard size (GGM on an H200: 4.9M pair rows/s of 1M-row shards, 3.3M of 16.7M-row shards), so each is
measured at two sizes and scaled to the planned one along the power law through them, rate ∝ rows^-b
(``rate_at``). A store's timings are of one size: no b.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np

from bigknn.algorithms.partition.labelling import LABEL_CHUNK_ROWS, SAMPLE_PER_SHARD, label_chunk, sample_size
from bigknn.algorithms.partition.learn import learn
from bigknn.backends import Backend
from bigknn.core.errors import BadInput
from bigknn.formats import VectorSource
from bigknn.core.knn_graph import ShardPart, shard_graph_to_global
from bigknn.core.metric import Metric, metric as metric_of, prepare_rows, stored_dtype
from bigknn.core.params import GnndParams
from bigknn.shards import Store
from bigknn.core.synth import as_dtype, synth

SMALL_SHARE = 4  # the second calibration size is the first's quarter
EXPONENT_RANGE = (0.0, 0.5)  # b of rate ∝ rows^-b: rates do not grow with size, nor fall faster than 1/sqrt
STEPS_PER_SIZE = 3  # GNND of each of two shards, their merge
SPANNING_STEPS = 2  # the spanning GNND's warm-up and its timed run (calibrate_spanning)
LABEL_TIMED_ROWS = 1 << 21  # rows a calibration labels (four of the labelling pass's chunks)


def calibration_sizes(rows: int, width: int) -> tuple[int, ...]:
    """Shard sizes to time, ascending: ``rows`` and its quarter, or ``rows`` alone where the quarter would
    hold too few rows (four lists' worth) for a rate that says anything."""
    small = rows // SMALL_SHARE
    return (small, rows) if small >= 4 * width else (rows,)


def calibration_steps(sizes: tuple[int, ...]) -> int:
    """Progress steps of ``calibrate``: the warm-up's and each size's."""
    return STEPS_PER_SIZE * (1 + len(sizes))


def sample_rows(vf: VectorSource | None, rows: int, dim: int, dtype: str, metric: str = "l2"
                ) -> tuple[np.ndarray, str]:
    """``rows`` rows to calibrate on and what they are: the input's first rows as the build stores them
    (bigknn/engine/sharding_pass.py), or, without an input, synthetic rows (bigknn/core/synth.py) of ``dtype``."""
    if vf is None:
        return as_dtype(synth(rows, dim, seed=7), dtype), f"{rows:,} synthetic {dtype} rows x {dim}"
    x = prepare_rows(vf.read(0, rows), metric).astype(stored_dtype(metric, vf.read_dtype), copy=False)
    return np.ascontiguousarray(x), f"the first {rows:,} rows x {dim} ({x.dtype.name}) of {vf.path}"


def _time_pair(backend: Backend, x: np.ndarray, rows: int, metric: Metric, params: GnndParams,
               advance: Callable[[int], None]) -> tuple[float, float]:
    """GNND rows/s of two shards of ``rows`` rows of ``x`` and GGM pair rows/s of their merge."""
    t_gnnd, graphs = 0.0, []
    for i in range(2):
        t = time.perf_counter()
        graphs.append(backend.gnnd(x[i * rows:(i + 1) * rows], metric, params, seed=1 + i))
        t_gnnd += time.perf_counter() - t
        advance(1)
    gb = shard_graph_to_global(graphs[1], rows)
    t = time.perf_counter()
    backend.ggm(ShardPart(0, x[:rows], graphs[0]), ShardPart(rows, x[rows:2 * rows], gb), metric, params, seed=3)
    t_ggm = time.perf_counter() - t
    advance(1)
    return 2 * rows / t_gnnd, 2 * rows / t_ggm


def time_labelling(backend: Backend, x: np.ndarray, method: str, shards: int, seed: int = 0) -> dict:
    """What a partitioned build does before its first GNND, timed on ``x`` (rows as stored): learning a
    ``method`` partition of ``shards`` shards on a sample (seconds, once per build) and labelling rows with it
    chunk by chunk as the labelling pass does (rows/s: the backend's nearest-centroid search and the capacity
    rule's host work, which bound the pass where the disk does not), after one untimed chunk. Fewer shards where
    the rows cannot teach that many (a CPU plan's few calibration rows): the rate is then of fewer centroids."""
    nearest = backend.nearest_centroids
    shards = max(2, min(shards, len(x) // SAMPLE_PER_SHARD))  # as many as the calibration rows can teach
    rng = np.random.default_rng((seed, 5))
    sample = x[np.sort(rng.choice(len(x), size=sample_size(len(x), shards), replace=False))]
    t = time.perf_counter()
    part = learn(method, sample, shards, seed, nearest)
    learn_s = time.perf_counter() - t
    room = np.full(part.shards, len(x), np.int64)  # room for every row: first choices, as most rows get
    labelled = min(len(x), LABEL_TIMED_ROWS)
    label_chunk(part, x[:LABEL_CHUNK_ROWS], room.copy(), nearest)  # loads what the first call loads
    t = time.perf_counter()
    for lo in range(0, labelled, LABEL_CHUNK_ROWS):
        label_chunk(part, x[lo:lo + LABEL_CHUNK_ROWS], room, nearest)
    return {"label_rows_per_s": labelled / max(time.perf_counter() - t, 1e-9), "learn_s": learn_s,
            "label_timed": f"a {method} partition of {shards} shards learnt on {len(sample):,} of the calibration "
                           f"rows, {labelled:,} rows labelled"}


def fit_exponent(points: list[dict], key: str) -> float | None:
    """b of rate ∝ rows^-b through the smallest and largest of ``points`` ({"rows", key}), clamped to
    EXPONENT_RANGE; None from one size."""
    lo, hi = points[0], points[-1]
    if hi["rows"] == lo["rows"]:
        return None
    b = -math.log(hi[key] / lo[key]) / math.log(hi["rows"] / lo["rows"])
    return min(max(b, EXPONENT_RANGE[0]), EXPONENT_RANGE[1])


def rate_at(rates: dict, kind: str, rows: int) -> float:
    """``kind``'s rate ("gnnd" or "ggm") at shards of ``rows`` rows: the measured one (at ``rates["at_rows"]``)
    scaled by the fitted exponent; unscaled where there is none (a store's timings, one calibration size)."""
    rate = rates[f"{kind}_rows_per_s"]
    b = rates.get(f"{kind}_exponent")
    return rate if b is None or not rates.get("at_rows") else rate * (rows / rates["at_rows"]) ** -b


def calibrate(backend: Backend, x: np.ndarray, sizes: tuple[int, ...], params: GnndParams, what: str,
              metric: str = "l2", advance: Callable[[int], None] = lambda n: None) -> dict:
    """Rates of GNND (rows/s) and GGM (pair rows/s) on shards of each of ``sizes`` rows (ascending) cut from
    ``x`` (``what``: where its rows came from; at least 2 x the largest size), after an untimed GNND and merge
    of two shards of the smaller size; ``advance(1)`` after each of ``calibration_steps(sizes)`` steps (a
    progress bar or log line: on the CPU this takes a while). Returns the rates at the largest size (``at_rows``), every
    size's (``points``) and the exponents through them."""
    kind = metric_of(metric)
    _time_pair(backend, x, sizes[0], kind, params, advance)  # warm-up: what runs at the sizes timed
    points = []
    for rows in sizes:
        gnnd, ggm = _time_pair(backend, x, rows, kind, params, advance)
        points.append({"rows": rows, "gnnd_rows_per_s": gnnd, "ggm_rows_per_s": ggm})
    last = points[-1]
    return {"gnnd_rows_per_s": last["gnnd_rows_per_s"], "ggm_rows_per_s": last["ggm_rows_per_s"],
            "at_rows": last["rows"], "gnnd_exponent": fit_exponent(points, "gnnd_rows_per_s"),
            "ggm_exponent": fit_exponent(points, "ggm_rows_per_s"), "points": points,
            "source": f"calibration on {backend.name}: {what}, shards of "
                      + " and ".join(f"{n:,}" for n in sizes) + " rows"}


def calibrate_spanning(wide: Backend, x: np.ndarray, sizes: tuple[int, ...], params: GnndParams, gpus: int,
                       metric: str = "l2", advance: Callable[[int], None] = lambda n: None) -> dict:
    """The GNND rate (rows/s) of one shard spanning ``gpus`` devices (``wide``: Backend.spanning) at the largest of
    ``sizes``, after an untimed GNND at the smallest: its kernels are compiled apart (atomics across devices), and
    the rate of one device does not say what spanning gains (docs/perf-notes.md, session 49). ``advance(1)``
    after each of SPANNING_STEPS steps."""
    kind = metric_of(metric)
    wide.gnnd(x[:sizes[0]], kind, params, seed=1)
    advance(1)
    t = time.perf_counter()
    wide.gnnd(x[:sizes[-1]], kind, params, seed=1)
    rate = sizes[-1] / (time.perf_counter() - t)
    advance(1)
    return {"spanning_gnnd_rows_per_s": rate, "spanning_gpus": gpus, "spanning_at_rows": sizes[-1]}


def rates_from_store(store: Store) -> dict:
    """Rows per second of GNND and of GGM (pair rows) from a store's recorded timings: of its shards' one size,
    so not scaled to another (no exponent)."""
    m = store.manifest
    t = m.timings
    rows = {s.id: s.rows for s in m.shards}
    pair_rows = sum(rows[i] + rows[j] for i, j in m.merged)
    if not t.get("gnnd") or not t.get("ggm") or not pair_rows:
        raise BadInput(store.path, "no recorded GNND and GGM timings to take rates from (a finished build has them)")
    rates = {"gnnd_rows_per_s": m.rows / t["gnnd"], "ggm_rows_per_s": pair_rows / t["ggm"],
             "at_rows": round(m.rows / len(m.shards)), "gnnd_exponent": None, "ggm_exponent": None,
             "source": f"timings of {store.path} (one shard size: no exponent)"}
    if m.partition is not None and t.get("partition"):  # its partition pass: learning and labelling, with I/O
        rates.update(label_rows_per_s=m.rows / t["partition"], learn_s=0.0,
                     label_timed=f"the partition pass of {store.path} (learning and labelling, with its read)")
    return rates
