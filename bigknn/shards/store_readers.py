"""A reader without a lease (no write access to STORE/.readers): its read starts again when a writer's commit
deletes the graph versions under it (bigknn/shards/leases.py says when a reader holds one)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, TypeVar

from bigknn.core.errors import BigknnError, Damaged
from bigknn.shards.leases import LEASE_DIR
from bigknn.shards.store import Store

READ_ATTEMPTS = 5  # tries of a reader whose versions a writer deleted under it

T = TypeVar("T")


def read_store(path: Path, read: Callable[[Store], T], suspect: Callable[[T], bool] | None = None,
               check_identity: bool = True) -> T:
    """``read(store)`` on the store at ``path``, opened as a reader (``Store.open``, its ``check_identity``) and
    closed after. With its lease, nothing it reads goes away. Without one (no write access to STORE/.readers) a
    writer's commit may delete a graph version under it: a read that raised ``Damaged``, or whose result is
    ``suspect`` (a report of damage), is done again on the new state if the manifest moved on meanwhile; under an
    unchanged manifest, or with the lease, the damage is real and stands."""
    attempt = 1
    while True:
        with Store.open(path, check_identity=check_identity) as store:
            try:
                result = read(store)
                if (attempt >= READ_ATTEMPTS or suspect is None or not suspect(result) or store.pinned
                        or not store.moved_on()):
                    return result
            except Damaged as e:
                if store.pinned or not store.moved_on():
                    raise
                if attempt >= READ_ATTEMPTS:
                    raise BigknnError(f"{path}: writers deleted the graph versions this read was on {attempt} times "
                                      f"(it cannot pin them: no write access to {Path(path) / LEASE_DIR}); give it "
                                      "write access there, or read while no writer commits") from e
        attempt += 1
