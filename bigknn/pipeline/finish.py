"""``bigknn merge``: finish whatever a killed run left undone, a build's or an ingest's."""

from __future__ import annotations

import time
from pathlib import Path

from bigknn.backends import Backend
from bigknn.errors import BadInput
from bigknn.pipeline.build import summary
from bigknn.pipeline.ingest import resume_pending
from bigknn.pipeline.steps import Ledger, PhaseClock, gnnd_pending, merge_pending, record_timings
from bigknn.progress import Reporter
from bigknn.shards import Store, WriterLock


def finish(store_path: Path, backend: Backend, reporter: Reporter, wait_s: float = 0.0) -> dict:
    t0 = time.perf_counter()
    clock = PhaseClock()
    with WriterLock(store_path, wait_s):
        store = Store.open(store_path)
        if not store.manifest.shards:
            raise BadInput(store_path, "sharding never finished; rerun `bigknn build` with the same input")
        if store.manifest.pending:
            resume_pending(store, backend, reporter, clock)
        else:
            ledger = Ledger(store)
            gnnd_pending(store, ledger, backend, reporter, clock)
            merge_pending(store, ledger, backend, reporter, clock)
        record_timings(store, clock)
    return summary(store, clock, time.perf_counter() - t0, resumed=True, backend=backend)
