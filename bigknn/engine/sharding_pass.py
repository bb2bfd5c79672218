"""The sharding pass: input rows -> checked, prepared shard vectors in the store, streamed to GNND.

One pass over the input file: a reader thread has each shard's rows read in blocks by a pool (copies and
checks release the GIL, and a cold file gets several reads in flight), bad rows (NaN/Inf, norms that
overflow) refused and the rows prepared for the metric; a small pool writes them to the store; another thread
hashes the file's bytes from the same mapping (hashlib releases the GIL), and a file that changed while
it was read is refused. Each shard is handed on, vectors in memory, as soon as it is read and checked (not
once written: on a 50M build the writes fill the page cache's dirty limit and a GPU waited for them), so
GNND runs while its rows are written and the rest of the file is sharded; a read of those rows from the
store waits for their write (Store.vectors_being_written). The store's commits are held back for the whole
pass: the shards, the input's sha256 and any graph finished meanwhile become visible in one commit at its
end, so a crash mid-pass leaves no half-sharded store (the rerun shards again).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numpy as np

from bigknn.formats import VectorSource
from bigknn.core.hostmem import filled_once
from bigknn.core.metric import prepare_rows
from bigknn.engine.accounting import Accounting
from bigknn.shards import ShardEntry, Store
from bigknn.shards.user_ids import part_bytes as user_id_bytes
from bigknn.shards.user_ids import write_part as write_user_ids

WRITES_IN_FLIGHT = 2  # shards being written while the next is read
READ_BLOCK_BYTES = 32 << 20  # input bytes per block


def shard_total(rows: int, shard_rows: int, k: int) -> int:
    """How many shards ``shard_sizes`` makes."""
    return max(1, min(-(-rows // shard_rows), rows // (k + 1)))


def shard_sizes(rows: int, shard_rows: int, k: int) -> list[int]:
    """Balanced contiguous shards of at most ``shard_rows`` rows and more than k rows each (fewer, larger
    shards where that is impossible)."""
    count = shard_total(rows, shard_rows, k)
    base, extra = divmod(rows, count)
    return [base + (i < extra) for i in range(count)]


def stream_shards(store: Store, vf: VectorSource, sizes: list[int], acct: Accounting, ready: int = 2,
                  layout: list[np.ndarray] | None = None,
                  kept: np.ndarray | None = None,
                  reference: bool = False) -> Iterator[tuple[ShardEntry, np.ndarray]]:
    """Write the input's rows as shards ``sizes`` after the store's last row; yield (shard, vectors) as each
    is written, at most ``ready`` ahead of the consumer; the input's user ids (``--id-column``), if it has
    them, are written beside (bigknn/shards/user_ids.py). ``layout``: each shard's input rows (a partitioned
    build, bigknn/algorithms/partition/labelling.py, whose labelling checked the rows), stored with it as ``row_ids``;
    None: consecutive rows. ``kept``: every input row as prepared, held in host RAM by the labelling pass
    (bigknn/algorithms/partition/labelling.py ``layout``): shards are gathered from it, the file is not read again.
    ``reference``: the shards record their byte range of the flat file ``vf`` (bigknn/shards/referenced.py) and
    no vectors are written. Commits the
    shards (and the input's sha256, in ``store.manifest.inputs[-1]``) once all are written; raises BadInput
    on a bad row or a file that changed meanwhile, committing nothing. Closing the generator early stops the
    pass, committing nothing."""
    out: queue.Queue = queue.Queue(maxsize=max(1, ready))
    stop = threading.Event()
    done = object()

    def produce() -> None:
        try:
            with store.deferred_commits(), ThreadPoolExecutor(2) as hasher, \
                    ThreadPoolExecutor(WRITES_IN_FLIGHT) as writers, ThreadPoolExecutor(vf.read_threads) as readers:
                digest = hasher.submit(vf.sha256)
                m = store.manifest
                offset, first, start = m.rows, len(m.shards), 0
                ids = None if vf.id_column is None else hasher.submit(
                    write_user_ids, store.path, offset, vf.path, vf.user_ids())
                t = time.perf_counter()
                in_flight: deque = deque()  # writes not yet seen to end (their errors are raised here)
                written = 0  # bytes on disk
                for i, rows in enumerate(sizes):
                    x = shard_vectors(vf, readers, m.metric, np.dtype(m.dtype), start, rows,
                                      None if layout is None else layout[i], kept)
                    source = {"input": len(m.inputs) - 1,
                              "byte_offset": vf.header_bytes + start * vf.row_bytes} if reference else None
                    entry = ShardEntry(id=first + i, offset=offset + start, rows=rows, source=source)
                    row_ids = None if layout is None else layout[i]
                    if source is None:
                        write = writers.submit(_write_shard, store, entry.id, x, row_ids)
                        store.vectors_being_written(entry.id, write)
                        in_flight.append(write)
                    with store.lock:
                        m.shards.append(entry)
                    put((entry, x))
                    start += rows
                    while len(in_flight) >= WRITES_IN_FLIGHT or (in_flight and in_flight[0].done()):
                        written += in_flight.popleft().result()
                    if stop.is_set():
                        raise _Stopped
                while in_flight:
                    written += in_flight.popleft().result()
                sha256 = digest.result()
                if ids is not None:
                    ids.result()
                    written += user_id_bytes(store.path, offset)
                vf.check_unchanged()  # else the rows and the hash may be of different bytes
                with store.lock:
                    m.inputs[-1]["sha256"] = sha256
                nbytes = vf.rows * vf.dim * vf.dtype.itemsize
                acct.add("shard", time.perf_counter() - t, 0 if kept is not None else nbytes, written)
            out.put(done)
        except _Stopped:
            pass
        except BaseException as e:  # noqa: BLE001 - raised in the consumer's thread
            out.put(e)

    def put(item) -> None:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.2)
                return
            except queue.Full:
                continue
        raise _Stopped

    with acct.span("shard"):
        thread = threading.Thread(target=produce, daemon=True, name="shard")
        thread.start()
        try:
            while (item := out.get()) is not done:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            thread.join()


def shard_vectors(vf: VectorSource, pool: ThreadPoolExecutor, metric: str, dtype: np.dtype, start: int, rows: int,
                  layout: np.ndarray | None = None, kept: np.ndarray | None = None) -> np.ndarray:
    """A shard's vectors as stored: input rows [start, start + rows), checked and prepared for ``metric``, or
    the input rows ``layout`` (a partitioned shard: the labelling pass checked them), read by ``pool`` in
    blocks that begin where the source's decoding units do (``block_starts``: whole row groups of Parquet, so
    that no group is decoded twice); the first bad row in file order is the one named. A partitioned shard of
    a source without cheap scattered reads (Parquet) is read in blocks of input ranges, so that each row group
    is decoded once per shard, not once per block.
    ``kept``: the input's rows as prepared, in host RAM (``stream_shards``): the blocks gather from it."""
    x = filled_once((rows, vf.dim), dtype)
    step = max(1, READ_BLOCK_BYTES // (vf.dim * vf.read_dtype.itemsize))
    starts = np.asarray(vf.block_starts(start, start + rows, step)) - start
    if layout is not None and kept is None and not vf.random_access:  # input ranges: a row group decoded once
        starts = np.unique(np.searchsorted(layout, vf.block_starts(0, vf.rows, step)))
        starts = starts[starts < rows]
    ends = np.append(starts[1:], rows)

    def block(a: int, b: int) -> None:
        part = x[a:b]
        if kept is not None:  # checked and prepared by the labelling pass
            np.take(kept, layout[a:b], axis=0, out=part)
            return
        if layout is None:
            vf.read_into(start + a, part)  # one copy from a flat file's mapping, cast as stored
            vf.check(start + a, part)
        else:
            part[...] = vf.take(layout[a:b])
        if (prepared := prepare_rows(part, metric)) is not part:
            part[...] = prepared

    for done in [pool.submit(block, int(a), int(b)) for a, b in zip(starts, ends)]:
        done.result()  # in file order, so that an error names the first bad row
    return x


def _write_shard(store: Store, sid: int, x: np.ndarray, row_ids: np.ndarray | None) -> int:
    """Write a shard's vectors (and row ids); the bytes written."""
    return store.write_vectors(sid, x) + (0 if row_ids is None else store.write_row_ids(sid, row_ids))


class _Stopped(Exception):
    """The consumer went away: end the pass without committing."""
