"""Locality-aware partitions (bigknn/algorithms/partition/): balanced shards, near-pair plans, and ids that stay the
input's row numbers through every reader."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bigknn
from bigknn.core.errors import BadInput
from bigknn.formats import open_vectors, read_truth, write_vectors
from bigknn.algorithms.partition.labelling import layout, learn_from_file
from bigknn.algorithms.partition.learn import Partition, learn
from bigknn.algorithms.partition.balance import assign_balanced, take_first_choices
from bigknn.algorithms.partition.pairs import choose_pairs, coverage, pair_masses
from bigknn.algorithms.partition.rowmap import RowMap
from bigknn.shards import Store
from bigknn.shards.manifest import PARTITIONED_SINCE
from bigknn.core.synth import synth, synth_blocks

from conftest import assert_one_line_error, error_lines, run_cli, run_json

ROWS, DIM, K, SHARD_ROWS = 3000, 16, 5, 400


def test_balanced_assignment_keeps_room_and_spills_the_farthest_rows():
    cost = np.array([[0.0, 5], [1, 5], [2, 5], [9, 0]])
    room = np.array([2, 2])
    labels = assign_balanced(cost, room)
    assert labels.tolist() == [0, 0, 1, 1] and room.tolist() == [0, 0]  # row 2, the farthest of shard 0's, spills
    with pytest.raises(ValueError):
        assign_balanced(cost, np.array([1, 1]))


@pytest.mark.parametrize("method", ["kmeans", "rptree"])
def test_first_choices_then_spilled_costs_label_as_the_dense_rule(tmp_path, method):
    """The labelling's two steps (first choices, then the (n, S) costs of the rows that spill) give the
    labels and the room of ``assign_balanced`` on every row's costs: shards as balanced, rows as near
    (shards this full spill 2-50 % of the rows; one dropped shard leaves rows without a kept centroid)."""
    x = synth(4000, DIM, clusters=20, seed=7)
    write_vectors(tmp_path / "x.fbin", x)
    part = learn_from_file(open_vectors(tmp_path / "x.fbin"), method, 6, "l2", seed=0)
    part.drop(2)
    cost = part.cost(x)
    room = np.full(part.shards, 850, np.int64)
    dense_room = room.copy()
    labels, spilled = take_first_choices(cost.argmin(axis=1), cost.min(axis=1), room)
    assert 0.02 < spilled.size / len(x) < 0.5 and (labels[spilled] == -1).all()
    labels[spilled] = assign_balanced(cost[spilled], room)
    np.testing.assert_array_equal(labels, assign_balanced(cost, dense_room))
    np.testing.assert_array_equal(room, dense_room)
    first, key = part.first_choice(x)  # the costs of other row blocks: other BLAS paths, rounding apart
    assert (first == cost.argmin(axis=1)).mean() > 0.999
    np.testing.assert_allclose(key, cost.min(axis=1), rtol=1e-4, atol=1e-3)


def test_a_bad_row_is_refused_by_the_labelling_before_anything_is_written(tmp_path):
    x = synth(ROWS, DIM, clusters=20, seed=5)
    x[2500, 3] = np.inf
    bad = tmp_path / "bad.fbin"
    write_vectors(bad, x)
    code, out, err = run_cli("build", bad, "-o", tmp_path / "s.knn", "--k", K, "--shard-rows", SHARD_ROWS,
                             "--backend", "cpu", "--partition", "kmeans")
    assert "2500" in assert_one_line_error(code, out, err, bad.name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.fbin"]
    part = learn("kmeans", np.delete(x, 2500, axis=0), 8, seed=0)  # a sample without it: the labelling refuses
    with pytest.raises(BadInput, match="row 2500 holds NaN or Inf"):
        layout(open_vectors(bad), part, "l2", SHARD_ROWS, K)


def test_pairs_cover_the_target_and_fall_back_to_all_without_locality():
    shards = 6
    local = np.zeros((shards, shards), np.int64)
    local[0, 1], local[2, 3], local[4, 5], local[0, 5] = 50, 40, 30, 1
    pairs = choose_pairs(local, within=10_000, recall=0.99)
    assert pairs == [[0, 1], [2, 3], [4, 5]]  # the heavy pairs; [0, 5] is not needed for the coverage
    iid = np.triu(np.full((shards, shards), 100, np.int64), 1)
    assert len(choose_pairs(iid, within=100, recall=0.99)) == shards * (shards - 1) // 2
    mass, within = pair_masses(np.array([0, 1]), np.array([[0, 1, -1], [0, 2, 1]]), 3)
    assert within == 2 and mass[0, 1] == 2 and mass[1, 2] == 1 and mass.sum() == 3
    assert coverage(0.99) == pytest.approx(0.999)


def test_rowmap_translates_both_ways_and_keeps_empty():
    rm = RowMap(np.array([3, 0, 2, 1]))
    assert rm.to_input(np.array([[0, -1], [3, 1]])).tolist() == [[3, -1], [1, 0]]
    assert rm.to_position(np.array([3, 0, -1])).tolist() == [0, 1, -1]


def test_rptree_leaves_are_balanced_and_rows_stay_within_the_cap(tmp_path):
    x = synth(2000, DIM, clusters=20, seed=6)
    write_vectors(tmp_path / "x.fbin", x)
    vf = open_vectors(tmp_path / "x.fbin")
    part = learn_from_file(vf, "rptree", 4, "l2", seed=0)
    assert np.bincount(part.tree.leaves(x), minlength=4).min() >= 400  # quantile splits: ~500 each
    rows_of = layout(vf, part, "l2", shard_rows=560, min_rows=16)
    assert sorted(np.concatenate(rows_of).tolist()) == list(range(2000))
    assert max(len(r) for r in rows_of) <= 560
    again = Partition.from_arrays("rptree", {k: v.copy() for k, v in part.arrays().items()})
    np.testing.assert_array_equal(again.cost(x[:50]), part.cost(x[:50]))


def test_the_labelling_says_where_its_seconds_went(tmp_path, monkeypatch, caplog):
    """The pass ends with one line splitting its time into waiting for reads, nearest centroids and balancing;
    a nearest-centroid call made slow (a lower bound on its share, whatever the machine's load) shows there,
    and the labels are those of the plain call."""
    import logging
    import time as clock
    from bigknn.algorithms.partition import labelling
    from bigknn.algorithms.partition.nearest import nearest_numpy
    monkeypatch.setattr(labelling, "LABEL_CHUNK_ROWS", 500)  # 4 chunks
    x = synth(2000, DIM, clusters=20, seed=8)
    write_vectors(tmp_path / "x.fbin", x)
    vf = open_vectors(tmp_path / "x.fbin")
    part = learn_from_file(vf, "kmeans", 4, "l2", seed=0)
    calls = []

    def slow(rows, count, centroids):
        calls.append(len(rows))
        clock.sleep(0.1)  # a multiple of the line's 0.1 s
        return nearest_numpy(rows, count, centroids)

    with caplog.at_level(logging.INFO, logger="bigknn"):
        timed = layout(vf, part, "l2", shard_rows=700, min_rows=16, nearest=slow)
    line = [r.getMessage() for r in caplog.records if "rows labelled" in r.getMessage()]
    assert len(line) == 1 and line[0].startswith("partition: 2,000 rows labelled"), line
    nearest_s = float(line[0].split("reads, ")[1].split(" s in nearest")[0])
    assert len(calls) >= 4 and nearest_s >= 0.1 * len(calls) - 1e-3
    assert [r.tolist() for r in timed] == [r.tolist() for r in layout(vf, part, "l2", shard_rows=700, min_rows=16)]


@pytest.mark.parametrize("metric,dtype", [("l2", np.uint8), ("l2", np.float32), ("cosine", np.float32)])
def test_the_labelling_keeps_every_row_as_prepared_and_labels_as_without(tmp_path, monkeypatch, metric, dtype):
    """Rows kept for the sharding pass (read straight into the kept array where the metric leaves them as
    they are) equal the file's rows as prepared, over several chunks, and the labels do not change."""
    from bigknn.algorithms.partition import labelling
    from bigknn.core.metric import prepare_rows
    monkeypatch.setattr(labelling, "LABEL_CHUNK_ROWS", 700)  # 3 chunks, the last short
    x = synth(2000, DIM, clusters=20, seed=7)
    x = np.clip(x * 20 + 128, 0, 255).astype(dtype) if dtype == np.uint8 else x
    path = tmp_path / ("x.u8bin" if dtype == np.uint8 else "x.fbin")
    write_vectors(path, x)
    vf = open_vectors(path)
    part = learn_from_file(vf, "kmeans", 4, metric, seed=0)
    keep = np.empty((2000, DIM), np.float32 if metric == "cosine" else dtype)
    kept = layout(vf, part, metric, shard_rows=700, min_rows=16, keep=keep)
    plain = layout(vf, part, metric, shard_rows=700, min_rows=16)
    np.testing.assert_array_equal(keep, prepare_rows(x, metric))
    assert [r.tolist() for r in kept] == [r.tolist() for r in plain]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("partition")
    x = synth(ROWS, DIM, clusters=20, seed=5)
    write_vectors(d / "x.fbin", x)
    out = {"x": x, "dir": d}
    for method in ("contiguous", "kmeans"):  # rptree stores rows through the same code (test_rptree_...)
        out[method] = run_json("build", d / "x.fbin", "-o", d / f"{method}.knn", "--k", K, "--shard-rows",
                               SHARD_ROWS, "--backend", "cpu", "--partition", method, "--list-width", 16)
    return out


def _exported(stores, method):
    path = stores["dir"] / f"{method}.ibin"
    if not path.exists():
        run_json("export", stores["dir"] / f"{method}.knn", "-o", path)
    return read_truth(path)


def test_partitioned_export_lists_row_i_at_row_i_with_contiguous_recall(stores):
    x = stores["x"]
    exact = np.argsort(((x[:300, None] - x[None]) ** 2).sum(-1), axis=1)[:, 1:K + 1]
    ref_ids, _ = _exported(stores, "contiguous")
    ref = np.mean([len(set(a) & set(b)) / K for a, b in zip(ref_ids[:300], exact)])
    for method in ("kmeans",):
        ids, dists = _exported(stores, method)
        # row i's list is row i's: the distances are those of the input's row i to the listed input rows
        np.testing.assert_allclose(dists, np.linalg.norm(x[ids] - x[:, None], axis=2), rtol=1e-4, atol=1e-4)
        got = np.mean([len(set(a) & set(b)) / K for a, b in zip(ids[:300], exact)])
        assert got >= ref - 0.01 and got >= 0.95, (method, got, ref)
        s = run_json("eval", "recall", stores["dir"] / f"{method}.knn", "--backend", "cpu", "--sample", 500, "--k", K)
        assert s["recall"] >= 0.95
        nb = bigknn.open(stores["dir"] / f"{method}.knn").neighbors()
        np.testing.assert_array_equal(nb.ids, ids)


def test_kmeans_store_records_its_partition_and_merges_only_near_pairs(stores):
    s = stores["kmeans"]
    assert s["partition"] == "kmeans" and s["merges_done"] == s["merges_total"] < s["all_pairs"]
    m = json.loads((stores["dir"] / "kmeans.knn" / "manifest.json").read_text())
    assert m["format"] >= PARTITIONED_SINCE and m["partition"]["method"] == "kmeans" and sorted(map(tuple, m["merged"])) == \
        sorted(map(tuple, m["pairs"]))
    sizes = [sh["rows"] for sh in m["shards"]]
    assert max(sizes) <= SHARD_ROWS and sum(sizes) == ROWS
    c = stores["contiguous"]
    assert c["partition"] == "contiguous" and c["merges_done"] == c["all_pairs"]
    assert "partition" not in json.loads((stores["dir"] / "contiguous.knn" / "manifest.json").read_text()) or \
        json.loads((stores["dir"] / "contiguous.knn" / "manifest.json").read_text())["partition"] is None


def test_verify_checks_the_row_ids_of_a_partitioned_store(stores, tmp_path):
    import shutil

    store = tmp_path / "k.knn"
    shutil.copytree(stores["dir"] / "kmeans.knn", store)
    s = run_json("verify", store)
    assert s["ok"] and s["format"] >= PARTITIONED_SINCE
    chunk = next(p for p in (store / "shards" / "2" / "row_ids").rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk.write_bytes(chunk.read_bytes()[:-1] + b"\x00")
    code, out, err = run_cli("verify", store, "--json")
    assert code == 1 and any("shard 2 row ids" in d["what"] for d in json.loads(out)["damaged"])


def test_resuming_with_another_partition_is_refused(stores):
    code, out, err = run_cli("build", stores["dir"] / "x.fbin", "-o", stores["dir"] / "kmeans.knn", "--k", K,
                             "--shard-rows", SHARD_ROWS, "--backend", "cpu", "--partition", "rptree")
    assert code == 2 and "partition kmeans" in err and len(error_lines(err)) == 1


def test_ingest_into_a_kmeans_store_merges_only_the_shards_near_the_batch(stores, tmp_path):
    """A batch in one region of the data merges with the shards there (a batch spread over every region,
    like a random 1 % of the input, still meets every shard)."""
    import shutil

    store = tmp_path / "k.knn"
    shutil.copytree(stores["dir"] / "kmeans.knn", store)
    with Store.open(store) as st:  # a batch of new rows in one region (the rows of shard 0, moved a little)
        home = st.read_row_ids(0)[:300]
    new = (stores["x"][home] + np.random.default_rng(1).normal(0, 0.05, (len(home), DIM))).astype(np.float32)
    write_vectors(tmp_path / "new.fbin", new)
    m0 = json.loads((store / "manifest.json").read_text())
    run_json("ingest", store, "--input", tmp_path / "new.fbin", "--backend", "cpu")
    m = json.loads((store / "manifest.json").read_text())
    first_new = len(m0["shards"])
    added = [p for p in m["merged"] if p not in m0["merged"]]
    old = {a for a, b in added if a < first_new}
    assert added and all(b >= first_new for a, b in added) and len(old) < first_new
    assert sorted(map(tuple, m["pairs"])) == sorted(map(tuple, m["merged"])) and run_json("info", store)["complete"]
    r = run_json("eval", "recall", store, "--backend", "cpu", "--k", K, "--rows", f"{ROWS}:{ROWS + len(new)}")
    assert r["recall"] >= 0.95
    ids, _ = bigknn.open(store).neighbors()
    x = np.concatenate([stores["x"], new])
    exact = np.argsort(((x[ROWS:, None] - x[None]) ** 2).sum(-1), axis=1)[:, 1:K + 1]
    assert np.mean([len(set(a) & set(b)) / K for a, b in zip(ids[ROWS:], exact)]) >= 0.95


def test_a_batch_spread_over_every_shard_reaches_the_target_on_its_own_rows(stores, tmp_path):
    """New rows of the input's distribution meet every shard of a k-means store. Seeded through the shards
    merged before (other regions) and stopped by a probe of mostly old rows, they reached 0.957 at 80K rows;
    the paper's fill and a probe half of new rows reach the target (bigknn/algorithms/recall_target.py make_merge_probe)."""
    import shutil

    store = tmp_path / "k.knn"
    shutil.copytree(stores["dir"] / "kmeans.knn", store)
    new = np.concatenate(list(synth_blocks(60, DIM, clusters=20, seed=5, first_row=ROWS)))
    write_vectors(tmp_path / "new.fbin", new)
    run_json("ingest", store, "--input", tmp_path / "new.fbin", "--backend", "cpu")
    ids, _ = bigknn.open(store).neighbors()
    x = np.concatenate([stores["x"], new])
    exact = np.argsort(((x[ROWS:, None] - x[None]) ** 2).sum(-1), axis=1)[:, 1:K + 1]
    assert np.mean([len(set(a) & set(b)) / K for a, b in zip(ids[ROWS:], exact)]) >= 0.99


def test_a_kmeans_build_merges_from_its_gnnd_cache_without_writing_or_reading_graphs_between(tmp_path, monkeypatch):
    """The plan step runs inside the build's one run: the shards' GNND graphs stay in the cache for the
    merges, so a build shorter than a checkpoint writes each graph once and reads nothing back from the store.
    The input is read once where host RAM holds it between the labelling and the sharding pass, twice where
    the host budget is too small for that; the graph is the same either way."""
    from bigknn.backends.cpu import CpuBackend
    from bigknn.core.params import GnndParams
    from bigknn.operations import build as build_module
    from bigknn.operations.build import BuildRequest, build
    from bigknn.core.progress import Reporter
    from bigknn.shards import Store, store as store_module

    reads = []
    real = store_module.Store.read_graph
    monkeypatch.setattr(store_module.Store, "read_graph", lambda self, *a: reads.append(a) or real(self, *a))
    monkeypatch.setenv("BIGKNN_CHECKPOINT_S", "3600")
    x = synth(ROWS, DIM, clusters=20, seed=5)
    write_vectors(tmp_path / "x.fbin", x)
    params = GnndParams(k=K, list_width=16)
    input_gb, graphs_gb = x.nbytes / 1e9, ROWS * K * 8 / 1e9  # final graphs k wide: ids and keys, 4 bytes each
    graphs = []
    for passes in (1, 2):
        if passes == 2:  # a host budget too small for the input (but not for the cache: no merge reads back)
            monkeypatch.setattr(build_module, "input_fits_host", lambda nbytes, host_mem: False)
        out = build(BuildRequest(input=tmp_path / "x.fbin", store=tmp_path / f"s{passes}", shard_rows=SHARD_ROWS,
                                 partition="kmeans", params=params), [CpuBackend()], Reporter())
        assert out["shards"] >= 5 and 0 < out["merges_done"] < out["all_pairs"]
        assert out["read_gb"] == pytest.approx(passes * input_gb, abs=1e-3), out
        assert out["written_gb"] == pytest.approx(input_gb + graphs_gb, abs=1e-3), out
        store = Store.open(tmp_path / f"s{passes}", pin=False)
        graphs.append(np.concatenate([real(store, s.id).ids for s in store.manifest.shards]))
    assert reads == []
    np.testing.assert_array_equal(graphs[0], graphs[1])


def test_auto_partitions_with_kmeans_only_where_near_pairs_can_leave_merges_out():
    from bigknn.operations.plan_model import AUTO_KMEANS_SHARDS, resolve_partition

    below, at = (AUTO_KMEANS_SHARDS - 1) * 1000, AUTO_KMEANS_SHARDS * 1000
    assert resolve_partition("auto", below, 1000, K) == "contiguous"
    assert resolve_partition("auto", at, 1000, K) == "kmeans"
    for method in ("contiguous", "kmeans", "rptree"):  # a method named is a method run
        assert resolve_partition(method, at, 1000, K) == resolve_partition(method, below, 1000, K) == method


def test_a_default_build_of_many_shards_is_partitioned_and_of_few_is_contiguous(stores, tmp_path):
    from bigknn.operations.plan_model import AUTO_KMEANS_SHARDS

    for shards, method in ((AUTO_KMEANS_SHARDS, "kmeans"), (3, "contiguous")):
        store = tmp_path / f"{shards}.knn"
        run_json("build", stores["dir"] / "x.fbin", "-o", store, "--k", K, "--shard-rows", -(-ROWS // shards),
                 "--backend", "cpu", "--list-width", 16)
        m = json.loads((store / "manifest.json").read_text())
        assert (m["partition"] or {}).get("method", "contiguous") == method
