"""Issue 42, item 4: what a new user tripped over, each reproduced: one-line errors (JSON under --json) that
name the path or option, the peers' metric names and -k, pickling, and float64 input stated."""

from __future__ import annotations

import json
import os
import pickle
import re

import numpy as np
import pytest

import bigknn
from bigknn.core.errors import BadInput
from bigknn.shards import Store, WriterLock

from conftest import assert_one_line_error, run_cli, run_json, write_synth

ROWS, DIM, K = 1200, 8, 5


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("first_hour")
    x = write_synth(d / "data.fbin", ROWS, DIM, seed=2)
    return d / "data.fbin", x


def test_a_directory_named_like_an_input_is_refused_by_its_path(tmp_path):
    (tmp_path / "x.fbin").mkdir()
    code, out, err = run_cli("build", tmp_path / "x.fbin", "-o", tmp_path / "s.knn", "--backend", "cpu")
    assert_one_line_error(code, out, err, str(tmp_path / "x.fbin"), "is a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.fbin"]


def test_an_output_in_a_missing_directory_is_refused_and_not_created(data, tmp_path):
    code, out, err = run_cli("build", data[0], "-o", tmp_path / "typo" / "s.knn", "--backend", "cpu")
    assert_one_line_error(code, out, err, "-o", str(tmp_path / "typo"), "does not exist")
    assert list(tmp_path.iterdir()) == []


def test_a_bad_size_names_its_option(data, tmp_path):
    code, out, err = run_cli("build", data[0], "-o", tmp_path / "s.knn", "--host-mem", "1X")
    assert_one_line_error(code, out, err, "--host-mem", "'1X'")
    code, out, err = run_cli("prune", tmp_path / "s.knn", "--gpu-mem", "lots")
    assert_one_line_error(code, out, err, "--gpu-mem", "'lots'")
    assert list(tmp_path.iterdir()) == []


def test_errors_under_json_are_one_json_object(data, tmp_path):
    for args in (["build", data[0], "-o", tmp_path / "s.knn", "--host-mem", "1X"],  # bad usage
                 ["build", data[0], "-o", tmp_path / "s.knn", "-k", ROWS, "--backend", "cpu"],  # bad input
                 ["info", tmp_path / "none.knn"]):
        code, out, err = run_cli(*args, "--json")
        assert code == 2 and out == "", (code, out, err)
        (line,) = err.strip("\n").split("\n")
        obj = json.loads(line)
        assert obj["exit"] == 2 and isinstance(obj["error"], str) and obj["error"], obj
    assert list(tmp_path.iterdir()) == []


def test_eval_while_a_build_runs_says_so_with_its_pid(data, tmp_path):
    store = tmp_path / "s.knn"
    run_json("build", data[0], "-o", store, "-k", K, "--shard-rows", ROWS // 2, "--backend", "cpu",
             "--partition", "contiguous")
    s = Store.open(store, pin=False)
    with WriterLock(store):  # as a build would leave it, between a GNND and the last merge
        s.manifest.merged.clear()
        s.commit()
        code, out, err = run_cli("eval", "recall", store)
        assert_one_line_error(code, out, err, f"a build is running (pid {os.getpid()})")
    code, out, err = run_cli("eval", "recall", store)  # nobody builds it: finish it
    assert_one_line_error(code, out, err, "not finished", "bigknn merge")


def test_an_array_input_is_not_called_a_file():
    with pytest.raises(BadInput) as info:
        bigknn.build(np.zeros((10, 4), np.float32), k=20, backend="cpu")
    assert str(info.value).startswith("array: ") and "the input has 10" in str(info.value), info.value


def test_a_float64_npy_is_stated_as_read_in_float32(data, tmp_path):
    np.save(tmp_path / "x64.npy", data[1].astype(np.float64))
    code, out, err = run_cli("build", tmp_path / "x64.npy", "-o", tmp_path / "s.knn", "-k", K, "--backend", "cpu",
                             "--json")
    assert code == 0, err
    assert "x64.npy: float64 values are read, stored and compared as float32" in err, err
    assert json.loads(run_cli("info", tmp_path / "s.knn", "--json")[1])["dtype"] in ("<f4", "float32")
    code, out, err = run_cli("ingest", tmp_path / "s.knn", "--input", data[0], "--backend", "cpu", "--json")
    assert code == 0, err  # float32 rows into a store read from float64: the same dtype, as stored


