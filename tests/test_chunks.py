"""Direct chunk I/O of the store's arrays (bigknn.shards.chunks): bit-exact agreement with zarr in both
directions (edge chunks and their checksums, chunks zarr left unwritten as all fill value in arrays without
checksums, row ranges), and the fall back to zarr for layouts it does not handle."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import zarr

import bigknn.shards.store as store_mod
from bigknn.core.errors import Damaged
from bigknn.core.params import GnndParams
from bigknn.core.knn_graph import KnnGraph
from bigknn.shards import Manifest, ShardEntry, Store, checksums, chunk_writes, chunks

SMALL_CHUNK_BYTES = 320  # several chunks and an edge chunk for the hundred rows used here
ROWS = 101
# (start, stop) row ranges: whole, empty, inside one chunk, across borders, negative, past the end
RANGES = [(0, None), (0, 0), (5, 5), (9, 3), (3, 17), (7, 41), (39, 41), (40, 81), (-13, None), (-50, -20),
          (60, 10_000), (100, 101), (101, 200)]


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(store_mod, "CHUNK_BYTES", SMALL_CHUNK_BYTES)


@contextmanager
def zarr_chunk_io_refused():
    """zarr may still create array metadata, but can neither open an array nor move chunk data: whatever
    reads or writes inside the block went through the fast path."""
    def refuse(*args, **kwargs):
        raise AssertionError("zarr used for chunk data")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(zarr, "open_array", refuse)
        m.setattr(zarr.Array, "__getitem__", refuse)
        m.setattr(zarr.Array, "__setitem__", refuse)
        yield


def new_store(path, **over) -> Store:
    return Store.create(path, Manifest(dim=6, dtype="<f4", metric="l2", k=5, shard_rows=1000, params=GnndParams(), seed=0,
                                       inputs=[], **over))


def zarr_read(array_dir) -> np.ndarray:
    return zarr.open_array(store=str(array_dir), mode="r")[:]


def zarr_write(array_dir, x: np.ndarray, chunk_rows: int, **kwargs) -> None:
    """An array written the old way: all through zarr (without checksums unless ``compressors`` says so)."""
    kwargs.setdefault("compressors", None)
    arr = zarr.create_array(store=str(array_dir), shape=x.shape, chunks=(chunk_rows, x.shape[1]), dtype=x.dtype,
                            overwrite=True, **kwargs)
    arr[:] = x


def chunk_files(array_dir) -> dict[str, bytes]:
    return {str(p.relative_to(array_dir)): p.read_bytes() for p in sorted((array_dir / "c").rglob("*"))
            if p.is_file()}


def assert_identical(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    assert a.tobytes() == b.tobytes()  # bit-exact: NaN, -0.0


def random_rows(rng, rows: int, dim: int, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        x = rng.standard_normal((rows, dim)).astype(dtype)
        x[1, :3] = [np.nan, np.inf, -0.0]
        return x
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=(rows, dim), endpoint=True).astype(dtype)


def chunk_rows_of(array_dir) -> int:
    meta = json.loads((array_dir / "zarr.json").read_text())
    return meta["chunk_grid"]["configuration"]["chunk_shape"][0]


# ---- the store writes and reads through the fast path, bit-exact with zarr ----------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int8, np.float16])
def test_vectors_round_trip_bit_exact_with_zarr(tmp_path, dtype):
    x = random_rows(np.random.default_rng(0), ROWS, 6, dtype)
    store = new_store(tmp_path / "s")
    with zarr_chunk_io_refused():
        store.write_vectors(0, x)
        back = store.read_vectors(0)
        parts = {(start, stop): store.read_vectors(0, start, stop) for start, stop in RANGES}
    array_dir = tmp_path / "s" / "shards" / "0" / "vectors"
    chunk_rows = chunk_rows_of(array_dir)
    assert chunk_rows < ROWS and ROWS % chunk_rows  # several chunks and an edge chunk
    assert_identical(back, x)
    assert_identical(zarr_read(array_dir), x)
    for (start, stop), part in parts.items():
        assert_identical(part, x[start:stop])
    # the files are the very ones zarr writes, edge chunk padding included
    zarr_write(tmp_path / "ref", x, chunk_rows, compressors=checksums.codecs())
    assert chunk_files(array_dir) == chunk_files(tmp_path / "ref")
    assert len(chunk_files(array_dir)) == -(-ROWS // chunk_rows)


def test_large_reads_land_in_huge_page_memory_bit_exact(tmp_path, monkeypatch):
    """Reads from HUGE_PAGE_BYTES on go into memory mapped for huge pages (hostmem.filled_once): the same rows,
    whole and in ranges, and arrays that outlive the read."""
    import bigknn.core.hostmem as hostmem

    monkeypatch.setattr(hostmem, "HUGE_PAGE_BYTES", 1024)  # every read of more than 42 rows x 6 float32
    x = random_rows(np.random.default_rng(1), ROWS, 6, np.float32)
    store = new_store(tmp_path / "s")
    with zarr_chunk_io_refused():
        store.write_vectors(0, x)
        back = store.read_vectors(0)
        parts = {(start, stop): store.read_vectors(0, start, stop) for start, stop in RANGES}
    assert back.base is not None and not back.flags.owndata  # a view of the mapped memory, not np.empty's
    assert_identical(back, x)
    for (start, stop), part in parts.items():
        assert_identical(part, x[start:stop])
    back += 1  # writable, and private to this array
    assert_identical(store.read_vectors(0), x)


@pytest.mark.parametrize("columns_of_wider", [False, True])
def test_graph_round_trip_bit_exact_with_zarr(tmp_path, columns_of_wider):
    """Also from views of the first columns of wider lists (a final graph cut to k: final_columns), which the
    store makes contiguous chunk by chunk."""
    rng = np.random.default_rng(1)
    ids = rng.integers(-1, 1 << 30, size=(ROWS, 7)).astype(np.int32)
    dists = rng.random((ROWS, 7)).astype(np.float32)
    dists[ids == -1] = np.inf
    given = KnnGraph(ids.astype(np.int64), dists)  # converted to int32 on the way
    if columns_of_wider:
        wide_ids, wide_dists = np.full((ROWS, 11), 5, np.int64), np.zeros((ROWS, 11), np.float32)
        wide_ids[:, :7], wide_dists[:, :7] = ids, dists
        given = KnnGraph(wide_ids[:, :7], wide_dists[:, :7])
        assert not given.ids.flags.c_contiguous
    store = new_store(tmp_path / "s")
    with zarr_chunk_io_refused():
        store.write_graph(0, 3, given)
        back = store.read_graph(0, 3)
    assert_identical(back.ids, ids)
    assert_identical(back.dists, dists)
    for name, want in (("ids", ids), ("dists", dists)):
        array_dir = tmp_path / "s" / "shards" / "0" / "graph" / "3" / name
        assert ROWS % chunk_rows_of(array_dir)
        assert_identical(zarr_read(array_dir), want)
        zarr_write(tmp_path / f"ref-{name}", want, chunk_rows_of(array_dir), compressors=checksums.codecs())
        assert chunk_files(array_dir) == chunk_files(tmp_path / f"ref-{name}")


def test_rewrite_with_fewer_rows_leaves_no_stale_chunks(tmp_path):
    rng = np.random.default_rng(2)
    store = new_store(tmp_path / "s")
    store.write_vectors(0, random_rows(rng, ROWS, 6, np.float32))
    x = random_rows(rng, 20, 6, np.float32)
    store.write_vectors(0, x)
    assert_identical(store.read_vectors(0), x)
    assert_identical(zarr_read(tmp_path / "s" / "shards" / "0" / "vectors"), x)


# ---- arrays written by zarr, read through the fast path ----------------------------------------------------
@pytest.mark.parametrize("dtype,fill", [(np.float32, 0), (np.uint8, 0), (np.int32, -1), (np.float32, np.nan),
                                        (np.float16, -np.inf)])
def test_zarr_written_array_with_unwritten_fill_chunks(tmp_path, dtype, fill):
    x = random_rows(np.random.default_rng(3), ROWS, 6, dtype)
    chunk_rows = 8
    x[16:24] = fill  # chunk 2 entirely fill value: zarr does not write it
    x[96:] = fill  # nor the edge chunk
    array_dir = tmp_path / "a"
    zarr_write(array_dir, x, chunk_rows, fill_value=fill)
    files = chunk_files(array_dir)
    assert "c/2/0" not in files and "c/12/0" not in files and {"c/1/0", "c/3/0", "c/11/0"} <= files.keys()
    with zarr_chunk_io_refused():
        whole = chunks.read_rows(array_dir)
        parts = {(start, stop): chunks.read_rows(array_dir, start, stop) for start, stop in RANGES}
    assert_identical(whole, x)
    for (start, stop), part in parts.items():
        assert_identical(part, x[start:stop])


def test_store_reads_vectors_written_the_old_way(tmp_path):
    """A format-1 store written before the fast path: no checksums, all-zero chunks absent; vectors_of gathers
    across borders."""
    store = new_store(tmp_path / "s", format=1)
    x = random_rows(np.random.default_rng(4), ROWS, 6, np.float32)
    x[40:60] = 0
    zarr_write(tmp_path / "s" / "shards" / "0" / "vectors", x, 8)
    assert not (tmp_path / "s" / "shards" / "0" / "vectors" / "c" / "6" / "0").exists()
    store.manifest.shards = [ShardEntry(0, 0, ROWS)]
    rows = np.array([100, 0, 47, 7, 8, 55, 56, 63, 64])
    with zarr_chunk_io_refused():
        assert_identical(store.read_vectors(0, 7, 65), x[7:65])
        gathered = store.vectors_of(rows)
    assert_identical(gathered, x[rows])


def test_truncated_chunk_file_is_an_error(tmp_path):
    x = random_rows(np.random.default_rng(5), ROWS, 6, np.float32)
    zarr_write(tmp_path / "a", x, 8)
    chunk = tmp_path / "a" / "c" / "3" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-4])
    assert_identical(chunks.read_rows(tmp_path / "a", 0, 24), x[:24])
    with pytest.raises(Damaged, match="shorter"):
        chunks.read_rows(tmp_path / "a", 20, 40)


# ---- layouts the fast path does not handle fall back to zarr -----------------------------------------------
@pytest.mark.parametrize("layout", [
    {"compressors": zarr.codecs.ZstdCodec()},
    {"compressors": None, "chunks": (8, 3)},  # chunked across the width
    {"compressors": None, "chunk_key_encoding": {"name": "default", "separator": "."}},
    {"compressors": None, "chunk_key_encoding": {"name": "v2"}},
    {"compressors": None, "shards": (16, 6)},
    {"compressors": None, "filters": zarr.codecs.TransposeCodec(order=(1, 0))},
])
def test_layouts_not_handled_fall_back(tmp_path, layout):
    layout = dict(layout)
    x = random_rows(np.random.default_rng(6), ROWS, 6, np.float32)
    arr = zarr.create_array(store=str(tmp_path / "a"), shape=x.shape, chunks=layout.pop("chunks", (8, 6)),
                            dtype=x.dtype, overwrite=True, **layout)
    arr[:] = x
    files = {str(p.relative_to(tmp_path / "a")): p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file()}
    assert chunks.read_rows(tmp_path / "a", 3, 50) is None
    assert chunk_writes.write_array(tmp_path / "a", np.zeros_like(x)) is False
    assert {str(p.relative_to(tmp_path / "a")): p.read_bytes()
            for p in (tmp_path / "a").rglob("*") if p.is_file()} == files  # declined without writing anything


def test_store_falls_back_to_zarr_for_a_compressed_layout(tmp_path, monkeypatch):
    """If the store's arrays were ever created compressed, writes and reads go through zarr and agree."""
    create_array = zarr.create_array

    def create_compressed(*args, **kwargs):
        return create_array(*args, **{**kwargs, "compressors": [zarr.codecs.ZstdCodec(), *kwargs["compressors"]]})

    monkeypatch.setattr(zarr, "create_array", create_compressed)
    store = new_store(tmp_path / "s")
    rng = np.random.default_rng(7)
    x = random_rows(rng, ROWS, 6, np.float32)
    ids = rng.integers(0, 1000, size=(ROWS, 5)).astype(np.int32)
    dists = rng.random((ROWS, 5)).astype(np.float32)
    store.write_vectors(0, x)
    store.write_graph(0, 1, KnnGraph(ids, dists))
    array_dir = tmp_path / "s" / "shards" / "0" / "vectors"
    assert [c["name"] for c in json.loads((array_dir / "zarr.json").read_text())["codecs"]][1:] == ["zstd", "crc32c"]
    assert chunks.read_rows(array_dir) is None
    assert_identical(store.read_vectors(0), x)
    assert_identical(store.read_vectors(0, 9, 30), x[9:30])
    g = store.read_graph(0, 1)
    assert_identical(g.ids, ids)
    assert_identical(g.dists, dists)


