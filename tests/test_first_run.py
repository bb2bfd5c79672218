"""Issue 42, item 1: a first run says it compiles the CPU kernels before it does, and the compile is in no
task's time (so not in the rates, ETAs and recorded timings `bigknn plan --store` reads)."""

from __future__ import annotations

import logging

from bigknn.backends.cpu import CpuBackend, warmup
from bigknn.formats import write_vectors
from bigknn.core.params import EXACT_ROWS, GnndParams
from bigknn.operations.build import BuildRequest, build
from bigknn.core.progress import Reporter
from bigknn.core.synth import synth
from bigknn.core.metric import COSINE


def test_a_cold_kernel_cache_is_announced_and_compiled_before_the_first_task(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="bigknn")
    monkeypatch.setattr(warmup, "_warm", False)
    monkeypatch.setattr(warmup, "cached", lambda: False)  # as on a new machine: nothing compiled yet
    real_gnnd = CpuBackend.gnnd

    def gnnd(self, x, *args, **kwargs):  # the backend's calls, in order with the log's lines
        logging.getLogger("bigknn").info("gnnd of %d rows", len(x))
        return real_gnnd(self, x, *args, **kwargs)

    monkeypatch.setattr(CpuBackend, "gnnd", gnnd)
    path = tmp_path / "x.fbin"
    write_vectors(path, synth(3 * EXACT_ROWS, 8, seed=1))

    def run(store: str) -> list[str]:
        caplog.clear()
        build(BuildRequest(input=path, store=tmp_path / store, shard_rows=EXACT_ROWS + 100, params=GnndParams(k=5),
                           partition="contiguous"), [CpuBackend()], Reporter(every_s=0))
        return list(caplog.messages)

    seen = run("s.knn")
    compiling = [i for i, e in enumerate(seen) if e.startswith("compiling CPU kernels (once, ")]
    assert len(compiling) == 1 and str(warmup.cache_dir()) in seen[compiling[0]], seen
    ready = next(i for i, e in enumerate(seen) if e.startswith("kernels ready in "))
    start = seen.index("build: 3 shards' GNND and 3 pair merges to do")
    build_gnnd = [i for i, e in enumerate(seen) if e.startswith("gnnd of ") and i > start]
    assert compiling[0] < ready < start < build_gnnd[0], seen  # every task after the compile
    assert len(build_gnnd) == 3
    assert any(e.startswith("gnnd of ") for e in seen[compiling[0]:ready]), "the warm-up ran GNND"

    seen = run("t.knn")  # a second run in the same process compiles nothing and says nothing of it
    assert not any("compil" in e or "kernels ready" in e for e in seen), seen


def test_the_kernel_cache_check_names_every_kernel_a_build_calls():
    """cached() looks at the kernels of kernels.py, keypass.py, rptree.py and bounds.py, not only some of them."""
    names = {d.__name__ for d in warmup.kernels()}
    assert {"cross_match", "insert", "row_keys", "fill_random", "bounded_merge"} <= names, names
    assert "keys_block" not in names  # inlined into the others: never compiled on its own


def test_a_build_warms_its_backends_up_for_the_calls_it_will_make(tmp_path, monkeypatch):
    """The GPU's kernels are compiled per element type, row width, metric and sample count: the build hands its
    own to warm_up: a cosine store of float16 rows keeps them as float32 and hands on cosine's Metric as it is
    (its kernels are ip's)."""
    from bigknn.backends import CallShape
    from bigknn.core.synth import as_dtype
    from bigknn.shards import Store

    seen: list = []
    monkeypatch.setattr(CpuBackend, "warm_up", lambda self, say, like=None: seen.append(like) or 0.0)
    path = tmp_path / "x.f16bin"
    write_vectors(path, as_dtype(synth(3 * EXACT_ROWS, 12, seed=2), "float16"))
    params = GnndParams(k=5)
    build(BuildRequest(input=path, store=tmp_path / "s.knn", metric="cosine", shard_rows=EXACT_ROWS + 100,
                       params=params, partition="contiguous"), [CpuBackend()], Reporter(every_s=0))
    m = Store.open(tmp_path / "s.knn").manifest
    assert seen == [CallShape(12, m.dtype, COSINE, m.params)] and m.dtype == "<f4" and m.params == params


def test_a_cold_cupy_cache_is_told_apart_from_a_warm_one(tmp_path, monkeypatch):
    """The GPU warm-up says it compiles only where CuPy has compiled nothing yet (its cache missing or empty)."""
    from bigknn.backends.cuda import warmup as cuda_warmup

    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "cache"))
    assert cuda_warmup.kernel_cache() == tmp_path / "cache" and cuda_warmup.cache_is_cold()
    (tmp_path / "cache").mkdir()
    assert cuda_warmup.cache_is_cold()
    (tmp_path / "cache" / "0123.cubin").write_bytes(b"x")
    assert not cuda_warmup.cache_is_cold()
