"""The CUDA backend's parts that run without a GPU: the kernel source it compiles and its memory plan."""

from __future__ import annotations

import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from bigknn.backends.cuda import compile as cuda_compile
from bigknn.algorithms.recall_target import MAX_WIDTH, WIDEN_STEP
from bigknn.backends.cuda import memory
from bigknn.backends.cuda.memory import LOG_SLOTS, plan_slots
from bigknn.backends.cuda.rows import HALF_MIN_DIM
from bigknn.core.params import GnndParams

CUDA_DIR = Path(cuda_compile.__file__).parent


def test_kernel_source_defines_every_launched_kernel():
    """The one source NVRTC compiles holds every kernel the Python side launches by name, includes nothing
    (NVRTC gets no include path), and every part of it ships with the package."""
    src = cuda_compile.source()
    assert "#include" not in src
    defined = set(re.findall(r"__global__ void (?:__launch_bounds__\([^;{]*?\)\s*)?(\w+)\(", src))
    launched = set()
    for py in CUDA_DIR.glob("*.py"):
        text = py.read_text()
        launched |= set(re.findall(r'get_function\(f?"(\w+)', text))
        launched |= set(re.findall(r'f"(\w+)<\{', text))
    launched = {name for name in launched if name.startswith(("gnnd_", "ggm_", "knn_"))}
    assert launched and launched <= defined, launched - defined
    pyproject = tomllib.loads((CUDA_DIR.parents[2] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["bigknn.backends.cuda"]
    for name in cuda_compile.SOURCES:
        assert any(fnmatch(name, g) for g in globs), f"{name} is not package data"


def _merge_bytes_before(shard_rows: int, dim: int, itemsize: int, params: GnndParams) -> int:
    """merge_bytes as it was written before its terms were shared with whole_bytes (the reference)."""
    w = params.width()
    wide = min(MAX_WIDTH, w + WIDEN_STEP) if params.recall > 0 else w
    n = 2 * shard_rows
    halves = n * dim * 2 if itemsize == 4 and dim >= HALF_MIN_DIM else 0
    return memory.ggm_bytes(n, dim, itemsize, wide, w, params.sample_count(wide), 1 << LOG_SLOTS) + halves


def _whole_bytes_before(rows: int, dim: int, itemsize: int, params: GnndParams) -> int:
    """whole_bytes as it was written before, likewise."""
    w = params.width()
    wide = min(MAX_WIDTH, w + WIDEN_STEP) if params.recall > 0 else w
    halves = rows * dim * 2 if itemsize == 4 and dim >= HALF_MIN_DIM else 0
    return memory.gnnd_bytes(rows, dim, itemsize, wide, params.sample_count(wide), 1 << LOG_SLOTS) + halves


def test_merge_and_whole_bytes_count_as_before():
    """The room for a widening step and the half-precision copy, now computed once for both models, give the
    bytes the two separate formulas gave, on every side of their thresholds (recall target or none, lists near
    MAX_WIDTH, float32 rows either side of HALF_MIN_DIM, other element sizes, fixed samples)."""
    params = [GnndParams(k=k, recall=recall, list_width=lw, samples=p)
              for k in (1, 10, 32, MAX_WIDTH - WIDEN_STEP + 1, MAX_WIDTH) for recall in (0.0, 0.99)
              for lw in (0, 64) for p in (0, 12)]
    for rows in (1, 1001, 25_000_000):
        for dim in (1, 37, HALF_MIN_DIM - 1, HALF_MIN_DIM, 384):
            for itemsize in (1, 2, 4):
                for q in params:
                    assert memory.merge_bytes(rows, dim, itemsize, q) == _merge_bytes_before(rows, dim, itemsize, q)
                    assert memory.whole_bytes(rows, dim, itemsize, q) == _whole_bytes_before(rows, dim, itemsize, q)


class _Copies:
    def __init__(self, n: int):
        self.n = n

    def drop_oldest(self) -> bool:
        if self.n == 0:
            return False
        self.n -= 1
        return True


class _Gpu:
    """A GPU whose budget grows by ``per_copy`` bytes with each kept copy dropped."""

    def __init__(self, free: int, copies: int, per_copy: int):
        import threading

        self.resident = _Copies(copies)
        self.free, self.copies, self.per_copy = free, copies, per_copy
        self.plan_lock, self.last_need = threading.Lock(), 0

    def budget(self) -> int:
        return self.free + (self.copies - self.resident.n) * self.per_copy


def need(slots: int) -> int:
    return 1000 + 10 * slots


def test_plan_drops_kept_copies_before_fewer_slots():
    gpu = _Gpu(free=need(1 << LOG_SLOTS) - 250, copies=5, per_copy=100)
    assert plan_slots(gpu, need, 32, "gnnd of x") == (LOG_SLOTS, need(1 << LOG_SLOTS))
    assert gpu.resident.n == 2  # three copies made room; the other two stay
    assert gpu.last_need == need(1 << LOG_SLOTS)  # what the uploads ahead must leave free from now on


def test_plan_halves_slots_once_no_copy_is_left():
    gpu = _Gpu(free=need(32) + 5, copies=1, per_copy=10)
    assert plan_slots(gpu, need, 32, "gnnd of x") == (5, need(32))
    assert gpu.resident.n == 0
    narrow = _Gpu(free=need(1 << LOG_SLOTS), copies=0, per_copy=0)
    assert plan_slots(narrow, need, 8, "gnnd of x")[0] == 5  # short lists start from 32 slots


def test_plan_raises_below_sixteen_slots():
    gpu = _Gpu(free=need(16) - 1, copies=0, per_copy=0)
    with pytest.raises(MemoryError, match=r"^ggm of 3 \+ 4 rows needs .* GiB of GPU memory, budget .* GiB: use"):
        plan_slots(gpu, need, 32, "ggm of 3 + 4 rows")
    assert not gpu.plan_lock.locked() and gpu.last_need == 0  # a refusal plans nothing and holds nothing


def test_a_copy_on_its_way_is_waited_for_not_made_again():
    """A call that needs rows being uploaded ahead (expected) gets that copy once it is put, not None (which
    would make it upload the rows a second time); ``take`` hands it over without keeping it; an upload given
    up (settled without a put) leaves the caller to upload."""
    import threading

    import numpy as np

    from bigknn.backends.cuda.resident import ResidentCopies

    copies, host = ResidentCopies(), np.zeros((5, 3), np.float32)
    dev = np.zeros_like(host)  # stands for its device copy
    copies.expect(host)
    assert copies.has(host)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(copies.take(host, stream=None)))
    reader.start()
    reader.join(timeout=0.5)
    assert reader.is_alive() and not got  # waiting for the upload (returning at once would return None)
    copies.put(host, dev)  # no event: ready at once
    reader.join(timeout=30)
    assert len(got) == 1 and got[0] is dev and not copies.has(host)
    other = np.ones((2, 2), np.float32)
    copies.expect(other)
    copies.settle(other)
    assert copies.get(other, stream=None) is None and not copies.has(other)


def test_a_copy_on_its_way_is_not_yet_held():
    """``has`` counts a copy on its way (``stage`` queues no second upload of it); ``holds`` only a copy kept,
    which is what the upload ahead skips."""
    import numpy as np

    from bigknn.backends.cuda.resident import ResidentCopies

    copies, host = ResidentCopies(), np.zeros((4, 2), np.float32)
    copies.expect(host)
    assert copies.has(host) and not copies.holds(host)
    copies.put(host, np.zeros_like(host))
    assert copies.has(host) and copies.holds(host) and not copies.holds(host[:])  # a view is another array
    assert copies.take(host, stream=None) is not None
    assert not copies.has(host) and not copies.holds(host)


def test_an_upload_ahead_skips_rows_a_call_copied_after_they_were_staged(monkeypatch):
    """Rows staged while a call that found no copy yet uploads its own and keeps it (``ResidentCopies.get``
    checked before ``expect``) are not uploaded a second time: the copy kept stays the call's, and only the
    other rows are uploaded. Runs ``_upload_ahead`` on stand-ins for CuPy and the device."""
    import contextlib
    import sys
    import types

    import numpy as np

    from bigknn.backends.cuda import CudaBackend

    backend = CudaBackend()
    gpu = backend.gpu
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(empty=np.empty))
    monkeypatch.setattr(gpu, "context", contextlib.nullcontext)
    monkeypatch.setattr(gpu, "budget", lambda: 1 << 40)
    backend._copy_stream = types.SimpleNamespace(record=lambda: None)
    uploaded: list[np.ndarray] = []

    def h2d(src, dst, stream=None, ahead=False):
        dst[...] = src
        uploaded.append(src)

    monkeypatch.setattr(gpu.transfer, "h2d", h2d)
    copied, other = np.ones((3, 4), np.float32), np.full((2, 4), 2.0, np.float32)
    for a in (copied, other):
        gpu.resident.expect(a)  # as stage does
    own = copied.copy()  # the call's own copy
    gpu.resident.put(copied, own)
    backend._upload_ahead([copied, other])
    assert len(uploaded) == 1 and uploaded[0] is other
    assert gpu.resident.get(copied, stream=None) is own
    np.testing.assert_array_equal(gpu.resident.get(other, stream=None), other)