# ---- checksums ------------------------------------------------------------------------------------------
def flip_byte(path, at: int = 5) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_range_read_checks_the_whole_chunk(tmp_path):
    """Rows outside the range asked for, in the same chunk, are read and checked too; other chunks are not."""
    store = new_store(tmp_path / "s")
    x = random_rows(np.random.default_rng(8), ROWS, 6, np.float32)
    store.write_vectors(0, x)
    array_dir = tmp_path / "s" / "shards" / "0" / "vectors"
    chunk_rows = chunk_rows_of(array_dir)
    flip_byte(array_dir / "c" / "1" / "0", at=4)  # row chunk_rows, the chunk's first
    with pytest.raises(Damaged, match="checksum") as info:
        store.read_vectors(0, chunk_rows + 2, chunk_rows + 3)
    assert info.value.where == "shard 0 vectors" and info.value.file.endswith("c/1/0")
    assert_identical(store.read_vectors(0, 0, chunk_rows), x[:chunk_rows])
    assert_identical(store.read_vectors(0, 2 * chunk_rows), x[2 * chunk_rows:])


def test_check_lists_every_damaged_chunk(tmp_path):
    store = new_store(tmp_path / "s")
    store.write_vectors(0, random_rows(np.random.default_rng(9), ROWS, 6, np.float32))
    array_dir = tmp_path / "s" / "shards" / "0" / "vectors"
    (array_dir / "c" / "0" / "0").unlink()
    flip_byte(array_dir / "c" / "2" / "0")
    last = sorted((array_dir / "c").iterdir(), key=lambda p: int(p.name))[-1] / "0"
    last.write_bytes(last.read_bytes()[:-1])
    problems = {Path(d.file).relative_to(array_dir).as_posix(): d.problem for d in chunks.check(array_dir, True)}
    assert problems.keys() == {"c/0/0", "c/2/0", last.relative_to(array_dir).as_posix()}
    assert "missing" in problems["c/0/0"] and "checksum" in problems["c/2/0"]
    # without reading the contents: the missing and the short file, not the flipped byte
    assert {Path(d.file).name for d in chunks.check(array_dir, False)} == {"0"}
    assert len(chunks.check(array_dir, False)) == 2


