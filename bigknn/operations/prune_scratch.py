"""What pass 1 of a prune hands pass 2 (forward lists, reverse edges filed under their target shard): kept in
memory where it fits the host budget next to the vectors, else written as ``.npy`` files under the version's
work folder (read memory-mapped). Issue 15: writing and re-reading this scratch cost seconds per million rows
that a store which fits in memory need not pay."""

from __future__ import annotations

from pathlib import Path

import numpy as np


class Scratch:
    def __init__(self, folder: Path, in_memory: bool):
        self.folder, self.in_memory = folder, in_memory
        self._held: dict[str, np.ndarray] = {}

    def put(self, name: str, a: np.ndarray) -> None:
        """Keep ``a`` under ``name`` (a relative path such as ``reverse/3/7``)."""
        if self.in_memory:
            self._held[name] = a
            return
        f = self.folder / f"{name}.npy"
        f.parent.mkdir(parents=True, exist_ok=True)
        np.save(f, a)

    def get(self, name: str) -> np.ndarray:
        """The array kept under ``name`` (memory-mapped from disk when not held)."""
        return self._held[name] if self.in_memory else np.load(self.folder / f"{name}.npy", mmap_mode="r")

    def parts(self, prefix: str, suffix: str) -> list[np.ndarray]:
        """Every array kept under ``prefix/`` whose name ends with ``suffix``, in name order."""
        if self.in_memory:
            return [self._held[n] for n in sorted(self._held) if n.startswith(prefix + "/") and n.endswith(suffix)]
        d = self.folder / prefix
        return [np.load(f) for f in sorted(d.glob(f"*{suffix}.npy"))] if d.is_dir() else []
