"""One GNND whose lists span two GPUs (bigknn/backends/cuda/spanning.py) against the same GNND on one GPU:
graph invariants (full lists, no self or repeated id, keys exact and ascending) and recall within 0.002 of the
one-GPU graph's. Marked ``gpu``; skipped where fewer than two devices are present."""

from __future__ import annotations

import numpy as np
import pytest

from bigknn.core.metric import metric as metric_of
from bigknn.core.params import GnndParams
from bigknn.core.synth import synth

from test_gpu_gnnd import _check_graph, _exact_top, _normalise, _quantise, _recall

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def two_gpus():
    from bigknn.backends.cuda import cuda_available
    from bigknn.backends.cuda.gpu import Gpu

    if not cuda_available():
        pytest.skip("CuPy or a CUDA device is not available")
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("a descent across GPUs needs two devices")
    return [Gpu(device=0), Gpu(device=1)]


def _matches_one_gpu(gpus, cuda_backend, x, k, metric):
    """The descent spanning ``gpus`` gives exact keys, no self or repeated ids, and the recall of one GPU's
    descent at the same seed and iterations, within 0.005: atomics' order makes the two descents differ, and on
    1,000 rows at 10 the difference of two recalls near 0.99 has a standard error of about 0.0014."""
    from bigknn.backends.cuda.spanning import spanning_gnnd

    params = GnndParams(k=k, iters=12, min_update_frac=0.001, recall=0.0)
    span = spanning_gnnd(gpus, x, metric_of(metric), params, seed=3)
    one = cuda_backend.gnnd(x, metric_of(metric), params, seed=3)
    _check_graph(x, span, params.width(), metric)
    rows = np.random.default_rng(1).choice(len(x), 1000, replace=False)
    at = min(10, k)
    exact = _exact_top(x, rows, at, metric)
    assert _recall(span.ids[rows], exact, at) >= _recall(one.ids[rows], exact, at) - 0.005


@pytest.mark.parametrize("n,d,k,dtype,metric", [
    (20011, 96, 32, np.float32, "l2"),
    (12007, 128, 16, np.uint8, "l2"),
    (9001, 384, 1, np.float32, "ip"),
    (8009, 64, 48, np.float16, "l2"),
])
def test_spanning_gnnd_matches_one_gpu(cuda_backend, two_gpus, n, d, k, dtype, metric):
    """Two GPUs, each row type, k = 1 and lists past the minimum, odd sizes, duplicate rows."""
    x = synth(n, d, seed=n)
    x = _normalise(x) if metric == "ip" else x
    x = x.astype(dtype) if dtype in (np.float32, np.float16) else _quantise(x, dtype)
    x[n // 2:n // 2 + 7] = x[:7]  # duplicates: ties at key 0
    _matches_one_gpu(two_gpus, cuda_backend, x, k, metric)


@pytest.mark.parametrize("n,d,k,dtype,metric", [(20011, 96, 32, np.float32, "l2"), (9001, 384, 1, np.float32, "ip")])
def test_spanning_gnnd_of_two_parts_on_one_gpu(cuda_backend, n, d, k, dtype, metric):
    """The parts' logic (row ranges, managed arrays, a launch per part) without a second device."""
    from bigknn.backends.cuda.gpu import Gpu

    x = synth(n, d, seed=n)
    x = (_normalise(x) if metric == "ip" else x).astype(dtype)
    _matches_one_gpu([Gpu(device=0), Gpu(device=0)], cuda_backend, x, k, metric)


def test_spanning_gnnd_meets_its_recall_target(two_gpus):
    from bigknn.backends.cuda.spanning import spanning_gnnd

    x = synth(30011, 96, seed=5)
    g = spanning_gnnd(two_gpus, x, metric_of("l2"), GnndParams(k=32), seed=1)
    rows = np.random.default_rng(2).choice(len(x), 2000, replace=False)
    assert _recall(g.ids[rows], _exact_top(x, rows, 10, "l2"), 10) >= 0.99
    assert g.report is not None


def test_a_one_shard_build_on_two_gpus_spans_them(two_gpus, tmp_path):
    """`build` with two CUDA workers and one shard: the first backend spans both GPUs (Backend.spanning), so the
    GNND's stats say two GPUs, and the store's graph reaches the target like a one-GPU build's."""
    from bigknn.backends.cuda import CudaBackend
    from bigknn.core.progress import Reporter
    from bigknn.formats import write_vectors
    from bigknn.operations.build import BuildRequest, build
    from bigknn.operations.evaluate import recall
    from bigknn.shards import Store

    x = synth(30011, 96, seed=6)
    write_vectors(tmp_path / "x.fbin", x)
    backends = [CudaBackend(device=0), CudaBackend(device=1)]
    out = build(BuildRequest(input=tmp_path / "x.fbin", store=tmp_path / "s.knn", params=GnndParams(k=32)),
                backends, Reporter())
    assert out["shards"] == 1
    gnnd = [t for t in out["timeline"] if t["phase"] == "gnnd"]
    assert len(gnnd) == 1 and gnnd[0].get("gpus") == 2, gnnd
    assert recall(Store.open(tmp_path / "s.knn"), backends[0], sample=2000)["recall"] >= 0.99
    assert CudaBackend(device=0).spanning([]) is None
