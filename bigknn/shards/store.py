"""Store: vectors and versioned graphs of every shard in a zarr v3 group, described by the manifest.

Graph writes are copy-on-write: a step writes ``shards/<id>/graph/<v>/{ids,dists}`` under a version number
no directory on disk has, then commits the manifest that points at it. Until that commit every reader sees
the previous version; a crash before it leaves an unreferenced version that later commits delete. After a
commit, versions older than the one it points at are deleted, except those a live reader's lease names
(bigknn/shards/leases.py): those wait for a later commit, or ``close()``. A reader that loaded the previous
manifest holds a lease on its versions (or reads without one and starts again, bigknn/shards/store_readers.py),
so nothing older is kept for it: a store never holds two graphs of a shard for long, and its peak on disk
is its final size plus the versions being written. Deleting runs in a background thread: deleting gigabytes of
files is slow on some file systems (online discard) and need not hold up the work; ``close()`` waits for it.

Every chunk carries a checksum (bigknn/shards/checksums.py), checked on every read: a missing or damaged
chunk raises ``Damaged`` naming the shard and the file, never reads as zeros (the array I/O:
bigknn/shards/arrays.py). Every write returns the bytes it put on disk, which a run's summary adds up.
"""

from __future__ import annotations

import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable

import numpy as np

from bigknn.core.atomic import write_atomic
from bigknn.core.errors import BadInput, Damaged
from bigknn.core.knn_graph import KnnGraph
from bigknn.shards import chunk_writes, identity, safepaths, user_ids
from bigknn.shards.arrays import ArrayDir, ReadBuffers
from bigknn.shards.creation import check_new_store_path
from bigknn.shards.leases import Lease, pinned
from bigknn.shards.manifest import MANIFEST, Manifest
from bigknn.shards.referenced import References
from bigknn.shards.names import graph_dir, graph_name, partition_name, row_ids_name, search_name, vectors_name
from bigknn.shards.upgrade import upgrade_places

CHUNK_BYTES = 16 << 20  # target size of one row chunk on disk
REAPER_THREADS = 4  # stale graph versions deleted at once


