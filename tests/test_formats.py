"""Vector and ground-truth formats: exact round trips at odd sizes, and one-line refusals of bad files."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from bigknn.core.errors import BadInput
from bigknn.formats import (
    VECTOR_EXTENSIONS,
    check_and_hash,
    open_vectors,
    truth_writer,
    vectors_writer,
    read_truth,
    write_truth,
    write_vectors,
)

ROWS, DIM = 37, 13


def random_rows(dtype: str, rows: int = ROWS, dim: int = DIM, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.issubdtype(np.dtype(dtype), np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=(rows, dim), endpoint=True, dtype=dtype)
    return rng.standard_normal((rows, dim)).astype(dtype)


def write_vecs(path, x: np.ndarray, dims: np.ndarray | None = None) -> None:
    """TEXMEX layout written by hand: each row is int32 d then the row's values."""
    dims = np.full(len(x), x.shape[1], dtype="<i4") if dims is None else dims
    rows = np.empty(len(x), dtype=[("d", "<i4"), ("x", x.dtype, (x.shape[1],))])
    rows["d"], rows["x"] = dims, x
    rows.tofile(path)


def write_raw_bin(path, header: tuple[int, int], payload: bytes) -> None:
    with open(path, "wb") as f:
        f.write(np.array(header, dtype="<u4").tobytes() + payload)


def refusal(path) -> str:
    """Open ``path``, expect BadInput, and check the message is one line naming the file."""
    with pytest.raises(BadInput) as info:
        open_vectors(path)
    return checked_message(info.value, path)


def checked_message(err: BadInput, path) -> str:
    msg = str(err)
    assert "\n" not in msg
    assert os.path.basename(path) in msg
    assert err.exit_code == 2
    return msg


def assert_reads_back(vf, x: np.ndarray, read_dtype: str) -> None:
    assert (vf.rows, vf.dim) == x.shape
    assert vf.data.shape == x.shape
    whole = vf.read(0, vf.rows)
    assert whole.dtype == np.dtype(read_dtype) and whole.flags.c_contiguous
    np.testing.assert_array_equal(whole, x.astype(read_dtype))
    np.testing.assert_array_equal(vf.read(5, 19), x[5:19].astype(read_dtype))
    assert vf.read(7, 7).shape == (0, x.shape[1])
    seen = np.zeros(vf.rows, dtype=int)
    for start, block in vf.chunks(10):
        np.testing.assert_array_equal(block, x[start:start + len(block)].astype(read_dtype))
        seen[start:start + len(block)] += 1
    assert (seen == 1).all()
    assert [start for start, _ in vf.chunks(10)] == [0, 10, 20, 30]


# --- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("ext,dtype", [(".fbin", "<f4"), (".u8bin", "u1"), (".i8bin", "i1"), (".f16bin", "<f2")])
def test_bin_round_trip(tmp_path, ext, dtype):
    x = random_rows(dtype)
    path = tmp_path / f"x{ext.upper()}"  # extensions are case-insensitive
    write_vectors(path, x)
    assert os.path.getsize(path) == 8 + x.nbytes
    assert np.fromfile(path, dtype="<u4", count=2).tolist() == [ROWS, DIM]
    assert not os.path.exists(f"{path}.tmp")
    vf = open_vectors(path)
    assert vf.dtype == np.dtype(dtype)
    assert_reads_back(vf, x, dtype)


@pytest.mark.parametrize("ext,dtype", [(".fvecs", "<f4"), (".bvecs", "u1"), (".ivecs", "<i4")])
def test_vecs_round_trip(tmp_path, ext, dtype):
    x = random_rows(dtype)
    path = tmp_path / f"x{ext}"
    write_vecs(path, x)
    vf = open_vectors(path)
    assert vf.dtype == np.dtype(dtype)
    assert isinstance(vf.data, np.memmap)  # a view of the mapping, strided past each row's dim field
    assert vf.data.strides == (4 + DIM * np.dtype(dtype).itemsize, np.dtype(dtype).itemsize)
    assert_reads_back(vf, x, dtype)


