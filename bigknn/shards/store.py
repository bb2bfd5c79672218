"""Store: vectors and versioned graphs of every shard in a zarr v3 group, described by the manifest.

Graph writes are copy-on-write: a step writes ``shards/<id>/graph/<v+1>/{ids,dists}``, then commits the
manifest that points at it. Until that commit every reader sees version v; a crash before it leaves
an unreferenced version that the next run overwrites. After a commit, versions older than the one the
previous commit pointed at are deleted (a reader that loaded the previous manifest can still finish), in a
background thread: deleting gigabytes of files is slow on some file systems (online discard) and need
not hold up the work; ``close()`` waits for it.
"""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable

import numpy as np
import zarr
from numpy.typing import DTypeLike

from bigknn.atomic import write_atomic
from bigknn.errors import BadInput, disk_full_named
from bigknn.graph import ID_DTYPE, KnnGraph
from bigknn.shards import chunks
from bigknn.shards.creation import check_new_store_path
from bigknn.shards.manifest import MANIFEST, Manifest

CHUNK_BYTES = 16 << 20  # target size of one row chunk on disk
REAPER_THREADS = 4  # stale graph versions deleted at once


class Store:
    def __init__(self, path: Path, manifest: Manifest):
        self.path = Path(path)
        self.manifest = manifest
        # held while the in-memory manifest is changed or written: several threads (sharding, the graph
        # writer) record progress in it
        self.lock = threading.RLock()
        self._deferred = 0
        self._committed = self._graph_versions()  # of the last commit
        self._reaper: ThreadPoolExecutor | None = None

    # ---- opening and committing -------------------------------------------------------------
    @staticmethod
    def exists(path: Path) -> bool:
        return (Path(path) / MANIFEST).is_file()

    @classmethod
    def open(cls, path: Path) -> "Store":
        path = Path(path)
        if not path.exists():
            raise BadInput(path, "no such store")
        if not cls.exists(path):
            raise BadInput(path, "not a bigknn store (no manifest.json)")
        try:
            manifest = Manifest.from_json((path / MANIFEST).read_text())
        except (ValueError, TypeError, KeyError) as e:
            raise BadInput(path / MANIFEST, f"unreadable manifest: {e}") from None
        return cls(path, manifest)

    @classmethod
    def create(cls, path: Path, manifest: Manifest) -> "Store":
        """A new store at ``path``: a missing path or an empty directory (but for the lock file of the writer
        creating it), never among other files."""
        path = Path(path)
        check_new_store_path(path, own_lock=True)
        group = zarr.open_group(str(path), mode="a")
        group.attrs["bigknn"] = {"format": manifest.format}
        store = cls(path, manifest)
        store.commit()
        return store

    def commit(self) -> None:
        """Make the current manifest the store's state, then drop graph versions nobody can read.
        Inside ``deferred_commits()`` this does nothing: the block's end commits."""
        with self.lock:
            if self._deferred:
                return
            write_atomic(self.path / MANIFEST, self.manifest.to_json())
            stale = [d for sh in self.manifest.shards for d in self._stale_graphs(sh.id, self._committed.get(sh.id))]
            self._committed = self._graph_versions()
            if stale:
                if self._reaper is None:
                    self._reaper = ThreadPoolExecutor(REAPER_THREADS, thread_name_prefix="reaper")
                for d in stale:
                    self._reaper.submit(shutil.rmtree, d, ignore_errors=True)

    def close(self) -> None:
        """Wait for the deletion of stale graph versions."""
        if self._reaper is not None:
            self._reaper.shutdown(wait=True)
            self._reaper = None

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
        self._committed = self._graph_versions()

    def _graph_versions(self) -> dict[int, int | None]:
        return {sh.id: sh.graph for sh in self.manifest.shards}

    # ---- arrays -------------------------------------------------------------------------------
    # zarr creates every array's metadata; the chunk bytes go through ``chunks`` (direct file I/O) where
    # the layout allows it, else through zarr
    def _write_array(self, name: str, data: np.ndarray, chunk_rows: int, dtype: DTypeLike) -> None:
        with disk_full_named(self.path / name, data.shape[0] * data.shape[1] * np.dtype(dtype).itemsize):
            arr = zarr.create_array(store=str(self.path), name=name, shape=data.shape,
                                    chunks=(chunk_rows, data.shape[1]), dtype=dtype, compressors=None,
                                    overwrite=True)
            if not chunks.write_array(self.path / name, data):
                arr[:] = data.astype(dtype, copy=False)

    def _read_array(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        out = chunks.read_rows(self.path / name, start, stop)
        if out is None:
            out = zarr.open_array(store=str(self.path), path=name, mode="r")[start:stop]
        return out

    # ---- vectors ------------------------------------------------------------------------------
    def write_vectors(self, shard_id: int, x: np.ndarray) -> None:
        chunk_rows = max(1, min(x.shape[0], CHUNK_BYTES // max(1, x.shape[1] * x.itemsize)))
        self._write_array(f"shards/{shard_id}/vectors", x, chunk_rows, x.dtype)

    def read_vectors(self, shard_id: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self._read_array(f"shards/{shard_id}/vectors", start, stop)

    def remove_uncommitted_shards(self, ids: Iterable[int]) -> None:
        """Delete the arrays of shards that no commit refers to (written by a step that was then refused)."""
        for sid in ids:
            if sid < len(self.manifest.shards):
                raise ValueError(f"shard {sid} is committed; only uncommitted shards can be removed")
            shutil.rmtree(self.path / "shards" / str(sid), ignore_errors=True)

    def vectors_of(self, global_ids: np.ndarray) -> np.ndarray:
        """Vectors of arbitrary global rows (one read per shard touched)."""
        global_ids = np.asarray(global_ids, dtype=np.int64)
        out = np.empty((global_ids.size, self.manifest.dim), dtype=np.dtype(self.manifest.dtype))
        for shard in self.manifest.shards:
            sel = np.nonzero((global_ids >= shard.offset) & (global_ids < shard.offset + shard.rows))[0]
            if sel.size:
                local = global_ids[sel] - shard.offset
                lo, hi = int(local.min()), int(local.max()) + 1
                out[sel] = self.read_vectors(shard.id, lo, hi)[local - lo]
        return out

    # ---- graphs -------------------------------------------------------------------------------
    def write_graph(self, shard_id: int, version: int, graph: KnnGraph) -> None:
        """Write a graph version (not visible until a manifest commit points at it)."""
        base = f"shards/{shard_id}/graph/{version}"
        rows, k = graph.ids.shape
        chunk_rows = max(1, min(rows, CHUNK_BYTES // (k * 4)))
        for name, data, dtype in (("ids", graph.ids, ID_DTYPE), ("dists", graph.dists, np.float32)):
            self._write_array(f"{base}/{name}", data, chunk_rows, dtype)

    def read_graph(self, shard_id: int, version: int | None = None) -> KnnGraph:
        if version is None:
            version = self.manifest.shards[shard_id].graph
        if version is None:
            raise ValueError(f"shard {shard_id} has no graph yet")
        base = f"shards/{shard_id}/graph/{version}"
        return KnnGraph(self._read_array(f"{base}/ids"), self._read_array(f"{base}/dists"))

    def read_graph_rows(self, shard_id: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids, keys) of a few scattered local rows of a shard's committed graph, one small read per row."""
        base = f"shards/{shard_id}/graph/{self.manifest.shards[shard_id].graph}"
        ids = [self._read_array(f"{base}/ids", int(r), int(r) + 1) for r in rows]
        keys = [self._read_array(f"{base}/dists", int(r), int(r) + 1) for r in rows]
        return np.concatenate(ids), np.concatenate(keys)

    def _stale_graphs(self, shard_id: int, previous: int | None) -> list[Path]:
        """Version directories of a shard older than ``previous`` (the version the last commit pointed at)."""
        gdir = self.path / "shards" / str(shard_id) / "graph"
        if previous is None or not gdir.is_dir():
            return []
        return [e for e in gdir.iterdir() if e.name.isdigit() and int(e.name) < previous]

    # ---- accounting ---------------------------------------------------------------------------
    def disk_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())
