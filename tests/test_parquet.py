"""Parquet and Arrow inputs, many-file datasets, the user's ids and Parquet edge lists (issue 40)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow", reason="the parquet extra (pip install 'bigknn[parquet]')")
import pyarrow.feather as feather  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import bigknn  # noqa: E402
from bigknn.core.errors import BadInput  # noqa: E402
from bigknn.formats import open_source, write_vectors  # noqa: E402
from conftest import CLI_TIMEOUT_S, assert_one_line_error, cli_env, run_cli, run_json  # noqa: E402

ROWS, DIM, K = 900, 8, 5
PARTS, GROUP_ROWS = 3, 70  # row groups that straddle the sharding pass's blocks and the parts


def vectors(rows: int = ROWS, seed: int = 0, dtype=np.float16) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, DIM)).astype(dtype)


def emb_column(x: np.ndarray, kind: str = "fixed") -> pa.Array:
    flat = pa.array(x.ravel())
    if kind == "fixed":
        return pa.FixedSizeListArray.from_arrays(flat, x.shape[1])
    return pa.ListArray.from_arrays(pa.array(np.arange(0, x.size + 1, x.shape[1], dtype=np.int32)), flat)


def write_parquet(path: Path, x: np.ndarray, ids: list | np.ndarray | None = None, kind: str = "fixed") -> Path:
    cols = {"emb": emb_column(x, kind)}
    if ids is not None:
        cols["doc_id"] = pa.array(ids)
    pq.write_table(pa.table(cols), path, row_group_size=GROUP_ROWS)
    return path


def write_dataset(folder: Path, x: np.ndarray, ids: list) -> Path:
    """``x`` split over PARTS Parquet files whose sorted names are their order."""
    folder.mkdir()
    for i, (part, part_ids) in enumerate(zip(np.array_split(x, PARTS), np.array_split(np.array(ids), PARTS))):
        write_parquet(folder / f"part-{i:03d}.parquet", part, part_ids.tolist())
    return folder


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """The same float16 rows as a three-file Parquet dataset with string ids and as one .f16bin, both built."""
    root = tmp_path_factory.mktemp("parquet")
    x = vectors()
    ids = [f"doc-{i * 7}" for i in range(ROWS)]
    folder = write_dataset(root / "ds", x, ids)
    write_vectors(root / "x.f16bin", x)
    opts = dict(k=K, backend="cpu", shard_rows=400, partition="kmeans")  # scattered reads of the parts
    with bigknn.build(folder, store=root / "ds.knn", id_column="doc_id", **opts) as g:
        from_parquet = g.neighbors()
    with bigknn.build(root / "x.f16bin", store=root / "x.knn", **opts) as g:
        from_flat = g.neighbors()
    return {"root": root, "x": x, "ids": np.array(ids, object), "folder": folder, "store": root / "ds.knn",
            "parquet": from_parquet, "flat": from_flat}


# ---- reading -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,kind", [(np.float32, "fixed"), (np.float16, "fixed"), (np.float32, "list"),
                                        (np.uint8, "fixed")])
def test_parquet_columns_read_as_the_array(tmp_path, dtype, kind):
    x = (vectors(300, seed=1) * 20).astype(dtype) if dtype == np.uint8 else vectors(300, seed=1, dtype=dtype)
    src = open_source(write_parquet(tmp_path / "a.parquet", x, kind=kind))
    assert (src.rows, src.dim, src.read_dtype) == (300, DIM, np.dtype(dtype))
    np.testing.assert_array_equal(src.read(0, 300), x)
    np.testing.assert_array_equal(src.read(65, 215), x[65:215])  # across three row groups
    rows = np.array([0, 69, 70, 71, 299])
    np.testing.assert_array_equal(src.take(rows), x[rows])


def test_a_thread_holds_one_decoded_row_group_of_a_whole_dataset(tmp_path):
    from bigknn.formats import columnar
    x = vectors()
    src = open_source(write_dataset(tmp_path / "ds", x, list(range(ROWS))))
    np.testing.assert_array_equal(src.read(0, ROWS), x)  # every group of every part, in one thread
    reader, group = columnar._THREAD.reader, columnar._THREAD.group  # this thread's only ones
    assert reader[0] is src.parts[-1] and group[0] is src.parts[-1]
    assert len(group[2]) <= GROUP_ROWS


def test_a_contiguous_shard_decodes_each_row_group_once(tmp_path, monkeypatch):
    """The sharding pass's blocks begin at row groups (and parts), so no group is decoded by two threads."""
    from concurrent.futures import ThreadPoolExecutor

    from bigknn.engine import sharding_pass
    from bigknn.formats import columnar
    x = vectors()
    src = open_source(write_dataset(tmp_path / "ds", x, list(range(ROWS))))
    decoded: list[tuple[str, int]] = []
    real = columnar._vectors
    monkeypatch.setattr(columnar, "_vectors", lambda f, g, col: decoded.append((f.path, g)) or real(f, g, col))
    monkeypatch.setattr(sharding_pass, "READ_BLOCK_BYTES", 100 * DIM * 2)  # 100-row blocks: groups of 70 straddle
    starts = src.block_starts(50, 850, 100)
    part_rows = ROWS // PARTS
    assert starts[0] == 50 and all(s % part_rows % GROUP_ROWS == 0 for s in starts[1:])  # at groups' starts
    assert starts == sorted(set(starts)) and len(starts) < 800 // GROUP_ROWS  # groups merged into blocks
    with ThreadPoolExecutor(4) as pool:
        got = sharding_pass.shard_vectors(src, pool, "l2", np.dtype(np.float16), 50, 800)
    np.testing.assert_array_equal(got, x[50:850])
    assert len(decoded) == len(set(decoded))  # each (part, group) once
    write_vectors(tmp_path / "x.f16bin", x)
    assert src.read_threads >= open_source(tmp_path / "x.f16bin").read_threads  # decoding: every core