class _OutOfMemory(MemoryError):
    """Stands for cupy.cuda.memory.OutOfMemoryError."""


def _without_cupy(monkeypatch):
    """A CUDA backend on a machine without CuPy: ``cupy`` is a stand-in with the error above and a pool holding
    3 GB in use and 2.5 GB free on a device with 5 GB free."""
    import sys
    import types

    from bigknn.backends.cuda import CudaBackend

    pool = types.SimpleNamespace(used_bytes=lambda: 3e9, free_bytes=lambda: 2.5e9)
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(memory=types.SimpleNamespace(OutOfMemoryError=_OutOfMemory),
                                                            runtime=types.SimpleNamespace(memGetInfo=lambda: (5e9, 80e9))),
                                 get_default_memory_pool=lambda: pool)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return CudaBackend()


def test_a_retry_after_running_out_starts_once_the_failed_run_is_freed(monkeypatch):
    """The retry after running out of device memory runs once the failed run's arrays are freed: while the error's
    ``except`` clause runs, its traceback holds the failed call's frames and every array in them."""
    import weakref

    backend = _without_cupy(monkeypatch)
    held: list = []
    alive_at_retry: list[bool] = []
    monkeypatch.setattr(backend, "_make_room", lambda why: alive_at_retry.append(held[0]() is not None))

    class Scratch:  # stands for a device array of the failed run
        pass

    def runs_out_once(gpu):
        scratch = Scratch()
        if not held:
            held.append(weakref.ref(scratch))
            raise _OutOfMemory("Out of memory allocating 1,024 bytes (allocated so far: 0 bytes).")
        return "done"

    assert backend._attempts(runs_out_once, ()) == "done"
    assert alive_at_retry == [False]


def test_running_out_of_memory_says_what_the_device_held(monkeypatch):
    """The warning of a call that ran out of device memory gives, beside CuPy's message, the pool's bytes in use
    and free, the device's free bytes, the copies kept between calls and what the call planned: what tells a
    budget that counted unusable pool bytes from a plan that undercounted."""
    backend = _without_cupy(monkeypatch)
    backend.gpu.last_need = 7e9
    said: list[str] = []
    monkeypatch.setattr(backend, "_make_room", said.append)
    tries: list[int] = []

    def runs_out_once(gpu):
        tries.append(1)
        if len(tries) == 1:
            raise _OutOfMemory("Out of memory allocating 1,024 bytes (allocated so far: 0 bytes).")
        return "done"

    assert backend._attempts(runs_out_once, ()) == "done"
    assert said == ["Out of memory allocating 1,024 bytes (allocated so far: 0 bytes) (pool 3.0 GB in use and "
                    "2.5 GB free, 5.0 GB free on the device, 0 B of copies kept, 7.0 GB planned)"]