@pytest.mark.parametrize("dtype", ["<f4", "<f2", "u1", "i1"])
def test_npy_round_trip(tmp_path, dtype):
    x = random_rows(dtype)
    path = tmp_path / "x.npy"
    write_vectors(path, x)
    vf = open_vectors(path)
    assert vf.dtype == np.dtype(dtype)
    assert_reads_back(vf, x, dtype)


def test_npy_float64_reads_as_float32(tmp_path):
    x = random_rows("<f8")
    path = tmp_path / "x.npy"
    np.save(path, x)
    vf = open_vectors(path)
    assert vf.dtype == np.float64 and vf.read_dtype == np.float32
    assert_reads_back(vf, x, "<f4")


def test_npy_fortran_order_reads_c_contiguous(tmp_path):
    x = np.asfortranarray(random_rows("<f4"))
    path = tmp_path / "x.npy"
    np.save(path, x)
    assert_reads_back(open_vectors(path), x, "<f4")


@pytest.mark.parametrize("ext,dtype", [(".fbin", "<f4"), (".u8bin", "u1"), (".npy", "i1")])
def test_streaming_writer_round_trip(tmp_path, ext, dtype):
    x = random_rows(dtype)
    path = tmp_path / f"x{ext}"
    with vectors_writer(path, ROWS, DIM, dtype) as out:
        for start in range(0, ROWS, 8):
            out[start:start + 8] = x[start:start + 8]
        assert not path.exists()  # only a finished file appears under the final name
    assert_reads_back(open_vectors(path), x, dtype)


def test_streaming_writer_interrupted_leaves_nothing(tmp_path):
    path = tmp_path / "x.fbin"
    with pytest.raises(KeyboardInterrupt):
        with vectors_writer(path, ROWS, DIM, "<f4") as out:
            out[:4] = 1.0
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_truth_writer_round_trip(tmp_path):
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 1000, size=(ROWS, 5)).astype(np.int32)
    dists = rng.random((ROWS, 5)).astype(np.float32)
    path = tmp_path / "g.ibin"
    with truth_writer(path, ROWS, 5) as (wi, wd):
        wi[:10], wd[:10] = ids[:10], dists[:10]
        wi[10:], wd[10:] = ids[10:], dists[10:]
    got_ids, got_d = read_truth(path)
    np.testing.assert_array_equal(got_ids, ids)
    np.testing.assert_array_equal(got_d, dists)


def test_writers_refuse_mismatched_dtype(tmp_path):
    with pytest.raises(ValueError):
        write_vectors(tmp_path / "x.fbin", random_rows("u1"))
    with pytest.raises(ValueError):
        write_vectors(tmp_path / "x.u8bin", random_rows("<f4"))
    with pytest.raises(ValueError):
        with vectors_writer(tmp_path / "x.f16bin", ROWS, DIM, np.float32):
            pass
    with pytest.raises(ValueError):
        write_vectors(tmp_path / "x.txt", random_rows("<f4"))
    assert list(tmp_path.iterdir()) == []


def test_failed_write_leaves_no_file(tmp_path, monkeypatch):
    path = tmp_path / "x.fbin"
    write_vectors(path, random_rows("<f4", seed=1))
    before = path.read_bytes()

    def dies(fd):
        raise OSError("disk died")

    monkeypatch.setattr(os, "fsync", dies)  # the crash comes after the bytes are written, before the rename
    with pytest.raises(OSError, match="disk died"):
        write_vectors(path, random_rows("<f4", seed=2))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.fbin"]


def test_truth_round_trip(tmp_path):
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 10**6, size=(ROWS, 7)).astype(np.int64)
    dists = np.sort(rng.random((ROWS, 7)), axis=1)
    path = tmp_path / "gt.ibin"
    write_truth(path, ids, dists)
    assert os.path.getsize(path) == 8 + ROWS * 7 * 8
    got_ids, got_dists = read_truth(path)
    assert got_ids.dtype == np.int32 and got_dists.dtype == np.float32
    np.testing.assert_array_equal(got_ids, ids)
    np.testing.assert_array_equal(got_dists, dists.astype(np.float32))


