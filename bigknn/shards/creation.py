"""Where a new store may be created, and taking back exactly what a refused creation added.

Users point ``-o`` at directories that hold their work, so a store is created only in a path that does
not exist or in an empty directory: never among other files, never over a file. A build refused after it
created the store (a bad row found while sharding) removes the store's own entries and the directories the
run created, and nothing else: a directory that existed before stays, as do files others put there.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from bigknn.core.errors import BadInput
from bigknn.shards.lock import LOCK_NAME
from bigknn.shards.manifest import MANIFEST
from bigknn.shards.user_ids import DIR as USER_IDS_DIR

ZARR_METADATA = "zarr.json"
SHARDS_DIR = "shards"
# every top-level entry a store has: its lock file, the zarr group's metadata, the manifest, the arrays
STORE_ENTRIES = (LOCK_NAME, ZARR_METADATA, MANIFEST, SHARDS_DIR, USER_IDS_DIR)


def check_new_store_path(path: Path, own_lock: bool = False) -> None:
    """Refuse (exit 2) a path where a new store would mix with or replace what is there. ``own_lock``: the
    caller holds the store's writer lock, so the directory holds that lock file already."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    if not path.is_dir():
        raise BadInput(path, "exists and is not a directory; give a new path or an empty directory for the store")
    entries = sorted(e for e in os.listdir(path) if not (own_lock and e == LOCK_NAME))
    if entries:
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        raise BadInput(path, f"is not empty and not a bigknn store (it holds {shown}); give a new path or "
                             "an empty directory for the store")


class NewStore:
    """A store path about to be created: checked now, and able to undo the creation later."""

    def __init__(self, path: Path):
        check_new_store_path(path)
        self.path = Path(path)
        # the directories this run will create: the store's own and any missing parents, deepest first
        self.new_dirs = [p for p in (self.path.absolute(), *self.path.absolute().parents) if not p.exists()]

    def undo(self) -> None:
        """Remove the store's entries and the directories this run created (if nothing else is in them)."""
        for name in STORE_ENTRIES:
            entry = self.path / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.exists() or entry.is_symlink():
                entry.unlink(missing_ok=True)
        for d in self.new_dirs:
            try:
                d.rmdir()
            except OSError:  # not empty: someone else's files are in it now
                return
