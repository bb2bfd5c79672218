"""A build's kernels compiled (or loaded from CuPy's cache) in the background while the build reads its first
shard, not inside its first GNND and merge.

NVRTC modules (gnnd, cross, ggm, exact) and CuPy's own elementwise kernels (casts, gathers, sorts) compile at
their first launch; on a machine's first run that added 21 s to a 50M build's first GNND and merge
(docs/perf-notes.md, session 35), while the GPU had waited for the input anyway. ``rehearse`` runs a GNND of
two small shards and their merge with the build's element type, width, metric and parameters, which launches
what the build's calls will (the kernels are instantiated per element type, padded width and sample count).
The backend's first real call waits for it (``CudaBackend._call``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from bigknn.backends.base import CallShape
from bigknn.backends.cuda import ggm, gnnd
from bigknn.backends.cuda.gpu import Gpu
from bigknn.core.knn_graph import ShardPart, shard_graph_to_global
from bigknn.core.params import EXACT_ROWS
from bigknn.core.synth import as_dtype, synth

SHARD_ROWS = 2 * EXACT_ROWS + 1  # rows of each rehearsal shard: past EXACT_ROWS, so that GNND descends


def kernel_cache() -> Path:
    """Where CuPy keeps the kernels it compiled (CUPY_CACHE_DIR, else its default)."""
    return Path(os.environ.get("CUPY_CACHE_DIR") or Path.home() / ".cupy" / "kernel_cache")


def cache_is_cold() -> bool:
    """Whether CuPy has compiled nothing on this machine yet (its cache missing or empty): a first run."""
    cache = kernel_cache()
    return not cache.is_dir() or not any(cache.iterdir())


def rehearse(gpu: Gpu, like: CallShape) -> None:
    """GNND of two small shards of ``like``'s rows and their merge, results dropped."""
    x = as_dtype(synth(2 * SHARD_ROWS, like.dim, seed=0), np.dtype(like.dtype))
    a, b = x[:SHARD_ROWS], x[SHARD_ROWS:]
    ga = gnnd.gnnd(gpu, a, like.metric, like.params, seed=0)
    gb = shard_graph_to_global(gnnd.gnnd(gpu, b, like.metric, like.params, seed=1), SHARD_ROWS)
    ggm.ggm(gpu, ShardPart(0, a, ga), ShardPart(SHARD_ROWS, b, gb), like.metric, like.params, seed=0)
