"""CUDA backend: GNND (GNND paper §4), GGM (§5.1) and exact k-NN on one GPU through CuPy + CUDA C++ kernels.

CuPy is imported inside the functions only, so this package imports on machines without a GPU.
``CudaBackend`` holds the backend's state (``gpu.Gpu``) and hands each call to the module that does it:

* ``gnnd.py``     GNND of one shard; ``descent.py`` the iterations it shares with GGM.
* ``ggm.py``      GGM of two shards (set-up, cross-shard descent, fold-back).
* ``exact.py``    exact k-NN over blocks streamed from the host.
* ``target.py``   the recall target of a descent (probe rows read off the device, lists widened).
* ``search.py``   batch graph search (search_keys.cu, search.cu); ``prune.py`` diversification of candidate lists
                  (prune.cu); GGNN's path-back test (the reference's blocks on CuPy arrays).
* ``compile.py``  the kernel sources (common.cuh, gnnd.cu, cross.cu, ggm.cu, exact.cu, exact_fused.cu,
                  search_keys.cu, search.cu, prune.cu) compiled by NVRTC.
* ``rows.py``     rows laid out for the kernels, half-precision copies; ``transfer.py`` host <-> device
                  copies; ``resident.py`` device copies kept between calls (``kept.py``: of the index a
                  search sweep reads, the rows a prune reads); ``memory.py`` the budget and
                  what each call needs of it.

Every call but a search frees CuPy's memory pools at its end.
"""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable

import numpy as np

from bigknn.backends.cpu.search_calls import SearchReference
from bigknn.backends.base import CallShape
from bigknn.backends.cuda import exact, ggm, gnnd, memory, spanning, warmup
from bigknn.backends.cuda import diversify as prune
from bigknn.backends.cuda import graph_search as search
from bigknn.backends.cuda.gpu import Gpu
from bigknn.backends.cuda.kept import KeptCopy
from bigknn.core.errors import BadInput
from bigknn.core.knn_graph import LOCAL_ID_DTYPE, KnnGraph, ShardPart, id_dtype
from bigknn.core.metric import Metric
from bigknn.core.params import GnndParams
from bigknn.core.progress import log
from bigknn.algorithms.partition.nearest import device_block_rows, nearest_by_blocks
from bigknn.algorithms.recall_target import Probe
from bigknn.algorithms.search_index import SearchIndex
from bigknn.algorithms.search_params import DiversifyRule, PruneParams, SearchPlan


def _report_failure(future) -> None:
    """An upload ahead that failed only costs the next merge its own upload; say so on stderr."""
    if future.exception() is not None:
        log.warning("uploading the next shards ahead failed: %r", future.exception())


