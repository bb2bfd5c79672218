"""The nearest-centroid search both backends run (nearest.nearest_by_blocks): NumPy's answers as before it was
shared, and the device flow (argmins for count > 1, uploads in the rows' own dtype) run on a NumPy stand-in for
CuPy, so it is checked without a GPU."""

from __future__ import annotations

import contextlib
import sys
import types

import numpy as np
import pytest

from bigknn.algorithms.partition import nearest
from bigknn.algorithms.partition.nearest import nearest_by_blocks, nearest_numpy


def _nearest_before(x: np.ndarray, count: int, centroids: np.ndarray,
                    block_rows: int = nearest.NUMPY_BLOCK_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """nearest_numpy as it was written before it was shared with the CUDA backend (the reference)."""
    c = np.asarray(centroids, dtype=np.float32)
    minus_2c, c_norms = -2.0 * c.T, np.einsum("ij,ij->i", c, c)
    ids = np.empty((len(x), count), np.int64)
    d2 = np.empty((len(x), count), np.float32)
    for lo in range(0, len(x), block_rows):
        xs = np.asarray(x[lo:lo + block_rows], dtype=np.float32)
        keys = xs @ minus_2c
        keys += c_norms
        if count == 1:
            part = keys.argmin(axis=1)[:, None]
        elif count < len(c):
            part = np.argpartition(keys, count - 1, axis=1)[:, :count]
        else:
            part = np.broadcast_to(np.arange(len(c)), keys.shape)
        chosen = np.take_along_axis(keys, part, axis=1)
        order = np.argsort(chosen, axis=1)
        ids[lo:lo + len(xs)] = np.take_along_axis(part, order, axis=1)
        chosen = np.take_along_axis(chosen, order, axis=1) + np.einsum("ij,ij->i", xs, xs)[:, None]
        d2[lo:lo + len(xs)] = np.maximum(chosen, 0.0)
    return ids, d2


def _rows(n: int, dim: int, dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == np.uint8:
        return rng.integers(0, 6, size=(n, dim)).astype(np.uint8)  # few values: many exact ties
    return (rng.normal(size=(n, dim)) * 3).astype(dtype)


def _centroids(x: np.ndarray, c: int, seed: int) -> np.ndarray:
    """``c`` rows of ``x`` as float32, the second a duplicate of the first (tied keys in every row)."""
    out = x[np.random.default_rng(seed).choice(len(x), c, replace=False)].astype(np.float32)
    out[1] = out[0]
    return out


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float16, np.float32])
@pytest.mark.parametrize("count", [1, 3, 16, 23])  # 23: every centroid
def test_numpy_answers_are_those_of_before(dtype, count):
    """Same ids and squared distances, bit for bit, ties included, across block boundaries of both block
    sizes (a short last block; the default's 16,384 crossed)."""
    x = _rows(nearest.NUMPY_BLOCK_ROWS + 1237, 7, dtype, seed=count)
    c = _centroids(x, 23, seed=count)
    for got, want in [(nearest_numpy(x, count, c), _nearest_before(x, count, c)),
                      (nearest_by_blocks(np, x[:1001], count, c, 97), _nearest_before(x[:1001], count, c, 97))]:
        assert got[0].dtype == np.int64 and got[1].dtype == np.float32 and got[0].shape == (len(got[0]), count)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_numpy_answers_are_the_exact_nearest():
    """Not only as before: the true squared distances, ascending, of the true nearest (rows of odd size)."""
    x = _rows(333, 5, np.float32, seed=3)
    c = np.random.default_rng(4).normal(size=(11, 5)).astype(np.float32) * 3
    ids, d2 = nearest_by_blocks(np, x, 4, c, 50)
    truth = ((x[:, None, :].astype(np.float64) - c[None]) ** 2).sum(axis=2)
    np.testing.assert_array_equal(ids, np.argsort(truth, axis=1, kind="stable")[:, :4])
    np.testing.assert_allclose(d2, np.sort(truth, axis=1)[:, :4], rtol=1e-5, atol=1e-4)
    assert nearest_numpy(x[:0], 4, c)[0].shape == (0, 4)