def test_the_zarr_fallback_finds_missing_and_damaged_chunks(tmp_path, monkeypatch):
    create_array = zarr.create_array
    monkeypatch.setattr(zarr, "create_array", lambda *a, **kw: create_array(
        *a, **{**kw, "compressors": [zarr.codecs.ZstdCodec(), *kw["compressors"]]}))
    store = new_store(tmp_path / "s")
    store.write_vectors(0, random_rows(np.random.default_rng(10), ROWS, 6, np.float32))
    array_dir = tmp_path / "s" / "shards" / "0" / "vectors"
    (array_dir / "c" / "1" / "0").unlink()
    with pytest.raises(Damaged, match="missing"):
        store.read_vectors(0, 0, 3)
    store.write_vectors(0, random_rows(np.random.default_rng(10), ROWS, 6, np.float32))
    flip_byte(array_dir / "c" / "1" / "0", at=-6)
    with pytest.raises(Damaged, match="checksum"):
        store.read_vectors(0)


def test_a_format_2_store_refuses_an_array_without_checksums(tmp_path):
    store = new_store(tmp_path / "s")
    x = random_rows(np.random.default_rng(11), ROWS, 6, np.float32)
    zarr_write(tmp_path / "s" / "shards" / "0" / "vectors", x, 8)  # no checksum codec
    with pytest.raises(Damaged, match="no chunk checksums"):
        store.read_vectors(0)
    old = new_store(tmp_path / "old", format=1)  # a format-1 store reads it as it always did
    zarr_write(tmp_path / "old" / "shards" / "0" / "vectors", x, 8)
    assert_identical(old.read_vectors(0), x)