def _nearest_centroids(gpu: Gpu, x: np.ndarray, count: int, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import cupy as cp

    return nearest_by_blocks(cp, x, count, centroids, device_block_rows(len(centroids), x.shape[1]))


def _option(name: str) -> property:
    """An option of the calls, kept on the backend's Gpu (set between calls to compare variants)."""
    return property(lambda self: getattr(self.gpu, name), lambda self, value: setattr(self.gpu, name, value))


class CudaBackend(SearchReference):
    """GNND and exact k-NN on one GPU. ``gpu_mem_bytes`` caps the device memory a call plans to use."""

    name = "cuda"
    search_warms_by_shape = True
    gnnd_bytes = staticmethod(memory.gnnd_bytes)
    ggm_bytes = staticmethod(memory.ggm_bytes)
    profile = _option("profile")
    l2_expand = _option("l2_expand")
    tensor_cores = _option("tensor_cores")

    def __init__(self, gpu_mem_bytes: int | None = None, device: int | None = None, profile: bool = False,
                 l2_expand: bool | None = None, tensor_cores: bool | None = None):
        # profile, l2_expand, tensor_cores: options of the calls (gpu.Gpu says what they do)
        self.gpu = Gpu(gpu_mem_bytes, device, profile, l2_expand, tensor_cores)
        self._ahead: ThreadPoolExecutor | None = None  # uploads the next pair's shards (stage)
        self._ahead_lock = threading.Lock()
        self._copy_stream = None
        self._search_index = KeptCopy()  # the index being searched, on the device while it lives
        self._prune_table = KeptCopy()  # the rows of the prune in progress, likewise
        self._warming: threading.Thread | None = None  # the kernels' warm-up (warm_up), while it runs
        self._ahead_paused = False  # set while a call retries after running out of memory (_make_room)
        self._span_with: list[Gpu] = []  # the other GPUs a gnnd spans (spanning)
        # the CUDA context (~0.6 s on an H200) is made while the caller still reads and checks its input
        threading.Thread(target=self._make_context, daemon=True, name="cuda-context").start()

    def _make_context(self) -> None:
        try:
            with self.gpu.context():
                import cupy

                cupy.empty(1)
        except Exception:  # noqa: BLE001 - the first real call meets the same error and reports it
            pass

    @property
    def last_stats(self) -> dict:
        """Timings and counts of the last gnnd / ggm call."""
        return self.gpu.last_stats

    def _call(self, fn, *args):
        """fn(gpu, *args) on this backend's GPU once any warm-up has ended (its wait in the call's stats,
        ``warm_up_wait_s``), CuPy's pools freed afterwards; out of device memory, once more (``_attempts``)."""
        waited = self._await_warm_up()
        with self.gpu.context():
            try:
                out = self._attempts(fn, args)
            finally:
                self._ahead_paused = False
                memory.free_pools()
        if waited:
            self.gpu.last_stats = dict(self.gpu.last_stats, warm_up_wait_s=waited)
        return out

    def _attempts(self, fn, args: tuple):
        """fn(gpu, *args), run once more without the copies kept between calls (``_make_room``) where it runs out
        of device memory. The retry starts after the ``except`` clause: until it ends, the error's traceback
        holds the failed run's frames and every device array in them (a merge of 35M rows of 64 bytes: ~41 GB)."""
        import cupy as cp

        try:
            return fn(self.gpu, *args)
        except cp.cuda.memory.OutOfMemoryError as e:
            why = f"{str(e).rstrip('.')} ({memory.pool_state(self.gpu)})"  # numbers only: nothing of the run kept
        self._make_room(why)
        return fn(self.gpu, *args)

    def memory_budget(self) -> int:
        """Bytes of this backend's GPU that one call may plan to use (what shard sizes are chosen from)."""
        with self.gpu.context():
            return self.gpu.budget()

    def gnnd(self, x: np.ndarray, metric: Metric, params: GnndParams, seed: int, on_iter=None,
             probe: Probe | None = None) -> KnnGraph:
        if self._span_with:
            return self._call(self._spanning_gnnd, x, metric, params, seed, on_iter, probe)
        return self._call(gnnd.gnnd, x, metric, params, seed, on_iter, probe)

    def spanning(self, others: list) -> "CudaBackend | None":
        """This backend with its ``gnnd`` across its GPU and the others' (spanning.py: the rows on every GPU,
        the lists split between them); the others must be CUDA backends of other devices. None for no others."""
        gpus = [self.gpu] + [o.gpu for o in others if isinstance(o, CudaBackend)]
        if len(gpus) < 2 or len(gpus) != len(others) + 1:
            return None
        if len({g.device for g in gpus}) != len(gpus):
            raise ValueError(f"a descent across GPUs needs distinct devices, got {[g.device for g in gpus]}")
        wide = copy.copy(self)  # the same Gpu, copies kept and warm-up: the caller uses one or the other
        wide._span_with = gpus[1:]
        return wide

    def _spanning_gnnd(self, gpu: Gpu, *args) -> KnnGraph:
        """spanning.spanning_gnnd over this GPU and the others; every GPU's pools freed afterwards."""
        import cupy as cp

        try:
            return spanning.spanning_gnnd([gpu] + self._span_with, *args)
        finally:
            for other in self._span_with:
                with cp.cuda.Device(other.device):
                    memory.free_pools()

    def ggm(self, a: ShardPart, b: ShardPart, metric: Metric, params: GnndParams, seed: int,
            on_iter=None, vias: list[ShardPart] | None = None) -> tuple[KnnGraph, KnnGraph]:
        """GGM (GNND paper §5.1, Alg. 3) of shards a and b on the GPU; ids in and out are global.

        Contract of the CPU reference (bigknn/algorithms/merge_setup.py, CpuBackend.ggm): lists W = params.width() wide;
        set-up keeps the first W - W//2 in-pair entries of each old list and adds W//2 (at least 1) random
        rows of the other shard (NEW); cross-shard descent (params.merge_iters, early stop under
        min_update_frac * n * W updates); each refined list is merged with the row's whole old list (ids of
        other shards included), de-duplicated, sorted, cut to W. Returned keys are exact. ``vias``: a seeded
        merge (rows of a get no fill and keep their bound; rows of b are seeded two hops through vias).
        """
        for part in (a, b, *(vias or [])):
            _require_int32_ids(part.offset + part.graph.rows, part.graph.ids.dtype)
        return self._call(ggm.ggm, a, b, metric, params, seed, on_iter, vias)

    def exact_knn(self, queries: np.ndarray, k: int, metric: Metric,
                  blocks: Iterable[tuple[int, np.ndarray]]) -> KnnGraph:
        return self._call(exact.exact_knn, queries, k, metric, _int32_blocks(blocks))

    def nearest_centroids(self, x: np.ndarray, count: int, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The CPU backend's search (nearest.nearest_by_blocks) in CuPy: one cuBLAS GEMM per block against a few
        centroids, where the exact k-NN's kernel, re-keying and sort were made for many rows. The rows go up as
        they are (uint8: a quarter of the bytes) and are made float32 on the device: a host conversion took a
        fresh float32 array per chunk of the labelling pass, page faults and all."""
        return self._call(_nearest_centroids, x, count, centroids)

    def diversify_lists(self, cands: np.ndarray, keys: np.ndarray, table: np.ndarray, metric: Metric,
                        rule: DiversifyRule, width: int) -> tuple[np.ndarray, np.ndarray]:
        return self._call(prune.diversify_lists, self._prune_table, cands, keys, table, metric, rule, width)

    def nearest_lists(self, rows: int, width: int, row: np.ndarray, ids: np.ndarray, keys: np.ndarray,
                      lists: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        return self._call(prune.nearest_lists, rows, width, row, ids, keys, lists)

    def prune_tsdg(self, ids: np.ndarray, keys: np.ndarray, table: np.ndarray, metric: Metric,
                   params: PruneParams) -> tuple[np.ndarray, np.ndarray, int]:
        return self._call(prune.prune_tsdg, self._prune_table, ids, keys, table, metric, params)

    def reach_back(self, table: np.ndarray, lists: np.ndarray, list_index: np.ndarray, x: np.ndarray,
                   z: np.ndarray, z_ids: np.ndarray) -> np.ndarray:
        return self._call(prune.reach_back, self._prune_table, table, lists, list_index, x, z, z_ids)

    def searched_queries(self, rows: np.ndarray, metric: Metric, name: str, first_row: int) -> Any:
        with self.gpu.context():
            return search.searched_queries(rows, metric, name, first_row)

    def graph_search(self, index: SearchIndex, queries: Any, plan: SearchPlan, batch: int) -> KnnGraph:
        """Unlike the other calls, CuPy's pool keeps what a search allocated (a few MB a batch): freed after
        each call, every batch-1 search paid cudaMalloc / cudaFree (which waits for the device) per array."""
        with self.gpu.context():
            return search.graph_search(self.gpu, self._search_index, index, queries, plan, batch)

    def forget_index(self, index: SearchIndex) -> None:
        if self._search_index.holds(index):
            with self.gpu.context():
                self._search_index.drop()
                memory.free_pools()

    def warm_up(self, say: Callable[[str], None], like: CallShape | None = None) -> float:
        """Start compiling (or loading) the kernels of calls ``like`` in the background (warmup.py) and return
        at once: the build reads its first shard meanwhile, and the first call waits for it (``_call``)."""
        if like is None or self._warming is not None:
            return 0.0
        if warmup.cache_is_cold():
            say(f"compiling the GPU kernels while the input is read (once per machine; kept in "
                f"{warmup.kernel_cache()})")
        self._warming = threading.Thread(target=self._rehearse, args=(like,), daemon=True, name="cuda-warm-up")
        self._warming.start()
        return 0.0

    def _rehearse(self, like: CallShape) -> None:
        try:
            with self.gpu.context():
                try:
                    warmup.rehearse(self.gpu, like)
                finally:
                    memory.free_pools()
        except Exception as e:  # noqa: BLE001 - the first real call meets the same problem and reports it
            log.debug("GPU warm-up failed: %r", e)

    def _make_room(self, why: str) -> None:
        """After a call ran out of device memory its plan counted on (``why``: CuPy's message): stop the uploads
        ahead, wait for the one in flight, drop every copy kept between calls, and let the call run once more on
        what that frees."""
        log.warning("GPU %s: %s; retrying without the copies kept between calls", self.gpu.device, why)
        self._ahead_paused = True
        if self._ahead is not None:
            self._ahead.submit(lambda: None).result()  # the uploads queued before it have ended
        while self.gpu.resident.drop_oldest():
            pass
        memory.free_pools()

    def _await_warm_up(self) -> float:
        """Seconds waited for the warm-up to end (0 where none runs)."""
        t = self._warming
        if t is None or not t.is_alive():
            return 0.0
        start = time.perf_counter()
        t.join()
        return time.perf_counter() - start

    def stage(self, arrays: Iterable[np.ndarray]) -> None:
        """Start copying host arrays (the next pair's shards, or a shard its recall sample and GNND both read) to
        this GPU on a stream of their own while the current call computes, so the next call finds them there
        (or waits for them: resident.py). Returns at once; arrays already on the GPU are skipped, and copies
        stop where they would leave less free memory than the last call used."""
        resident = self.gpu.resident
        todo = [a for a in arrays if isinstance(a, np.ndarray) and a.flags.c_contiguous and not resident.has(a)]
        if not todo:
            return
        with self._ahead_lock:
            if self._ahead is None:
                self._ahead = ThreadPoolExecutor(1, thread_name_prefix="h2d-ahead")
        for a in todo:
            resident.expect(a)  # a call that needs it meanwhile waits for this copy instead of making its own
        self._ahead.submit(self._upload_ahead, todo).add_done_callback(_report_failure)

    def _upload_ahead(self, arrays: list[np.ndarray]) -> None:
        import cupy as cp

        gpu = self.gpu
        try:
            with gpu.context():
                if self._copy_stream is None:
                    self._copy_stream = cp.cuda.Stream(non_blocking=True)
                for a in arrays:
                    if gpu.resident.holds(a):  # copied since stage queued it (by a call that found no copy)
                        continue
                    with gpu.plan_lock:  # no call plans on these bytes meanwhile (memory.plan_slots)
                        if self._ahead_paused or gpu.budget() - a.nbytes < gpu.last_need + (256 << 20):
                            return
                        dev = cp.empty(a.shape, dtype=a.dtype)
                    gpu.transfer.h2d(a, dev, self._copy_stream, ahead=True)
                    gpu.resident.put(a, dev, self._copy_stream.record())
        finally:
            for a in arrays:  # those not put: given up (no memory, or an error), the callers upload them
                gpu.resident.settle(a)


def _require_int32_ids(rows: int, dtype: np.dtype = LOCAL_ID_DTYPE) -> None:
    """Refuse store-wide ids past int32 (bigknn/core/knn_graph.py id_dtype): the kernels read and write global ids as
    int32 (ggm.cu's old lists, exact.cu's running top-k), which would wrap silently past 2^31 rows."""
    if id_dtype(rows) != LOCAL_ID_DTYPE or np.dtype(dtype) != LOCAL_ID_DTYPE:
        raise BadInput("--backend cuda", "merges and exact k-NN of stores past 2^31 rows (int64 ids) run on "
                                         "--backend cpu only, for now")


def _int32_blocks(blocks: Iterable[tuple[int, np.ndarray]]) -> Iterable[tuple[int, np.ndarray]]:
    """The blocks as they are streamed, each refused whose ids would pass int32."""
    for offset, x in blocks:
        _require_int32_ids(offset + len(x))
        yield offset, x