def test_the_peers_metric_names_and_dash_k(data, tmp_path):
    built = {}
    for name in ("euclidean", "sqeuclidean", "l2", "dot", "inner_product"):
        out = run_json("build", data[0], "-o", tmp_path / f"{name}.knn", "-k", K, "--metric", name,
                       "--backend", "cpu")
        built[name] = out["metric"], bigknn.open(tmp_path / f"{name}.knn").neighbors().ids
    assert {n: m for n, (m, _) in built.items()} == {"euclidean": "l2", "sqeuclidean": "l2", "l2": "l2",
                                                      "dot": "ip", "inner_product": "ip"}
    np.testing.assert_array_equal(built["euclidean"][1], built["l2"][1])  # the same build, by another name
    np.testing.assert_array_equal(built["dot"][1], built["inner_product"][1])
    code, out, err = run_cli("build", "--help")
    assert code == 0 and "not squared" in " ".join(out.split()), out  # what each name's distances are
    with bigknn.build(data[1], k=K, metric="sqeuclidean", backend="cpu") as g:
        assert g.info.metric == "l2"
    with pytest.raises(ValueError, match="euclidean"):
        bigknn.build(data[1], k=K, metric="manhattan", backend="cpu")


def test_a_graph_and_a_fitted_transformer_pickle(data, tmp_path):
    x = data[1]
    kept = bigknn.build(x, k=K, store=tmp_path / "kept.knn", backend="cpu")
    again = pickle.loads(pickle.dumps(kept))
    assert again.path == kept.path  # a kept store: by its path
    np.testing.assert_array_equal(again.neighbors().ids, kept.neighbors().ids)
    t = bigknn.KNNGraphTransformer(n_neighbors=K, backend="cpu").fit(x)
    expected = t.transform(x[:50]).toarray()
    blob = pickle.dumps(t)
    where = t.graph_.path
    t.graph_.close()  # the original's temporary store is gone: the copy has its own
    assert not where.exists()
    copy = pickle.loads(blob)
    np.testing.assert_allclose(copy.transform(x[:50]).toarray(), expected)
    assert copy.fit_transform(x).nnz == ROWS * (K + 1)


def test_tables_are_for_people_and_json_keeps_the_machine_units(data, tmp_path):
    """The build summary's timeline and descents were dicts dumped as text, info said "<f4" and 76809207."""
    code, out, err = run_cli("build", data[0], "-o", tmp_path / "s.knn", "-k", K, "--shard-rows", ROWS // 2,
                             "--backend", "cpu", "--partition", "contiguous")
    assert code == 0, err
    code, info, err = run_cli("info", tmp_path / "s.knn")
    assert code == 0, err
    for text in (out, info):
        assert "{" not in text and "'" not in text and "None" not in text, text  # no Python reprs
    assert re.search(r"dtype +│ float32", info) and re.search(r"disk_bytes +│ [\d.]+ [kM]B", info), info
    assert re.search(r"wall_s +│ [\d.]+ s", out) and re.search(r"search +│ -", out), out
    as_json = run_json("info", tmp_path / "s.knn")
    assert as_json["dtype"] == "<f4" and isinstance(as_json["disk_bytes"], int)


def captured_figure(monkeypatch):
    """The figure the next plot function draws, instead of its file."""
    from bigknn import plot

    figures = []
    monkeypatch.setattr(plot, "save", lambda fig, path: figures.append(fig))
    return figures


def test_the_in_degree_histogram_has_a_bar_per_whole_degree_and_shows_rows_in_no_list(monkeypatch, tmp_path):
    from bigknn.plot import degree_bins, in_degree_histogram

    for top in (3, 199, 200, 1000, 12345):
        edges = degree_bins(top)
        assert edges[0] == -0.5 and edges[1] == 0.5, "degree 0 alone in the first bar"
        widths = np.diff(edges)[1:]
        assert np.all(widths == widths[0]) and widths[0] >= 1, "bars of equal whole numbers of degrees"
        assert np.all((edges + 0.5) == np.round(edges + 0.5)) and edges[-1] >= top  # whole degrees, all covered
        assert len(edges) <= 202
    figures = captured_figure(monkeypatch)
    degrees = np.concatenate([np.zeros(7, int), np.ones(5, int), np.full(20, 500)])
    in_degree_histogram(tmp_path / "d.png", degrees, 5, "t")
    (ax,) = figures[0].axes
    first = min(ax.patches, key=lambda p: p.get_x())
    assert first.get_height() == 7 and first.get_x() == -0.5, "the rows in no list, in a bar of their own"
    assert sum(p.get_height() for p in ax.patches) == len(degrees)


def test_the_recall_plot_draws_the_target_on_axes_from_zero(monkeypatch, tmp_path):
    from bigknn.plot import recall_histogram

    figures = captured_figure(monkeypatch)
    per_row = np.array([1.0, 0.9, 1.0, 0.995, 0.98])
    recall_histogram(tmp_path / "r.png", per_row, np.array([0, 0, 1, 1, 1]), 2, 10, "t", target=0.99)
    left, right = figures[0].axes
    assert right.get_ylim()[0] == 0.0 and right.get_ylim()[1] >= 1.0
    assert any(tuple(line.get_ydata()) == (0.99, 0.99) for line in right.get_lines())
    assert any(tuple(line.get_xdata()) == (0.99, 0.99) for line in left.get_lines())
