"""Connecting a run to a Dask cluster (``--scheduler``, ``scheduler=``): an existing one by address, or a
local one (``local:N``) started for the run and stopped after it.

``dask_executor`` yields the ``DaskExecutor`` (bigknn/engine/dask/executor.py) that the face hands to a write
path (build, ingest, merge) in place of the in-process one; nothing imports dask unless a scheduler was asked
for.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from bigknn.backends import takes_device
from bigknn.core.errors import BadInput
from bigknn.core.extras import install_hint
from bigknn.core.progress import Reporter

if TYPE_CHECKING:
    from distributed import Client

    from bigknn.engine.dask.executor import DaskExecutor

LOCAL_PREFIX = "local:"
ADDRESS = re.compile(r"([a-z][a-z0-9+]*://)?[A-Za-z0-9._\-\[\]:]+")  # scheme://host:port (host, ipv6 in [])
# threads of a local:N worker: two tasks at once, so one's disk I/O overlaps the other's compute (the backend
# calls take turns: tasks.COMPUTE_LOCK); external workers should be started with --nthreads 2 likewise
TASK_THREADS = 2
CONNECT_TIMEOUT_S = 30  # for a scheduler to answer, and for its first worker to join
WATCH_S = 1.0  # how often a client waiting on a pinned task checks that the task's workers are still there
INSTALL_HINT = f"needs dask and distributed: {install_hint('dask')}; GPU workers also need dask-cuda"


@dataclass
class Cluster:
    """The Dask client of a run and how its workers make their backend (name, GPU memory cap)."""

    client: "Client"
    backend: str
    gpu_mem: int | None

    def workers(self) -> int:
        """Worker processes: one GPU each under dask-cuda, what an automatic shard size spreads over."""
        return max(1, len(self.client.nthreads()))

    def slots(self) -> int:
        """Tasks to keep in flight: one per worker thread (``TASK_THREADS`` a worker: while one computes on
        its GPU or cores, the other reads or writes)."""
        return max(1, sum(self.client.nthreads().values()))


class WorkerGone(Exception):
    """Workers a pinned task needs (``pinned_result``) left the cluster: Dask would wait for them for ever."""

    def __init__(self, workers: set[str]):
        super().__init__(sorted(workers))
        self.workers = workers


def pinned_result(client: "Client", future: Any, workers: set[str]) -> Any:
    """The result of ``future``, a task pinned (``allow_other_workers=False``) to one of ``workers`` or
    waiting on tasks pinned to the others; ``WorkerGone`` once one of them has left. Tasks are pinned, not
    merely hinted, because Dask steals a hinted task queued on a busy worker for an idle one, where the
    graphs it needs are not pending: a stolen hand-over or flush made the client revert shards whose worker
    was alive and redo their GNND and merges (40k x 16, local:2: up to 4 shards a build). A pinned task
    does not move when its worker dies (a restarted worker comes back under a new address), so the client
    watches for that and resubmits."""
    while True:
        try:
            return future.result(timeout=WATCH_S)
        except TimeoutError:
            gone = workers - set(client.nthreads())
            if gone:
                raise WorkerGone(gone) from None


@contextmanager
def dask_executor(address: str | None, backend: str, gpu_mem: int | None,
                  reporter: Reporter) -> Iterator["DaskExecutor | None"]:
    """The executor of the Dask cluster at ``address`` ("tcp://host:8786", or "local:N" for a local cluster of
    N worker processes, started here and stopped at the block's end); None for ``None`` or "": the caller runs
    the tasks in its own process."""
    if not address:
        yield None
        return
    from bigknn.engine.dask.executor import DaskExecutor

    client, local = _connect(address, backend)
    try:
        reporter.note(f"Dask scheduler {client.scheduler.address}; dashboard {client.dashboard_link}")
        yield DaskExecutor(Cluster(client, backend, gpu_mem))
    finally:
        client.close()
        if local is not None:
            local.close()


def _connect(address: str, backend: str) -> tuple["Client", Any]:
    """A client of the cluster at ``address``, and the local cluster started for it (None if it existed)."""
    try:
        from distributed import Client
    except ImportError:
        raise BadInput(f"--scheduler {address}", INSTALL_HINT) from None
    if not address.startswith(LOCAL_PREFIX) and not ADDRESS.fullmatch(address):
        raise BadInput(f"--scheduler {address!r} (or DASK_SCHEDULER_ADDRESS)",
                       "not a scheduler address like tcp://host:8786, or local:N")
    local = _local_cluster(address, backend) if address.startswith(LOCAL_PREFIX) else None
    try:
        client = Client(local if local is not None else address, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError) as e:
        if local is not None:
            local.close()
        raise BadInput(f"--scheduler {address}", f"no Dask scheduler answers there ({e})") from None
    try:
        client.wait_for_workers(1, timeout=CONNECT_TIMEOUT_S)
    except TimeoutError:
        client.close()
        raise BadInput(f"--scheduler {address}", f"no worker joined within {CONNECT_TIMEOUT_S} s") from None
    return client, local


def _local_cluster(address: str, backend: str) -> Any:
    """``local:N``: N worker processes of ``TASK_THREADS`` threads each; on a GPU machine with dask-cuda and
    a CUDA backend, a ``LocalCUDACluster`` of N workers, one GPU each."""
    try:
        workers = int(address[len(LOCAL_PREFIX):])
        if workers < 1:
            raise ValueError
    except ValueError:
        raise BadInput(f"--scheduler {address}", "local:N takes a worker count N of 1 or more") from None
    if takes_device(backend):  # plain worker processes would all take GPU 0
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            raise BadInput(f"--scheduler {address}", "GPU workers need dask-cuda (pip install dask-cuda), "
                                                     "or use --backend cpu") from None
        return LocalCUDACluster(CUDA_VISIBLE_DEVICES=list(range(workers)), threads_per_worker=TASK_THREADS,
                                dashboard_address=":0")
    from distributed import LocalCluster

    return LocalCluster(n_workers=workers, threads_per_worker=TASK_THREADS, processes=True, dashboard_address=":0")