def test_a_row_set_reads_each_chunk_it_touches_once(tmp_path, monkeypatch):
    """Scattered rows (any order, repeats) come back as asked, each touched chunk read and checked once: a
    build's recall sample had read a whole chunk per row (10 s of a 1M-row build on the GPU machine)."""
    x = random_rows(np.random.default_rng(7), ROWS, 6, np.float32)
    zarr_write(tmp_path / "a", x, 8, compressors=checksums.codecs())
    rows = np.array([99, 3, 3, 17, 8, 15, 64, 2, 99])
    opened = []
    real_open = open
    monkeypatch.setattr(chunks, "open", lambda path, *a, **kw: (opened.append(str(path)), real_open(path, *a, **kw))[1],
                        raising=False)
    with zarr_chunk_io_refused():
        got = chunks.read_row_set(tmp_path / "a", rows)
    assert_identical(got, x[rows])
    chunk_reads = [p for p in opened if "/c/" in p]
    assert sorted(chunk_reads) == sorted(str(tmp_path / "a" / "c" / str(i) / "0") for i in (0, 1, 2, 8, 12))
    chunk = tmp_path / "a" / "c" / "2" / "0"
    data = bytearray(chunk.read_bytes())
    data[5] ^= 1
    chunk.write_bytes(bytes(data))
    with pytest.raises(Damaged, match="checksum"):
        chunks.read_row_set(tmp_path / "a", np.array([17]))
    with pytest.raises(IndexError):
        chunks.read_row_set(tmp_path / "a", np.array([ROWS]))