def test_a_one_shard_build_takes_its_recall_sample_from_the_shard_not_the_files(tmp_path, monkeypatch):
    """A scattered take decodes nearly every row group; a one-shard build's sample comes from its only shard,
    and its estimate is the one the same rows give as a flat file."""
    from bigknn.formats import columnar
    x = vectors()
    folder = write_dataset(tmp_path / "ds", x, list(range(ROWS)))
    write_vectors(tmp_path / "x.f16bin", x)
    taken: list[int] = []
    real = columnar.ColumnarFile.take
    monkeypatch.setattr(columnar.ColumnarFile, "take", lambda self, rows: taken.append(len(rows)) or real(self, rows))
    opts = dict(k=K, backend="cpu", shard_rows=ROWS, partition="contiguous")
    with bigknn.build(folder, store=tmp_path / "ds.knn", **opts) as g:
        from_parquet = g.info.recall_estimate
    assert taken == []
    with bigknn.build(tmp_path / "x.f16bin", store=tmp_path / "x.knn", **opts) as g:
        assert g.info.recall_estimate == from_parquet and from_parquet.rows > 0


def test_arrow_ipc_and_float64_read_as_float32(tmp_path):
    x = vectors(200, seed=2, dtype=np.float64)
    path = tmp_path / "a.feather"
    feather.write_feather(pa.table({"v": emb_column(x)}), path, chunksize=GROUP_ROWS)
    src = open_source(path)
    assert src.read_dtype == np.float32
    np.testing.assert_array_equal(src.read(0, 200), x.astype(np.float32))


def test_a_glob_of_npy_parts_is_one_dataset_in_sorted_order(tmp_path):
    x = vectors(300, seed=3, dtype=np.float32)
    for i, part in reversed(list(enumerate(np.array_split(x, 3)))):  # created last to first
        np.save(tmp_path / f"p{i}.npy", part)
    src = open_source(str(tmp_path / "p*.npy"))
    assert src.rows == 300
    np.testing.assert_array_equal(src.read(0, 300), x)
    np.testing.assert_array_equal(src.take(np.array([5, 100, 250])), x[[5, 100, 250]])


def test_the_vector_column_is_the_only_fixed_size_list_or_named(tmp_path):
    x = vectors(100, seed=4)
    path = tmp_path / "two.parquet"
    pq.write_table(pa.table({"a": emb_column(x), "b": emb_column(x[:, ::-1].copy())}), path)
    with pytest.raises(BadInput, match="--column.*a, b"):
        open_source(path)
    np.testing.assert_array_equal(open_source(path, column="b").read(0, 100), x[:, ::-1])


def test_missing_pyarrow_is_one_line_saying_how_to_install(tmp_path, monkeypatch):
    path = write_parquet(tmp_path / "a.parquet", vectors(10))
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(BadInput, match=r"pip install 'bigknn\[parquet\]'"):
        open_source(path)


# ---- refusals: one line naming the file and the row, nothing written --------------------------------------
def bad_rows(tmp_path: Path, case: str) -> tuple[Path, str, str]:
    """A three-file dataset whose second file has a defect at its row 137; (input, part file, message part)."""
    x = vectors(600, seed=5, dtype=np.float32)
    folder = tmp_path / "ds"
    folder.mkdir()
    for i, part in enumerate(np.array_split(x, 3)):
        path = folder / f"p{i}.parquet"
        if i != 1:
            write_parquet(path, part, np.arange(200))
            continue
        bad = path
        if case == "nan":
            part[137, 3] = np.nan
            write_parquet(path, part, np.arange(200))
        else:
            rows = [list(map(float, r)) for r in part]
            rows[137] = None if case == "null row" else rows[137][:-1] if case == "ragged" else \
                rows[137][:2] + [None] + rows[137][3:]
            pq.write_table(pa.table({"emb": pa.array(rows, pa.list_(pa.float32())), "doc_id": np.arange(200)}),
                           path, row_group_size=GROUP_ROWS)
    return folder, str(bad), {"nan": "NaN", "null row": "is null", "ragged": "ragged",
                              "null value": "null value"}[case]


