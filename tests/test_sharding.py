"""The sharding pass's block reader: rows checked, prepared and cast as stored, the first bad row named."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import bigknn.engine.sharding_pass as sharding
from bigknn.core.errors import BadInput
from bigknn.formats import open_vectors, write_vectors


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(sharding, "READ_BLOCK_BYTES", 10 * 5 * 8)  # 10 rows of 5 float64 values per block


def vectors(tmp_path, x):
    path = tmp_path / "x.npy"
    write_vectors(path, x)
    return open_vectors(path)


def test_blocks_cover_the_rows_cast_as_stored(tmp_path, small_blocks):
    x = np.random.default_rng(0).standard_normal((97, 5))  # float64 input: float32 as stored
    vf = vectors(tmp_path, x)
    with ThreadPoolExecutor(3) as pool:
        got = sharding.shard_vectors(vf, pool, "l2", np.dtype(np.float32), 13, 71)
        cos = sharding.shard_vectors(vf, pool, "cosine", np.dtype(np.float32), 0, 97)
        picked = sharding.shard_vectors(vf, pool, "l2", np.dtype(np.float32), 0, 4, np.array([2, 40, 41, 96]))
    assert got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, x[13:84].astype(np.float32))
    np.testing.assert_allclose(cos, x / np.linalg.norm(x, axis=1, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(picked, x[[2, 40, 41, 96]].astype(np.float32))


def test_the_first_bad_row_is_named_whichever_block_fails_first(tmp_path, small_blocks):
    x = np.random.default_rng(1).standard_normal((97, 5))
    x[45, 2] = np.inf  # block 4
    x[83, 0] = np.nan  # block 8, which a pool may finish first
    vf = vectors(tmp_path, x)
    with ThreadPoolExecutor(4) as pool, pytest.raises(BadInput, match="row 45 holds NaN or Inf"):
        sharding.shard_vectors(vf, pool, "l2", np.dtype(np.float32), 0, 97)
    with ThreadPoolExecutor(4) as pool, pytest.raises(BadInput, match="row 83 holds NaN or Inf"):
        sharding.shard_vectors(vf, pool, "l2", np.dtype(np.float32), 50, 47)