def test_a_read_into_reused_buffers_gives_the_same_rows_and_checks_them(tmp_path):
    """A reading thread's ReadBuffers: each read returns the rows asked for (a later, larger or smaller read
    of either array included), the buffers are reused rather than reallocated, and a damaged chunk still
    raises."""
    from bigknn.shards.arrays import ReadBuffers

    rng = np.random.default_rng(9)
    ids = rng.integers(0, ROWS, size=(ROWS, 7)).astype(np.int32)
    dists = np.sort(rng.random((ROWS, 7)).astype(np.float32), axis=1)
    store = new_store(tmp_path / "s")
    store.write_graph(0, 1, KnnGraph(ids, dists))
    buffers = ReadBuffers()
    held = None
    for start, stop in RANGES:
        with zarr_chunk_io_refused():
            g = store.read_graph(0, 1, start, stop, buffers=buffers)
        assert_identical(g.ids, ids[start:stop])
        assert_identical(g.dists, dists[start:stop])
        if start == 0 and stop is None:
            held = g.ids.base if g.ids.base is not None else g.ids
    again = store.read_graph(0, 1, 0, None, buffers=buffers)
    assert np.shares_memory(again.ids, held)  # the whole-array buffer, reused
    flip_byte(tmp_path / "s" / "shards" / "0" / "graph" / "1" / "dists" / "c" / "0" / "0", at=4)
    with pytest.raises(Damaged, match="checksum"):
        store.read_graph(0, 1, 0, 2, buffers=buffers)


def test_the_threaded_checksum_equals_the_extensions_at_every_size():
    """Large pieces are checksummed through google-crc32c's C library with the GIL released; the wheel ships
    that library, so the threaded route is the one taken here, and it must agree with the extension's."""
    import google_crc32c

    assert checksums._EXTEND is not None  # the wheel's libcrc32c was found
    x = np.random.default_rng(5).integers(0, 256, (1 << 20) + 7, dtype=np.uint8)
    for n in (0, 1, checksums.THREADED_BYTES - 1, checksums.THREADED_BYTES, 1 << 20, x.size):
        assert checksums.extend(11, x[:n]) == google_crc32c.extend(11, x[:n].tobytes())
    assert checksums.extend(0, x[: 1 << 18].view(np.uint32)) == google_crc32c.extend(0, x[: 1 << 18].tobytes())
    with pytest.raises(ValueError, match="C-contiguous"):
        checksums.extend(0, x[: 1 << 18][::2])