class _NumpyAsCupy(types.ModuleType):
    """Stands for CuPy on a machine without a GPU: NumPy's functions under another module (so the device
    flow runs), a device context that does nothing, uploads recorded, pool frees counted."""

    def __init__(self):
        super().__init__("cupy")
        self.uploads: list[tuple[tuple, np.dtype]] = []
        self.frees = 0
        self.cuda = types.SimpleNamespace(Device=lambda device=None: contextlib.nullcontext(),
                                          memory=types.SimpleNamespace(OutOfMemoryError=MemoryError))

    def __getattr__(self, name: str):
        return getattr(np, name)

    def asarray(self, a, dtype=None):
        self.uploads.append((np.shape(a), np.asarray(a).dtype))
        return np.array(a, dtype=dtype)  # a device copy: never the host array itself

    def asnumpy(self, a):
        return np.array(a)

    def _free(self) -> None:
        self.frees += 1

    def get_default_memory_pool(self):
        return types.SimpleNamespace(free_all_blocks=self._free)

    get_default_pinned_memory_pool = get_default_memory_pool


@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32])
@pytest.mark.parametrize("count", [1, 3, 16, 23])
def test_device_flow_answers_as_numpy(dtype, count):
    """The device flow (argmins where count > 1) finds the same squared distances as NumPy's argpartition,
    bit for bit, and the same ids where keys do not tie; tied keys come lowest id first."""
    x = _rows(1001, 7, dtype, seed=count)
    c = _centroids(x, 23, seed=count)
    ids, d2 = nearest_by_blocks(_NumpyAsCupy(), x, count, c, 97)
    want_ids, want_d2 = nearest_by_blocks(np, x, count, c, 97)
    assert ids.dtype == np.int64 and d2.dtype == np.float32 and ids.shape == d2.shape == (1001, count)
    np.testing.assert_array_equal(d2, want_d2)
    every = np.sort(_keys(x, c, 97), axis=1)[:, :count + 1]  # the chosen keys and the next one
    keys = np.take_along_axis(_keys(x, c, 97), ids, axis=1)
    np.testing.assert_array_equal(keys, every[:, :count])
    tied = keys[:, 1:] == keys[:, :-1]  # with the one before
    if 1 < count < len(c):  # the argmins' order (every centroid: a sort of them all, as NumPy's)
        assert tied.any()  # the duplicate centroid tied somewhere
        assert (ids[:, 1:][tied] > ids[:, :-1][tied]).all()  # lowest id first among ties
    alone = np.ones(ids.shape, bool)  # keys tied with no other key, chosen or not: one id can have them
    alone[:, 1:] &= ~tied
    alone[:, :-1] &= ~tied
    if count < len(c):
        alone[:, -1] &= every[:, -1] != every[:, -2]
    np.testing.assert_array_equal(ids[alone], want_ids[alone])


def _keys(x: np.ndarray, c: np.ndarray, block_rows: int) -> np.ndarray:
    """The ordering keys |c|^2 - 2 x.c both searches compare, by the same blocks (the same GEMMs)."""
    minus_2c, c_norms = -2.0 * c.T, np.einsum("ij,ij->i", c, c)
    return np.concatenate([x[lo:lo + block_rows].astype(np.float32) @ minus_2c + c_norms
                           for lo in range(0, len(x), block_rows)])


def test_argmins_take_the_lowest_id_of_tied_keys_and_mask_what_they_took():
    keys = np.array([[3.0, 1.0, 1.0, 0.5, 1.0], [2.0, 2.0, 2.0, 2.0, 2.0]], np.float32)
    part, chosen = nearest._argmins(np, keys, 3)
    np.testing.assert_array_equal(part, [[3, 1, 2], [0, 1, 2]])
    np.testing.assert_array_equal(chosen, [[0.5, 1.0, 1.0], [2.0, 2.0, 2.0]])


def test_cuda_backend_sends_the_rows_as_they_are_and_frees_its_pools(monkeypatch):
    """CudaBackend.nearest_centroids on the stand-in: uint8 rows go up as uint8 (converted on the device),
    ids come back int64 and distances float32 as NumPy's, and the call frees CuPy's pools at its end."""
    from bigknn.backends.cuda import CudaBackend

    fake = _NumpyAsCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    backend = CudaBackend()
    x = _rows(777, 9, np.uint8, seed=5)
    c = np.random.default_rng(6).uniform(0, 6, size=(16, 9)).astype(np.float32)  # no exact ties
    fake.uploads.clear()
    fake.frees = 0
    for count in (1, 5):
        ids, d2 = backend.nearest_centroids(x, count, c)
        want_ids, want_d2 = nearest_numpy(x, count, c)
        assert ids.dtype == np.int64 and d2.dtype == np.float32 and ids.shape == (777, count)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(d2, want_d2, rtol=1e-5, atol=1e-4)
    assert ((777, 9), np.dtype(np.uint8)) in fake.uploads  # one block: the whole chunk, as it is
    assert all(dt != np.float32 for shape, dt in fake.uploads if shape[0] == 777)
    assert fake.frees >= 2 * 2  # both pools, after each call