def test_truth_refuses_bad_files(tmp_path):
    path = tmp_path / "gt.ibin"
    write_raw_bin(path, (4, 3), np.zeros(4 * 3, "<i4").tobytes())  # ids without the distances
    with pytest.raises(BadInput) as info:
        read_truth(path)
    assert "needs 104 bytes but the file has 56" in checked_message(info.value, path)
    with pytest.raises(BadInput) as info:
        read_truth(tmp_path / "gt.fbin")
    assert ".ibin" in checked_message(info.value, tmp_path / "gt.fbin")


# --- refusals ------------------------------------------------------------------------------------


def test_truncated_fbin(tmp_path):
    path = tmp_path / "x.fbin"
    write_vectors(path, random_rows("<f4"))
    with open(path, "r+b") as f:
        f.truncate(8 + ROWS * DIM * 4 - 3)
    msg = refusal(path)
    assert f"needs {8 + ROWS * DIM * 4} bytes but the file has {8 + ROWS * DIM * 4 - 3}" in msg
    assert "truncated" in msg


def test_fbin_with_trailing_bytes(tmp_path):
    path = tmp_path / "x.fbin"
    write_vectors(path, random_rows("<f4"))
    with open(path, "ab") as f:
        f.write(b"\0\0")
    msg = refusal(path)
    assert f"needs {8 + ROWS * DIM * 4} bytes but the file has {8 + ROWS * DIM * 4 + 2}" in msg
    assert "trailing" in msg


def test_header_claims_more_rows_than_present(tmp_path):
    path = tmp_path / "x.u8bin"
    write_raw_bin(path, (1000, 4), bytes(10 * 4))
    assert "n=1000, d=4 needs 4008 bytes but the file has 48" in refusal(path)


def test_empty_file(tmp_path):
    for name in ("x.fbin", "x.fvecs", "x.npy"):
        (tmp_path / name).write_bytes(b"")
        assert "empty file (0 bytes)" in refusal(tmp_path / name)


def test_file_shorter_than_header(tmp_path):
    path = tmp_path / "x.fbin"
    path.write_bytes(b"\1\0\0\0\1\0")
    assert "file is 6 bytes, shorter than its 8-byte header" in refusal(path)
    path = tmp_path / "x.bvecs"
    path.write_bytes(b"\1\0")
    assert "file is 2 bytes, shorter than its 4-byte header" in refusal(path)


def test_zero_rows_or_dims(tmp_path):
    path = tmp_path / "x.fbin"
    write_raw_bin(path, (0, 5), b"")
    assert "n=0, d=5" in refusal(path)
    write_raw_bin(path, (5, 0), b"")
    assert "n=5, d=0" in refusal(path)
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((0, 5), np.float32))
    assert "(0, 5)" in refusal(path)


def test_missing_file(tmp_path):
    assert "no such file" in refusal(tmp_path / "absent.fbin")


