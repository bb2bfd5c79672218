"""``bigknn merge``: finish whatever a killed run left undone, a build's or an ingest's."""

from __future__ import annotations

import time
from pathlib import Path

from bigknn.backends import Backend
from bigknn.core.errors import BadInput
from bigknn.operations.build import summary
from bigknn.engine.executor import Executor, InProcess
from bigknn.operations.ingest import resume_pending
from bigknn.engine.pending import cache_shards, record_timings, run_build_steps
from bigknn.operations.verify import verify
from bigknn.engine.accounting import Accounting
from bigknn.core.progress import Reporter
from bigknn.shards import Store, WriterLock


def finish(store_path: Path, backends: list[Backend], reporter: Reporter, wait_s: float = 0.0,
           host_mem: int | None = None, executor: Executor | None = None) -> dict:
    """Run what the store has pending under its writer lock; ``executor``: where the tasks run (default: on
    ``backends``, in this process)."""
    t0 = time.perf_counter()
    acct = Accounting()
    executor = executor or InProcess(backends)
    # refuse a missing or foreign directory, or a request that cannot run, before the lock file is touched
    _check(Store.open(store_path, pin=False), len(backends), host_mem)
    with WriterLock(store_path, wait_s):
        store = Store.open(store_path, pin=False)
        _check(store, len(backends), host_mem)
        _refuse_damage(store)
        if store.manifest.pending:
            resume_pending(store, executor, reporter, acct, host_mem)
        else:
            run_build_steps(store, backends, executor, reporter, acct, host_mem)
        record_timings(store, acct)
        store.close()
    return summary(store, acct, time.perf_counter() - t0, resumed=True, backends=backends)


def _refuse_damage(store: Store) -> None:
    """Refuse (exit 2) a store with a missing or wrongly sized chunk (``bigknn verify`` without reading the
    contents): a merge would stop at it halfway, or, on a finished store, call it complete ("nothing to do")."""
    report = verify(store, contents=False)
    if report["damaged"]:
        first = report["damaged"][0]
        raise BadInput(store.path, f"the store is damaged ({first['file']}: {first['problem']}; "
                                   f"{len(report['damaged'])} problem(s) in all); run {report['repair'][0]} first")


def _check(store: Store, workers: int, host_mem: int | None) -> None:
    """Refusals (exit 2) of a merge that cannot run: nothing sharded yet, or shards that --host-mem cannot hold."""
    m = store.manifest
    if not m.shards:
        raise BadInput(store.path, "sharding never finished; rerun `bigknn build` with the same input")
    pending = m.pending.shards if m.pending else []
    cache_shards(m, store.path, max([s.rows for s in m.shards + pending]), workers, host_mem)
