"""Device copies of one host object kept across calls (the search index of a sweep, the rows of a prune), and
dropped when that object is garbage collected or another one is asked for, so that nothing outlives its use."""

from __future__ import annotations

import weakref
from typing import Any, Callable


class KeptCopy:
    def __init__(self) -> None:
        self._key: weakref.ref | None = None
        self.arrays: tuple = ()

    def holds(self, host: Any) -> bool:
        return self._key is not None and self._key() is host

    def of(self, host: Any, make: Callable[[Any], tuple]) -> tuple:
        """The device arrays ``make(host)`` made for this very ``host`` object, made now if they are not kept."""
        if not self.holds(host):
            self.arrays = ()  # the old copy goes before the new one arrives
            self.arrays = make(host)
            self._key = key = weakref.ref(host)
            weakref.finalize(host, self._forget, key)
        return self.arrays

    def drop(self) -> None:
        """Let the device arrays go now (their memory returns to CuPy's pool)."""
        self._key, self.arrays = None, ()

    def _forget(self, key: weakref.ref) -> None:
        if self._key is key:
            self._key, self.arrays = None, ()
