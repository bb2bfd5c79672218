"""Device copies of host arrays kept between calls of one CUDA backend.

The next pair's shards are uploaded on a stream of their own while the current merge computes
(``CudaBackend.stage``), and a merge's results and vectors stay on the GPU, so the next merge that reuses
the shard uploads nothing. A copy is found by the identity of its host array, held through a weak
reference: the host cache alone decides what lives in RAM, and a copy whose host array is gone is dropped.
Least recently used copies go first when a call needs the memory.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import numpy as np


class ResidentCopies:
    def __init__(self):
        self._entries: OrderedDict[int, tuple] = OrderedDict()  # id(host) -> (weakref, device array, event)
        self._lock = threading.Lock()

    def get(self, host: np.ndarray, stream):
        """The device copy of ``host`` with ``stream`` ordered after its upload, or None."""
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

    def has(self, host: np.ndarray) -> bool:
        with self._lock:
            entry = self._entries.get(id(host))
            return entry is not None and entry[0]() is host

    def put(self, host: np.ndarray, dev, event=None) -> None:
        """Remember ``dev`` as the device copy of ``host`` (ready once ``event`` fired, if given)."""
        with self._lock:
            self._prune()
            self._entries[id(host)] = (weakref.ref(host), dev, event)
            self._entries.move_to_end(id(host))

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

    def _prune(self) -> None:
        for key in [k for k, (ref, _, _) in self._entries.items() if ref() is None]:
            del self._entries[key]
