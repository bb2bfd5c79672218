"""CUDA backend: the device's copies of rows a build keeps and reuses (a shard staged for its recall sample,
rows copied while a stage was queued, copies dropped when device memory runs out), the warm-up beside the caller,
and copies back to the host. Run with ``pytest -m gpu tests/test_gpu_resident.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from bigknn.core.params import GnndParams
from bigknn.core.synth import synth
from bigknn.core.metric import L2

from test_gpu_gnnd import _check_graph, _exact_top, _recall

pytestmark = pytest.mark.gpu


def test_gnnd_reads_the_rows_its_recall_sample_uploaded(cuda_backend):
    """A build stages a shard before its recall sample's exact search: the search reads that copy, and the GNND
    takes it instead of uploading the rows again; the graph is as good as an unstaged one (odd size, k = 1 too)."""
    x = synth(20011, 96, seed=5).astype(np.float32)
    queries = x[:: 997].copy()
    for k in (1, 10):
        params = GnndParams(k=k)
        plain = cuda_backend.gnnd(x, L2, params, seed=1)
        assert cuda_backend.last_stats["rows_kept"] is False
        cuda_backend.stage([x])
        truth = cuda_backend.exact_knn(queries, k, L2, [(0, x)])
        np.testing.assert_array_equal(truth.ids[:, 0], np.arange(0, len(x), 997))  # each query finds itself
        staged = cuda_backend.gnnd(x, L2, params, seed=1)
        assert cuda_backend.last_stats["rows_kept"] is True
        assert not cuda_backend.gpu.resident.has(x)  # taken by the GNND, not kept past it
        rows = np.arange(0, len(x), 67)
        exact = _exact_top(x, rows, k, "l2")
        assert _recall(staged.ids[rows], exact, k) >= _recall(plain.ids[rows], exact, k) - 0.02
        _check_graph(x, staged, params.width(), "l2")


def test_staged_rows_a_call_copied_meanwhile_are_not_uploaded_again(cuda_backend, monkeypatch):
    """Rows a call copied and kept after ``stage`` queued them (it asked for a copy before the stage) are not
    uploaded a second time by the upload ahead: the copy kept stays the call's, the other rows staged with them
    are uploaded."""
    import threading

    import cupy as cp

    from bigknn.backends.cuda import CudaBackend

    backend = CudaBackend()  # a fresh one: its upload-ahead thread is held back below
    first = synth(1001, 16, seed=1).astype(np.float32)
    backend.stage([first])  # starts the upload-ahead thread
    backend._ahead.submit(lambda: None).result()  # and lets it finish that upload
    uploaded: list[np.ndarray] = []
    real = backend.gpu.transfer.h2d

    def h2d(src, *args, **kwargs):
        uploaded.append(src)
        return real(src, *args, **kwargs)

    monkeypatch.setattr(backend.gpu.transfer, "h2d", h2d)
    gate = threading.Event()
    try:
        backend._ahead.submit(gate.wait)  # the uploads staged next wait for the gate
        copied, other = synth(2001, 16, seed=2).astype(np.float32), synth(1003, 16, seed=3).astype(np.float32)
        backend.stage([copied, other])
        with backend.gpu.context():
            own = cp.asarray(copied)  # the call's own copy, kept as a call keeps it
            backend.gpu.resident.put(copied, own)
    finally:
        gate.set()
    backend._ahead.submit(lambda: None).result()  # the uploads queued before it have ended
    assert len(uploaded) == 1 and uploaded[0] is other
    with backend.gpu.context():
        stream = cp.cuda.get_current_stream()
        assert backend.gpu.resident.get(copied, stream) is own
        np.testing.assert_array_equal(cp.asnumpy(backend.gpu.resident.get(other, stream)), other)


def test_the_warm_up_runs_beside_the_caller_and_the_first_call_waits_for_it(cuda_backend):
    """warm_up returns at once (the kernels of calls like the build's compile on a thread of their own), starts
    one warm-up however often it is asked, and a call made meanwhile waits for it and is right (odd size)."""
    from bigknn.backends import CallShape
    from bigknn.backends.cuda import CudaBackend

    backend, said = CudaBackend(), []  # a fresh one (the fixture's, shared, may have warmed up before)
    like = CallShape(37, "float32", L2, GnndParams(k=10))
    assert backend.warm_up(said.append, like) == 0.0
    first = backend._warming
    assert backend.warm_up(said.append, like) == 0.0 and backend._warming is first
    x = synth(5003, 37, seed=9).astype(np.float32)
    g = backend.gnnd(x, L2, GnndParams(k=10), seed=2)
    assert not first.is_alive()
    _check_graph(x, g, GnndParams(k=10).width(), "l2")


def test_a_call_out_of_device_memory_drops_the_kept_copies_and_runs_once_more(cuda_backend, monkeypatch):
    """Memory a call planned on can be gone when it allocates (uploads ahead beside it): the call then runs
    again once every copy kept between calls is dropped, and its result is right; a second failure is raised."""
    import cupy as cp

    from bigknn.backends.cuda import CudaBackend
    from bigknn.backends.cuda import gnnd as gnnd_module

    backend = CudaBackend()
    kept = synth(4001, 16, seed=4).astype(np.float32)
    backend.stage([kept])
    backend._ahead.submit(lambda: None).result()  # the upload ahead is done: one copy kept
    real, kept_bytes = gnnd_module.gnnd, []

    def runs_out_once(gpu, *args):
        kept_bytes.append(gpu.resident.nbytes())
        if len(kept_bytes) == 1:
            raise cp.cuda.memory.OutOfMemoryError(1 << 40, 0, 0)
        return real(gpu, *args)

    monkeypatch.setattr(gnnd_module, "gnnd", runs_out_once)
    x = synth(3001, 16, seed=5).astype(np.float32)
    g = backend.gnnd(x, L2, GnndParams(k=5), seed=1)
    assert kept_bytes == [kept.nbytes, 0]
    _check_graph(x, g, GnndParams(k=5).width(), "l2")
    monkeypatch.setattr(gnnd_module, "gnnd", lambda gpu, *a: (_ for _ in ()).throw(
        cp.cuda.memory.OutOfMemoryError(1 << 40, 0, 0)))
    with pytest.raises(cp.cuda.memory.OutOfMemoryError):
        backend.gnnd(x, L2, GnndParams(k=5), seed=1)


def test_copy_back_into_an_array_touched_ahead_equals_the_device_array(cuda_backend):
    """``Transfer.d2h(src, out)``: the staged copy (past 16 MiB, an odd tail) and the direct one fill the array
    handed in, byte for byte; an array of another shape or dtype is refused."""
    import cupy as cp

    from bigknn.core.hostmem import touched_later

    transfer = cuda_backend.gpu.transfer
    with cuda_backend.gpu.context():
        for n, dtype in ((((48 << 20) + 4097) // 4, cp.int32), (1001, cp.float32)):
            src = cp.arange(n, dtype=dtype).reshape(-1, 1) * 3
            out = touched_later(src.shape, np.dtype(dtype)).result(timeout=60)
            assert transfer.d2h(src, out) is out
            np.testing.assert_array_equal(out, cp.asnumpy(src))
        with pytest.raises(ValueError, match="d2h"):
            transfer.d2h(cp.zeros((10, 2), cp.float32), np.empty((10, 2), np.int32))
