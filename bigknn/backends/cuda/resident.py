"""Device copies of host arrays kept between calls of one CUDA backend.

The next pair's shards are uploaded on a stream of their own while the current merge computes
(``CudaBackend.stage``), and a merge's results and vectors stay on the GPU, so the next merge that reuses
the shard uploads nothing. A copy is found by the identity of its host array, held through a weak
reference: the host cache alone decides what lives in RAM, and a copy whose host array is gone is dropped.
Least recently used copies go first when a call needs the memory.

A copy being uploaded ahead is expected (``expect``): a call that asks for it waits for the upload rather than
uploading the rows a second time (a shard's GNND right after its recall sample's exact search reads the copy
that search uploaded).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import numpy as np


class ResidentCopies:
    def __init__(self):
        self._entries: OrderedDict[int, tuple] = OrderedDict()  # id(host) -> (weakref, device array, event)
        self._expected: dict[int, threading.Event] = {}  # id(host) -> set once its upload ahead ends
        self._lock = threading.Lock()

    def expect(self, host: np.ndarray) -> None:
        """An upload of ``host`` ahead is queued: ``get`` waits for it until ``settle``."""
        with self._lock:
            self._expected.setdefault(id(host), threading.Event())

    def settle(self, host: np.ndarray) -> None:
        """The upload ahead of ``host`` ended (its copy put, or given up)."""
        with self._lock:
            done = self._expected.pop(id(host), None)
        if done is not None:
            done.set()

    def get(self, host: np.ndarray, stream):
        """The device copy of ``host`` with ``stream`` ordered after its upload, or None."""
        with self._lock:
            pending = self._expected.get(id(host))
        if pending is not None:
            pending.wait()
        with self._lock:
            entry = self._entries.get(id(host))
            if entry is None:
                return None
            ref, dev, event = entry
            if ref() is not host or dev.shape != host.shape or dev.dtype != host.dtype:
                del self._entries[id(host)]
                return None
            self._entries.move_to_end(id(host))
        if event is not None:
            stream.wait_event(event)
        return dev

    def take(self, host: np.ndarray, stream):
        """``get``, and the copy no longer kept: the caller holds it (its memory is no copy's to drop)."""
        dev = self.get(host, stream)
        if dev is not None:
            with self._lock:
                self._entries.pop(id(host), None)
        return dev

    def has(self, host: np.ndarray) -> bool:
        """Whether ``host`` has a copy, or one on its way."""
        with self._lock:
            return id(host) in self._expected or self._held(host)

    def holds(self, host: np.ndarray) -> bool:
        """Whether a copy of ``host`` is kept now (one on its way is not): what an upload ahead checks, since
        ``has`` is true of every array it was queued for."""
        with self._lock:
            return self._held(host)

    def put(self, host: np.ndarray, dev, event=None) -> None:
        """Remember ``dev`` as the device copy of ``host`` (ready once ``event`` fired, if given)."""
        with self._lock:
            self._prune()
            self._entries[id(host)] = (weakref.ref(host), dev, event)
            self._entries.move_to_end(id(host))
        self.settle(host)

    def drop_oldest(self) -> bool:
        """Free the least recently used copy; False when there is none."""
        with self._lock:
            self._prune()
            if not self._entries:
                return False
            self._entries.popitem(last=False)
            return True

    def nbytes(self) -> int:
        with self._lock:
            self._prune()
            return sum(dev.nbytes for _, dev, _ in self._entries.values())

    def _held(self, host: np.ndarray) -> bool:
        entry = self._entries.get(id(host))
        return entry is not None and entry[0]() is host

    def _prune(self) -> None:
        for key in [k for k, (ref, _, _) in self._entries.items() if ref() is None]:
            del self._entries[key]
