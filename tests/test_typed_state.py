"""Typed state (issue 34): the manifest's build parameters are a GnndParams read and written in one place, in
the JSON older stores hold; one Metric per metric says its kernel id, keys, distances and normalisation, and
the CUDA kernels' compile-time METRIC comes from it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from bigknn.core.metric import COSINE, IP, L2, METRICS, metric
from bigknn.core.params import GnndParams
from bigknn.shards.manifest import Manifest
from bigknn.shards.sections import STORES_KEYS, PartitionSpec, PendingWrite, SearchEntry, ShardEntry

ROOT = Path(__file__).resolve().parents[1]
OLD = {"dim": 4, "dtype": "<f4", "metric": "l2", "k": 5, "shard_rows": 100, "seed": 0, "format": 2,
       "params": {"k": 5, "samples": 0, "iters": 12, "min_update_frac": 0.05, "merge_iters": 8}}


def test_params_read_back_typed_and_written_as_the_same_json():
    params = GnndParams(k=7, recall=0.95, samples=6, iters=9, min_update_frac=0.1, merge_iters=4, list_width=64)
    m = Manifest.from_json(json.dumps(dict(OLD, params=params.to_manifest())))
    assert m.params == params and m.params.width() == 64
    again = json.loads(m.to_json())
    assert again["params"] == params.to_manifest() == {"k": 7, "recall": 0.95, "samples": 6, "iters": 9,
                                                       "min_update_frac": 0.1, "merge_iters": 4, "list_width": 64}
    assert Manifest.from_json(m.to_json()) == m


def _written(raw: dict) -> str:
    """A manifest as bigknn writes it (Manifest.to_json's layout), from its JSON object."""
    return json.dumps(raw, indent=1)


# every top-level field, in the order the dataclass writes them: what a store written today holds
TODAY = {"dim": 4, "dtype": "<f4", "metric": "l2", "k": 5, "shard_rows": 100,
         "params": {"k": 5, "recall": 0.99, "samples": 0, "iters": 12, "min_update_frac": 0.05, "merge_iters": 8,
                    "list_width": 0},
         "seed": 0, "format": 6, "inputs": [{"path": "/data/x.fbin", "size": 1608, "rows": 100, "first_id": 0}],
         "shards": [{"id": 0, "offset": 0, "rows": 100, "graph": 3}], "merged": [], "timings": {"gnnd": 1.5},
         "pending": None, "estimate": None, "search": None, "partition": None, "pairs": None, "ids": "int32"}


def test_partition_section_read_back_typed_and_written_as_the_same_bytes():
    raw = {"method": "kmeans", "arrays": ["centroids", "shard_of"], "shards": 3}
    text = _written(dict(TODAY, partition=raw, pairs=[[0, 1]]))
    m = Manifest.from_json(text)
    assert m.partition == PartitionSpec("kmeans", ["centroids", "shard_of"], 3) and m.partition_method == "kmeans"
    assert m.to_json() == text
    assert Manifest.from_json(_written(TODAY)).partition is None and Manifest.from_json(_written(TODAY)).to_json() \
        == _written(TODAY)
    with pytest.raises(ValueError, match="partition"):  # refused as the schema's one line, not a KeyError
        Manifest.from_json(_written(dict(TODAY, partition={"method": "kmeans", "arrays": []})))


@pytest.mark.parametrize("made", [
    {"alpha": 1.2, "lambda0": 4, "knn_k": 32, "mean_degree": 21.5, "seconds": 3.25},  # what prune records today
    {"alpha": 1.2, "lambda0": 4, "knn_k": 32, "nn1": 0.5, "mean_degree": 21.5, "seconds": 3.25}])  # and before
def test_search_section_read_back_typed_and_written_as_the_same_bytes(made):
    raw = {"version": 2, "method": "tsdg", "degree": 24, "rows": 100, "graphs": [3], **made}
    text = _written(dict(TODAY, format=3, search=raw))
    m = Manifest.from_json(text)
    assert m.search == SearchEntry(2, "tsdg", 24, 100, [3], made) and m.search.version == 2
    assert m.to_json() == text
    with pytest.raises(ValueError, match="search.degree"):  # what readers rely on is still checked
        Manifest.from_json(_written(dict(TODAY, search=dict(raw, degree="24"))))


NEW_SHARD = {"id": 1, "offset": 100, "rows": 40, "graph": None, "source": None, "rows_with_graph": False}
INGEST = {"inputs": [{"path": "/data/y.fbin", "size": 648, "rows": 40, "first_id": 100}], "shards": [NEW_SHARD],
          "graphs": {"1": 0, "0": 4}, "merged": [[0, 1]], "near": None}
# a merge of stores lays its keys out in another order and has no near shards
STORES = {"inputs": [{"path": "/s/other.knn", "rows": 40, "first_id": 100, "store": "ab12"}], "shards": [NEW_SHARD],
          "merged": [], "graphs": {"1": 2}}


@pytest.mark.parametrize("raw", [INGEST, dict(INGEST, near=[0]), STORES], ids=["ingest", "near", "stores"])
def test_pending_section_read_back_typed_and_written_as_the_same_bytes(raw):
    text = _written(dict(TODAY, pending=raw))
    m = Manifest.from_json(text)
    assert m.pending.shards == [ShardEntry(1, 100, 40)] and m.pending.near == raw.get("near")
    assert m.pending.graphs == {int(sid): v for sid, v in raw["graphs"].items()}  # shard ids as numbers
    assert m.to_json() == text
    with pytest.raises(ValueError, match="pending.graphs"):
        Manifest.from_json(_written(dict(TODAY, pending=dict(raw, graphs={"x": 1}))))


def test_pending_writes_made_here_lay_out_their_keys_as_before():
    shard = ShardEntry(1, 100, 40)
    ingest = PendingWrite(INGEST["inputs"], [shard], near=None)
    ingest.graphs[1], ingest.graphs[0] = 0, 4
    ingest.merged.append([0, 1])
    assert json.dumps(ingest.to_dict()) == json.dumps(INGEST)
    stores = PendingWrite(STORES["inputs"], [shard], {1: 2}, [], layout=STORES_KEYS)
    assert json.dumps(stores.to_dict()) == json.dumps(STORES)


def test_params_an_older_store_left_out_take_their_defaults():
    m = Manifest.from_json(json.dumps(OLD))  # written before recall and list_width were recorded
    assert m.params == GnndParams(k=5, iters=12, merge_iters=8)
    assert m.params.recall == GnndParams().recall and m.params.width() == GnndParams(k=5).width()


def test_every_metric_says_its_kernel_and_its_kernel_id_is_the_kernels():
    assert METRICS == ("l2", "ip", "cosine") and [metric(n) for n in METRICS] == [L2, IP, COSINE]
    documented = dict((name, int(i)) for i, name in re.findall(r"METRIC (\d) = (\w+)",
                                                               (ROOT / "bigknn/backends/cuda/common.cuh").read_text()))
    assert documented == {"l2": 0, "ip": 1}
    for m in (L2, IP, COSINE):
        assert m.kernel_id == documented[m.kernel] and m.dot_keys == (m.kernel == "ip")
    assert (COSINE.kernel_id, COSINE.dot_keys) == (IP.kernel_id, IP.dot_keys)  # cosine runs ip's kernels as it is
    with pytest.raises(ValueError, match="unknown metric 'l1'"):
        metric("l1")


def test_keys_distances_and_normalisation_of_each_metric():
    a = np.array([[3.0, 4.0], [0.0, 0.0]], np.float32)
    b = np.array([[0.0, 0.0], [1.0, 0.0]], np.float32)
    np.testing.assert_allclose(L2.pairwise_keys(a, b), [[25, 20], [0, 1]])
    np.testing.assert_allclose(IP.pairwise_keys(a, b), [[0, -3], [0, 0]])
    np.testing.assert_allclose(L2.row_keys(a, b), [25, 1])
    keys = np.array([4.0, -1.0, -2.0], np.float32)
    np.testing.assert_allclose(L2.distance(np.array([4.0, 0.0])), [2, 0])
    np.testing.assert_allclose(IP.distance(keys), [5, 0, -1])
    np.testing.assert_allclose(COSINE.distance(keys), [5, 0, 0])  # clipped: never below 0
    np.testing.assert_allclose(COSINE.prepare(a), [[0.6, 0.8], [0, 0]])  # zero rows stay zero
    assert L2.prepare(a) is a and IP.stored_dtype(np.uint8) == np.uint8 and COSINE.stored_dtype(np.uint8) == np.float32