class Store(ArrayDir):
    def __init__(self, path: Path, manifest: Manifest):
        self.path = Path(path)
        self.manifest = manifest
        # held while the in-memory manifest is changed or written: several threads (sharding, the graph
        # writer) record progress in it
        self.lock = threading.RLock()
        self._deferred = 0
        self._stale_below: dict[int, int | None] = {}  # per shard: versions below this are stale (its last commit)
        self._reaper: ThreadPoolExecutor | None = None
        self._lease: Lease | None = None
        self._manifest_text: str | None = None  # as read by open()
        self._vectors_writing: dict[int, Future] = {}  # shard -> its rows' write, handed on before it ended
        self._identity_recorded = False  # in zarr.json (bigknn/shards/identity.py); checked by the first commit
        self._references: References | None = None  # the inputs of shards whose vectors are referenced
        self.meta_bytes = 0  # the manifest and group metadata this object wrote (arrays: their writes return it)

    # ---- opening and committing -------------------------------------------------------------
    @staticmethod
    def exists(path: Path) -> bool:
        return (Path(path) / MANIFEST).is_file()

    @classmethod
    def open(cls, path: Path, pin: bool = True, check_identity: bool = True) -> "Store":
        """Open a store. ``pin``: the graph versions this manifest names stay on disk until ``close()`` (or
        the process ends), whatever writers commit meanwhile; the reader's lease is taken before the manifest is
        read. A writer holding the lock, and a caller that reads only the manifest, pass ``pin=False``: that
        open writes nothing. A manifest whose dim, dtype, metric or k differs from what the store was built for
        is refused (bigknn/shards/identity.py), but for ``check_identity=False`` (``bigknn verify`` reports it)."""
        path = Path(path)
        if not path.exists():
            raise BadInput(path, "no such store")
        if not cls.exists(path):
            raise BadInput(path, "not a bigknn store (no manifest.json)")
        lease = Lease.take(path) if pin else None
        try:
            try:
                text = (path / MANIFEST).read_text()
            except (OSError, UnicodeDecodeError) as e:
                raise BadInput(path / MANIFEST, f"cannot be read ({getattr(e, 'strerror', None) or e})") from None
            try:
                manifest = Manifest.from_json(text)
            except (ValueError, TypeError, KeyError) as e:
                raise BadInput(path / MANIFEST, f"unreadable manifest: {e}") from None
            if check_identity:
                identity.refuse_edits(path, manifest)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        store = cls(path, manifest)
        store._manifest_text = text
        if lease is not None and lease.pin({s.id: s.graph for s in manifest.shards if s.graph is not None}):
            store._lease = lease
            weakref.finalize(store, lease.release)  # a reader that is never closed lets go when collected
        return store

    @classmethod
    def create(cls, path: Path, manifest: Manifest) -> "Store":
        """A new store at ``path``: a missing path or an empty directory (but for the lock file of the writer
        creating it), never among other files."""
        import zarr  # here, not at import: commands that only read a store never load it

        path = Path(path)
        check_new_store_path(path, own_lock=True)
        group = zarr.open_group(str(path), mode="a")
        group.attrs["bigknn"] = {"format": manifest.format, identity.KEY: identity.of(manifest)}
        store = cls(path, manifest)
        store.meta_bytes = (path / "zarr.json").stat().st_size
        store.commit()
        return store

    def commit(self) -> None:
        """Make the current manifest the store's state, then drop graph versions nobody can read.
        Inside ``deferred_commits()`` this does nothing: the block's end commits."""
        with self.lock:
            if self._deferred:
                return
            if self.manifest.checksummed and not self.manifest.placed:
                upgrade_places(self.path, self.manifest)
            if not self._identity_recorded:
                self._record_identity()
            text = self.manifest.to_json()
            write_atomic(self.path / MANIFEST, text)
            self.meta_bytes += len(text.encode())
            self._stale_below = self._graph_versions()
            self._reap()

    def _record_identity(self) -> None:
        """Record what the store is built for, once, in a store written before it was (its user-id parts are
        sealed first: the record says they all carry checksums)."""
        if identity.recorded(self.path) is None:
            user_ids.seal(self.path)
            identity.record(self.path, self.manifest)
        self._identity_recorded = True

    def close(self) -> None:
        """Let go of the store: a writer deletes what its commits left stale (versions a reader's lease kept
        then, if that reader is gone now) and waits for the deletions; a reader releases its lease."""
        with self.lock:
            self._reap()
        if self._reaper is not None:
            self._reaper.shutdown(wait=True)
            self._reaper = None
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def deferred_commits(self):
        """Commits inside the block are held back and made once at its end, and not at all if it raises:
        a multi-step change (the sharding pass) becomes visible whole or not at all."""
        with self.lock:
            self._deferred += 1
        completed = False
        try:
            yield
            completed = True
        finally:
            with self.lock:
                self._deferred -= 1
                if completed:
                    self.commit()

    def reload(self) -> None:
        self.manifest = Manifest.from_json((self.path / MANIFEST).read_text())
        self._references = None

    @property
    def pinned(self) -> bool:
        """Whether this reader's graph versions are held by its lease (a lease nobody removed as expired)."""
        return self._lease is not None and self._lease.held()

    def moved_on(self) -> bool:
        """Whether a writer has committed since ``open()`` read the manifest."""
        try:
            return (self.path / MANIFEST).read_text() != self._manifest_text
        except OSError:
            return True

    def _graph_versions(self) -> dict[int, int | None]:
        return {sh.id: sh.graph for sh in self.manifest.shards}

    def _reap(self) -> None:
        """Delete, in the background, the graph versions the last commit made stale that no live reader's
        lease names. Runs after the commit, so a reader either has its lease listed here or read the new
        manifest (bigknn/shards/leases.py); nothing is deleted while a reader is still opening. Dead readers'
        leases are removed on the way at every commit, also one that made nothing stale (an ingest joined into
        a new tail shard): otherwise they outlived their readers until some later commit replaced a version."""
        if not self._stale_below:  # no commit by this object (a reader): no lease of ours to judge
            return
        stale = [(sid, v) for sid, below in self._stale_below.items() for v in self._stale_graphs(sid, below)]
        pins = pinned(self.path)
        if not stale or pins is None:
            return
        for sid, version in stale:
            if (sid, version) not in pins:
                if self._reaper is None:
                    self._reaper = ThreadPoolExecutor(REAPER_THREADS, thread_name_prefix="reaper")
                self._reaper.submit(safepaths.remove_tree, self.path, graph_dir(sid, version))

    # ---- vectors ------------------------------------------------------------------------------
    def write_vectors(self, shard_id: int, x: np.ndarray, version: int | None = None) -> int:
        """Write a shard's rows; the bytes written. ``version``: into that graph version's directory (a tail
        shard's rows, which change with its lists: ShardEntry.rows_with_graph)."""
        chunk_rows = max(1, min(x.shape[0], CHUNK_BYTES // max(1, x.shape[1] * x.itemsize)))
        return self._write_array(vectors_name(shard_id, version), x, chunk_rows, x.dtype)

    def link_vectors(self, shard_id: int, other: Store, other_shard: int) -> bool:
        """Give shard ``shard_id`` the rows of ``other``'s shard ``other_shard`` as hard links to its chunk files
        (chunk_writes.link_array: each checked first, no bytes copied), where the other store keeps a copy of its
        rows in the current format on this file system; False, writing nothing, otherwise (copy them)."""
        if other._source(other_shard) is not None or not (other.manifest.placed and self.manifest.placed):
            return False
        other.vectors_written(other_shard)
        return chunk_writes.link_array(other.path / other.rows_array(other_shard), self.path, vectors_name(shard_id))

    def rows_array(self, shard_id: int) -> str:
        """Where a shard's committed rows are: with its graph version for a tail shard (a pending shard of an
        ingest is not in the manifest's list yet: its rows are in shards/<id>/vectors)."""
        return _rows_name(self.manifest, shard_id)

    def vectors_being_written(self, shard_id: int, write: Future) -> None:
        """The sharding pass hands a shard's rows to GNND while ``write`` puts them on disk: reads wait for it."""
        self._vectors_writing[shard_id] = write

    def vectors_written(self, shard_id: int) -> None:
        """Wait until the shard's rows are on disk (raising the write's error): before this store reads them,
        or another process (a Dask worker) is told to."""
        if (write := self._vectors_writing.get(shard_id)) is not None:
            write.result()

    def read_vectors(self, shard_id: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        if (source := self._source(shard_id)) is not None:
            rows = self.manifest.shards[shard_id].rows
            return self.references().rows(source, start, rows if stop is None else min(stop, rows))
        self.vectors_written(shard_id)
        return self._read_array(self.rows_array(shard_id), f"shard {shard_id} vectors", start, stop)

    def _source(self, shard_id: int) -> dict | None:
        """Where a committed shard's referenced vectors are (None: the store holds a copy)."""
        shards = self.manifest.shards
        return shards[shard_id].source if shard_id < len(shards) else None

    def references(self) -> References:
        """The inputs this store's referenced shards read from (bigknn/shards/referenced.py)."""
        if self._references is None:
            self._references = References(self.path, self.manifest.inputs, self.manifest.dim)
        return self._references

    def write_row_ids(self, shard_id: int, rows: np.ndarray) -> int:
        """A partitioned shard's input row numbers, one per stored row (bigknn/algorithms/partition/rowmap.py)."""
        data = np.asarray(rows, np.int64)[:, None]
        return self._write_array(row_ids_name(shard_id), data, max(1, min(len(data), CHUNK_BYTES // 8)), np.int64)

    def read_row_ids(self, shard_id: int) -> np.ndarray:
        return self._read_array(row_ids_name(shard_id), f"shard {shard_id} row ids")[:, 0]

    def write_partition(self, name: str, data: np.ndarray) -> int:
        """One array of the learnt partition (bigknn/algorithms/partition/learn.py), under ``partition/``."""
        return self._write_array(partition_name(name), data, max(1, data.shape[0]), data.dtype)

    def read_partition(self, name: str) -> np.ndarray:
        return self._read_array(partition_name(name), f"partition {name}")

    def remove_uncommitted_shards(self, ids: Iterable[int]) -> None:
        """Delete the arrays of shards that no commit refers to (written by a step that was then refused)."""
        for sid in ids:
            if sid < len(self.manifest.shards):
                raise ValueError(f"shard {sid} is committed; only uncommitted shards can be removed")
            safepaths.remove_tree(self.path, f"shards/{sid}")

    def vectors_of(self, global_ids: np.ndarray) -> np.ndarray:
        """Vectors of arbitrary global rows (each chunk holding any of them read once)."""
        global_ids = np.asarray(global_ids, dtype=np.int64)
        out = np.empty((global_ids.size, self.manifest.dim), dtype=np.dtype(self.manifest.dtype))
        for shard in self.manifest.shards:
            sel = np.nonzero((global_ids >= shard.offset) & (global_ids < shard.offset + shard.rows))[0]
            if sel.size and shard.source is not None:
                out[sel] = self.references().take(shard.source, global_ids[sel] - shard.offset)
            elif sel.size:
                self.vectors_written(shard.id)
                out[sel] = self._read_array_rows(self.rows_array(shard.id), f"shard {shard.id} vectors",
                                                 global_ids[sel] - shard.offset)
        return out

    # ---- graphs -------------------------------------------------------------------------------
    def next_version(self, shard_id: int, current: int | None) -> int:
        """The number of a shard's next graph version: above ``current`` and above every version directory on
        disk, so copy-on-write never writes into one a reader may hold."""
        return max([current or 0, *safepaths.versions(self.path, graph_dir(shard_id))]) + 1

    def write_graph(self, shard_id: int, version: int, graph: KnnGraph) -> int:
        """Write a graph version (not visible until a manifest commit points at it), ids in the manifest's
        id dtype; ids it cannot hold are refused, never wrapped. Returns the bytes written."""
        rows, k = graph.ids.shape
        id_dtype = self.manifest.id_dtype
        if graph.ids.dtype.itemsize > id_dtype.itemsize and rows and graph.ids.max() > np.iinfo(id_dtype).max:
            raise ValueError(f"{self.path}: shard {shard_id} holds id {graph.ids.max()}, past the store's "
                             f"{id_dtype} ids")
        chunk_rows = max(1, min(rows, CHUNK_BYTES // (k * id_dtype.itemsize)))
        shards = self.manifest.shards
        written = 0
        if (shard_id < len(shards) and shards[shard_id].rows_with_graph and version != shards[shard_id].graph
                and not (self.path / vectors_name(shard_id, version)).exists()):
            # a tail shard's rows go with each of its graph versions (a merge changes its lists, not its rows)
            written += self.write_vectors(shard_id, self.read_vectors(shard_id), version)
        return written + sum(self._write_array(graph_name(shard_id, version, name), data, chunk_rows, dtype)
                             for name, data, dtype in (("ids", graph.ids, id_dtype), ("dists", graph.dists, np.float32)))

    def read_graph(self, shard_id: int, version: int | None = None, start: int = 0,
                   stop: int | None = None, buffers: ReadBuffers | None = None) -> KnnGraph:
        """A shard's graph (its local rows ``[start:stop]``, every chunk touched read whole and checked).
        ``buffers``: read into this thread's reused arrays, on this thread (``ReadBuffers``)."""
        version = self._graph_version(shard_id, version)
        where = f"shard {shard_id} graph version {version}"
        ids, dists = (self._read_array(graph_name(shard_id, version, name), f"{where} {name}", start, stop,
                                       None if buffers is None else buffers.of(name))
                      for name in ("ids", "dists"))
        return KnnGraph(self._as_store_ids(ids), dists)

    def graph_chunk_rows(self, shard_id: int) -> int:
        """Rows of the committed graph's chunks (a multiple of both arrays'): row ranges cut at multiples of it
        read each chunk once."""
        version = self._graph_version(shard_id, None)
        rows = []
        for name in ("ids", "dists"):
            array = graph_name(shard_id, version, name)
            try:
                rows.append(int(self.array_meta(array)["chunk_grid"]["configuration"]["chunk_shape"][0]))
            except (KeyError, TypeError, IndexError, ValueError):
                raise Damaged(self.path / array / "zarr.json", "array metadata has no chunk shape") from None
        return max(1, int(np.lcm(*rows)))

    def _graph_version(self, shard_id: int, version: int | None) -> int:
        if version is None:
            version = self.manifest.shards[shard_id].graph
        if version is None:
            raise ValueError(f"shard {shard_id} has no graph yet")
        return version

    def _as_store_ids(self, ids: np.ndarray) -> np.ndarray:
        """Ids as the manifest says the store's are: an int32 array written before an ingest widened them to
        int64 is widened here, so every graph in memory holds one id dtype."""
        return ids.astype(self.manifest.id_dtype, copy=False)

    def read_graph_rows(self, shard_id: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids, keys) of scattered local rows of a shard's committed graph: each chunk holding any of them is
        read and checked once (a chunk a row took 10 s for a build's 2000-row recall sample of 1M rows)."""
        version = self.manifest.shards[shard_id].graph
        where = f"shard {shard_id} graph version {version}"
        ids, keys = (self._read_array_rows(graph_name(shard_id, version, name), f"{where} {name}", rows)
                     for name in ("ids", "dists"))
        return self._as_store_ids(ids), keys

    # ---- search graphs (bigknn/operations/search_arrays.py says what they hold) ------------------------------
    def write_search(self, version: int, name: str, data: np.ndarray) -> int:
        """Write ``search/<version>/<name>`` (row-chunked, checksummed); readers see it once a commit names
        the version."""
        chunk_rows = max(1, min(data.shape[0], CHUNK_BYTES // max(1, data.shape[1] * data.itemsize)))
        return self._write_array(search_name(version, name), data, chunk_rows, data.dtype)

    def read_search(self, version: int, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self._read_array(search_name(version, name), f"search graph version {version} {name}", start, stop)

    def _stale_graphs(self, shard_id: int, below: int | None) -> list[int]:
        """Version numbers of a shard's graph directories older than ``below``."""
        if below is None:
            return []
        return [v for v in safepaths.versions(self.path, graph_dir(shard_id)) if v < below]

def _rows_name(manifest: Manifest, shard_id: int) -> str:
    """The array of a shard's committed rows (bigknn/shards/manifest.py ShardEntry.rows_with_graph)."""
    shards = manifest.shards
    if shard_id < len(shards) and shards[shard_id].rows_with_graph:
        return vectors_name(shard_id, shards[shard_id].graph)
    return vectors_name(shard_id)