def test_unknown_extension(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("1 2 3\n")
    msg = refusal(path)
    assert "'.txt'" in msg
    assert all(ext in msg for ext in VECTOR_EXTENSIONS)


def test_vecs_with_inconsistent_dims(tmp_path):
    x = random_rows("<f4")
    dims = np.full(ROWS, DIM, dtype="<i4")
    dims[29] = DIM + 1  # same row size, so only the per-row scan can notice
    path = tmp_path / "x.fvecs"
    write_vecs(path, x, dims)
    assert f"row 29 says d={DIM + 1} but row 0 says d={DIM}" in refusal(path)


def test_vecs_size_not_a_multiple_of_rows(tmp_path):
    path = tmp_path / "x.bvecs"
    write_vecs(path, random_rows("u1"))
    with open(path, "ab") as f:
        f.write(b"\0")
    assert f"not a multiple of the row size {4 + DIM} bytes" in refusal(path)


def test_npy_wrong_ndim_or_dtype(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(10, dtype=np.float32))
    assert "shape (10,)" in refusal(path)
    np.save(path, np.zeros((3, 4), dtype=np.int64))
    assert "dtype int64" in refusal(path)
    path.write_bytes(b"not an npy file at all")
    assert "not a readable .npy file" in refusal(path)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("ext,dtype", [(".fbin", "<f4"), (".f16bin", "<f2")])
def test_check_names_the_first_non_finite_row(tmp_path, bad, ext, dtype):
    x = random_rows(dtype)
    x[23, 4] = bad
    x[31, 0] = bad
    path = tmp_path / f"x{ext}"
    write_vectors(path, x)
    with pytest.raises(BadInput) as info:
        check_and_hash(open_vectors(path), chunk_rows=10)  # the bad row sits mid-chunk
    msg = checked_message(info.value, path)
    assert msg.endswith("row 23 holds NaN or Inf values")


@pytest.mark.parametrize("name,dtype", [("x.fbin", "<f4"), ("x.u8bin", "u1"), ("x.fvecs", "<f4")])
def test_check_and_hash_passes_clean_files_and_hashes_every_byte(tmp_path, name, dtype):
    path = tmp_path / name
    write_vecs(path, random_rows(dtype)) if name.endswith("vecs") else write_vectors(path, random_rows(dtype))
    want = hashlib.sha256(path.read_bytes()).hexdigest()
    assert check_and_hash(open_vectors(path), chunk_rows=10) == want
    assert check_and_hash(open_vectors(path)) == want


def test_check_and_hash_covers_a_fortran_order_npy(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.asfortranarray(random_rows("<f4")))
    assert check_and_hash(open_vectors(path), chunk_rows=10) == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("ext", [".fbin", ".fvecs"])
def test_take_reads_scattered_rows_across_pages(tmp_path, ext, monkeypatch):
    """Scattered rows (rows of 28 or 32 bytes straddle page boundaries; neighbours share pages) come back
    exactly, with the pages asked for in runs and with the hint skipped where the runs are too many."""
    import bigknn.formats.read as read

    x = random_rows("float32", rows=3000, dim=7, seed=3)
    path = tmp_path / f"x{ext}"
    write_vecs(path, x) if ext == ".fvecs" else write_vectors(path, x)
    vf = open_vectors(path)
    rows = np.sort(np.random.default_rng(4).choice(3000, 400, replace=False))
    rows = np.union1d(rows, [0, 1, 145, 146, 2999])
    np.testing.assert_array_equal(vf.take(rows), x[rows])
    monkeypatch.setattr(read, "WILL_NEED_MAX_RUNS", 1)
    np.testing.assert_array_equal(vf.take(rows[::-1][::-1]), x[rows])
    assert vf.take(np.array([], np.int64)).shape == (0, 7)


def test_half_rows_are_checked_from_their_bits_as_their_values_say():
    """check_rows reads float16 magnitudes from the bits (read._half_peaks): the same peaks as the values in
    float32 on every kind of half (subnormals, -0.0, the largest finite, every NaN payload and sign, +-Inf), also
    for a block that is not contiguous."""
    from bigknn.formats.read import _half_peaks, check_rows

    rng = np.random.default_rng(7)
    bits = rng.integers(0, 1 << 16, size=(4000, 13), dtype=np.uint16)  # every bit pattern, NaNs included
    bits[0] = 0x8000  # -0.0
    bits[1, :] = 0x0001  # the smallest subnormal
    bits[2, 3] = 0x7BFF  # the largest finite
    bits[3, 5] = 0xFC00  # -Inf
    bits[4, 7] = 0xFE01  # a negative NaN with a payload
    block = bits.view(np.float16)
    wide = np.abs(block.astype(np.float32))
    expect = np.where(np.isfinite(wide).all(axis=1), wide.max(axis=1), np.inf)
    np.testing.assert_array_equal(_half_peaks(block), expect)
    np.testing.assert_array_equal(_half_peaks(block[:, ::2]), np.where(np.isfinite(wide[:, ::2]).all(axis=1),
                                                                      wide[:, ::2].max(axis=1), np.inf))
    clean = block[np.isfinite(wide).all(axis=1)]
    check_rows("x.f16bin", 0, clean)  # finite halves pass: none is too small or too large for float32 keys
    with pytest.raises(BadInput, match="row 103 holds NaN or Inf"):
        dirty = clean[:200].copy()
        dirty[103, 2] = np.float16(np.nan)
        check_rows("x.f16bin", 0, dirty)