@pytest.mark.parametrize("case", ["null row", "null value", "ragged", "nan"])
def test_a_bad_row_is_refused_naming_its_file_and_row(tmp_path, case):
    folder, bad, problem = bad_rows(tmp_path, case)
    code, out, err = run_cli("build", folder, "-o", tmp_path / "s.knn", "--k", K, "--backend", "cpu",
                             "--id-column", "doc_id")
    line = assert_one_line_error(code, out, err, bad, "row 137", problem)
    assert "p0.parquet" not in line
    assert not (tmp_path / "s.knn").exists()


def test_a_directory_with_one_bad_file_is_refused_naming_it(tmp_path):
    folder = write_dataset(tmp_path / "ds", vectors(), [f"d{i}" for i in range(ROWS)])
    (folder / "part-001.parquet").write_bytes(b"not parquet at all" * 10)
    code, out, err = run_cli("build", folder, "-o", tmp_path / "s.knn", "--k", K, "--id-column", "doc_id")
    assert_one_line_error(code, out, err, str(folder / "part-001.parquet"), "not a readable Parquet file")
    write_parquet(folder / "part-001.parquet", vectors(50)[:, :4].copy())  # another dimension
    code, out, err = run_cli("build", folder, "-o", tmp_path / "s.knn", "--k", K)
    assert_one_line_error(code, out, err, str(folder / "part-001.parquet"), "4-dim")
    assert not (tmp_path / "s.knn").exists()


# ---- builds, ids and outputs ---------------------------------------------------------------------------
def test_a_parquet_dataset_builds_the_graph_of_the_same_rows_as_one_flat_file(built):
    np.testing.assert_array_equal(built["parquet"].ids, built["flat"].ids)
    np.testing.assert_array_equal(built["parquet"].distances, built["flat"].distances)


def test_user_ids_reach_neighbors_and_both_exports(built, tmp_path):
    rows = built["parquet"].ids
    with bigknn.open(built["store"]) as g:
        assert g.info.user_ids == "doc_id (string)"
        np.testing.assert_array_equal(g.neighbors(ids="user").ids, built["ids"][rows])
        g.export(tmp_path / "rows.parquet")
        report = g.export(tmp_path / "users.parquet", ids="user", include_self=True)
        with pytest.raises(BadInput, match="strings: export them to .parquet"):
            g.export(tmp_path / "users.npy", ids="user")
    assert report.edges == ROWS * (K + 1)
    edges = pq.read_table(tmp_path / "rows.parquet").sort_by([("src", "ascending"), ("rank", "ascending")])
    np.testing.assert_array_equal(edges["src"].to_numpy(), np.repeat(np.arange(ROWS), K))  # a partitioned store:
    np.testing.assert_array_equal(edges["dst"].to_numpy(), rows.ravel())  # its rows come shard by shard
    np.testing.assert_array_equal(edges["distance"].to_numpy(), built["parquet"].distances.ravel())
    np.testing.assert_array_equal(edges["rank"].to_numpy(), np.tile(np.arange(1, K + 1), ROWS))
    users = pq.read_table(tmp_path / "users.parquet").to_pydict()
    with_self = dict(zip(built["ids"], np.concatenate([np.arange(ROWS)[:, None], rows], axis=1)))
    got: dict = {}
    for src, dst, rank in zip(users["src"], users["dst"], users["rank"]):
        got.setdefault(src, []).append((rank, dst))
    assert {src: [d for _, d in sorted(lst)] for src, lst in got.items()} == \
        {src: built["ids"][r].tolist() for src, r in with_self.items()}


def test_the_edge_list_reads_in_duckdb(built, tmp_path):
    duckdb = pytest.importorskip("duckdb", reason="DuckDB is checked only where it is installed")
    with bigknn.open(built["store"]) as g:
        g.export(tmp_path / "e.parquet", ids="user")
    n, first = duckdb.sql(f"select count(*), min(src) from '{tmp_path / 'e.parquet'}'").fetchone()
    assert (n, first) == (ROWS * K, min(built["ids"]))


