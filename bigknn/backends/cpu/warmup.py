"""The numba kernels compiled before a run's first task, not inside it: a first run on a new machine spends
minutes compiling (``cache=True`` keeps the machine code afterwards), which must neither look like a hung
GNND nor enter the rates, ETAs and recorded timings that ``bigknn plan --store`` reads.

``warm_up`` says so before it compiles, runs GNND and a merge on a small random set (every compiled kernel
takes one signature, so this compiles what the run would), and returns the seconds spent. Once per process.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Callable

import numpy as np
from numba.core.registry import CPUDispatcher

from bigknn.backends.cpu import bounds
from bigknn.backends.cpu.halves import as_float
from bigknn.core.knn_graph import ShardPart, shard_graph_to_global
from bigknn.core.metric import L2
from bigknn.core.params import EXACT_ROWS, GnndParams

COMPILE_NOTE = "about 2 min on 2 cores"  # what a cold cache costs (docs/perf-notes.md, numba's compile cost)
KERNEL_MODULES = ("kernels", "keypass", "rptree", "bounds", "halves")  # the modules whose kernels a build calls
_warm = False


def kernels() -> list[CPUDispatcher]:
    """The compiled kernels a build calls on their own (those inlined into them compile with them)."""
    found = []
    for name in KERNEL_MODULES:
        mod = importlib.import_module(f"bigknn.backends.cpu.{name}")
        found += [v for v in vars(mod).values() if isinstance(v, CPUDispatcher) and v.__module__ == mod.__name__
                  and v.targetoptions.get("inline") != "always"]
    return found


def cache_dir() -> Path:
    """Where numba keeps the compiled kernels (beside the sources, or NUMBA_CACHE_DIR)."""
    return Path(kernels()[0]._cache._cache_path)


def cached() -> bool:
    """Whether every kernel has machine code in the cache for these sources (numba drops an index whose
    source changed); any doubt counts as not cached."""
    try:
        return all(d._cache._cache_file._load_index() for d in kernels())
    except Exception:  # noqa: BLE001 - numba's cache internals moved: say it may compile
        return False


def warm_up(backend, say: Callable[[str], None]) -> float:
    """Compile (or load) the kernels of ``backend`` (a CpuBackend) before a run; ``say`` is told first when
    they are not cached. Returns the seconds it took (0 once done in this process, or for the reference)."""
    global _warm
    if _warm or not backend.compiled:
        return 0.0
    t = time.perf_counter()
    if not cached():
        say(f"compiling CPU kernels (once, {COMPILE_NOTE}; cached in {cache_dir()})")
    rows, dim = EXACT_ROWS + 256, 8
    x = np.random.default_rng(0).standard_normal((2 * rows, dim), dtype=np.float32)
    params = GnndParams(k=4, iters=2)
    a, b = (ShardPart(at, x[at:at + rows], shard_graph_to_global(backend.gnnd(x[at:at + rows], L2, params, 0), at))
            for at in (0, rows))
    backend.ggm(a, b, L2, params, seed=0)
    wide = np.random.default_rng(1).standard_normal((bounds.FILL_COLS + 64, bounds.MIN_DIM), dtype=np.float32)
    backend.exact_knn(wide[:8], 4, L2, [(0, wide)])  # the exact search of wide rows: its bounded merge
    as_float(wide[:1].astype(np.float16))  # half rows' conversion
    _warm = True
    return time.perf_counter() - t
