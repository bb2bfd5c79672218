"""Large arrays filled once (bigknn/core/hostmem.py): below the size, plain arrays; from it, writable, C-contiguous
arrays of the shape and dtype asked for, that keep their memory while any view of them lives."""

from __future__ import annotations

import gc
import resource
import pickle

import numpy as np

from bigknn.core import hostmem


def test_small_arrays_are_plain_and_large_ones_are_usable_arrays_of_their_own_memory(monkeypatch):
    monkeypatch.setattr(hostmem, "HUGE_PAGE_BYTES", 1 << 16)
    small = hostmem.filled_once((10, 3), np.float32)
    assert small.flags.owndata and small.shape == (10, 3) and small.dtype == np.float32
    big = hostmem.filled_once((1000, 33), np.int64)
    assert not big.flags.owndata  # the mapping's, not NumPy's
    assert big.shape == (1000, 33) and big.dtype == np.int64 and big.flags.c_contiguous and big.flags.writeable
    big[:] = np.arange(33)
    view = big[500:502]
    del big
    gc.collect()
    np.testing.assert_array_equal(view, np.tile(np.arange(33), (2, 1)))  # the view kept the memory alive
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(view)), view)
    empty = hostmem.filled_once((0, 7), np.float32)
    assert empty.shape == (0, 7)


def _faults_filling(a: np.ndarray) -> int:
    """Page faults this thread takes writing every byte of ``a``."""
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    a.fill(7)
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


def test_touched_later_hands_over_an_array_whose_pages_the_copy_in_no_longer_faults():
    shape = (hostmem.HUGE_PAGE_BYTES // 4 + 1001, 1)  # past the size, not a multiple of the page
    fresh = hostmem.filled_once(shape, np.float32)
    assert _faults_filling(fresh) >= 16  # 64 MiB of fresh memory: at least 2 MiB a fault
    future = hostmem.touched_later(shape, np.float32)
    touched = future.result(timeout=60)
    assert touched.shape == shape and touched.dtype == np.float32 and touched.flags.c_contiguous
    assert _faults_filling(touched) <= 2
    assert (touched == 7).all()
    small = hostmem.touched_later((3, 5), np.int32).result(timeout=60)
    assert small.shape == (3, 5) and small.dtype == np.int32


def test_row_blocks_fill_every_row_once_on_several_threads(monkeypatch):
    """Every row once; from TOUCH_THREADS * BLOCK_ROWS_MIN rows on, the blocks run at once (each waits at a
    barrier for all the others: blocks run one after another would break it), below that in one call."""
    import threading

    monkeypatch.setattr(hostmem, "BLOCK_ROWS_MIN", 4)
    for rows in (0, 1, 5, 31, 32, 33, 1000):
        seen = np.zeros(rows, np.int32)
        blocks = []
        parallel = rows >= hostmem.TOUCH_THREADS * 4
        expected = -(-rows // -(-rows // hostmem.TOUCH_THREADS)) if parallel else min(rows, 1)
        barrier = threading.Barrier(expected, timeout=60) if parallel else None

        def fill(a, b, seen=seen, blocks=blocks, barrier=barrier):
            seen[a:b] += 1
            blocks.append((a, b))
            if barrier is not None:
                barrier.wait()

        hostmem.in_row_blocks(rows, fill)
        assert (seen == 1).all(), rows
        assert len(blocks) == expected, (rows, blocks)


def test_a_widened_graph_filled_in_blocks_equals_the_padded_one(monkeypatch):
    from bigknn.core.knn_graph import EMPTY, KnnGraph, widened

    monkeypatch.setattr(hostmem, "BLOCK_ROWS_MIN", 4)
    monkeypatch.setattr(hostmem, "HUGE_PAGE_BYTES", 1024)  # the huge-page path, at a test's size
    rng = np.random.default_rng(0)
    g = KnnGraph(rng.integers(0, 999, (999, 5)).astype(np.int32), rng.random((999, 5), dtype=np.float32))
    wide = widened(g, 8)
    pad = ((0, 0), (0, 3))
    np.testing.assert_array_equal(wide.ids, np.pad(g.ids, pad, constant_values=EMPTY))
    np.testing.assert_array_equal(wide.dists, np.pad(g.dists, pad, constant_values=np.inf))
    assert wide.ids.dtype == g.ids.dtype and wide.dists.dtype == g.dists.dtype