def test_search_speaks_in_user_ids(built, tmp_path):
    store = tmp_path / "s.knn"
    with bigknn.build(built["folder"], store=store, id_column="doc_id", k=K, backend="cpu") as g:
        g.prune(degree=K, backend="cpu")
        rows = g.search(built["x"][:20].astype(np.float32), k=3, backend="cpu")
        users = g.search(built["x"][:20].astype(np.float32), k=3, backend="cpu", ids="user",
                         out=tmp_path / "found.parquet")
    assert users.ids.tolist() == built["ids"][rows.ids].tolist()
    found = pq.read_table(tmp_path / "found.parquet").to_pydict()
    assert found["id"] == users.ids.ravel().tolist() and found["rank"][:3] == [1, 2, 3]
    np.testing.assert_array_equal(found["distance"], users.distances.ravel())
    np.save(tmp_path / "q.npy", built["x"][:20].astype(np.float32))
    code, out, err = run_cli("search", store, "--queries", tmp_path / "q.npy", "-o", tmp_path / "f.ibin", "--ids",
                             "user", "--backend", "cpu")
    assert_one_line_error(code, out, err, "f.ibin", ".parquet")


def test_cli_export_parquet_is_atomic_and_refuses_a_store_without_ids(built, tmp_path):
    out = tmp_path / "e.parquet"
    report = run_json("export", built["store"], "-o", out, "--ids", "user")
    assert report["edges"] == ROWS * K and [p.name for p in tmp_path.iterdir()] == ["e.parquet"]
    code, stdout, err = run_cli("export", built["root"] / "x.knn", "-o", tmp_path / "f.parquet", "--ids", "user")
    assert_one_line_error(code, stdout, err, "keeps no user ids", "--id-column")
    assert not (tmp_path / "f.parquet").exists()


# ---- ingest ------------------------------------------------------------------------------------------------
def test_ingest_of_new_parquet_files_carries_their_ids_and_a_repeat_is_a_no_op(tmp_path):
    x = vectors(1200, seed=6, dtype=np.float32)
    ids = np.arange(1200, dtype=np.int64) * 10 + 3
    (tmp_path / "ds").mkdir()
    write_parquet(tmp_path / "ds" / "a.parquet", x[:500], ids[:500])
    write_parquet(tmp_path / "ds" / "b.parquet", x[500:900], ids[500:900])
    drop = tmp_path / "drop"
    drop.mkdir()
    write_parquet(drop / "c.parquet", x[900:], ids[900:])
    store = tmp_path / "s.knn"
    run_json("build", tmp_path / "ds", "-o", store, "--k", K, "--backend", "cpu", "--id-column", "doc_id",
             "--shard-rows", 400, "--partition", "contiguous")
    first = run_json("ingest", store, "--watch-dir", drop, "--backend", "cpu")
    assert first["rows_added"] == 300 and first["rows"] == 1200
    again = run_json("ingest", store, "--input", drop / "c.parquet", "--input", tmp_path / "ds", "--backend", "cpu")
    assert again["rows_added"] == 0  # the file ingested, and the dataset built from, are both known
    assert again["skipped"] == [str((drop / "c.parquet").resolve()), str((tmp_path / "ds").resolve())]
    run_json("export", store, "-o", tmp_path / "g.npy", "--ids", "user")
    with bigknn.open(store) as g:
        rows = g.neighbors().ids
    np.testing.assert_array_equal(np.load(tmp_path / "g.npy"), ids[rows])
    write_parquet(tmp_path / "no_ids.parquet", x[:100])
    code, out, err = run_cli("ingest", store, "--input", tmp_path / "no_ids.parquet", "--backend", "cpu")
    assert_one_line_error(code, out, err, "no_ids.parquet", "doc_id")
    write_parquet(tmp_path / "str_ids.parquet", x[:100], [f"s{i}" for i in range(100)])
    code, out, err = run_cli("ingest", store, "--input", tmp_path / "str_ids.parquet", "--backend", "cpu")
    assert_one_line_error(code, out, err, "str_ids.parquet", "string ids", "int64 ids")
    assert sorted(p.name for p in (store / "user_ids").iterdir()) == ["000000000000.i64", "000000000900.i64"]
    assert json.loads((store / "manifest.json").read_text())["inputs"][-1]["path"].endswith("c.parquet")


# ---- the walk-through -------------------------------------------------------------------------------------
def test_the_parquet_example_runs(tmp_path):
    example = Path(__file__).resolve().parents[1] / "examples" / "parquet_to_graph.py"
    proc = subprocess.run([sys.executable, str(example)], cwd=tmp_path, env=cli_env(), capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert "ingested: 1000 rows, then 0 on the repeat; 4000 rows in all" in proc.stdout
    assert float(re.search(r"twin: ([\d.]+)", proc.stdout).group(1)) >= 0.99, proc.stdout
    assert "edges: 32000 rows, columns ['src', 'dst', 'distance', 'rank']" in proc.stdout
