"""``bigknn verify`` (fsck): every chunk against its checksum, the manifest against the arrays, and what repairs
what is damaged.

Checked: the manifest's dim, dtype, metric and k against what the store was built for (an edit of them is
repaired by hand: bigknn/shards/identity.py); the shards' ids, offsets and rows; every merged pair names two
shards with a graph, once; every array the manifest refers to (each shard's vectors, its committed graph version,
an interrupted ingest's new shards and staged versions) exists with the shape and dtype the manifest implies, and
every chunk of it is present, whole and matches its checksum; graph ids lie within the rows; so does the search
graph the manifest names, if it was pruned from the graph as it is (a stale one is refused by search and replaced
by the next prune). Older graph versions kept for readers are not the store's state and are not checked. The user
ids' parts are checked too, each against its checksum for its place (bigknn/shards/user_ids.py).

Repairs (``--repair``, under the writer lock; then ``bigknn merge`` recomputes what was dropped): a damaged
graph version of a shard whose vectors are intact is dropped with the shard's merged pairs, so the merge runs
its GNND and its merges again; invalid merged pairs are dropped; a damaged part of an interrupted ingest is
dropped (a staged version), or the whole ingest (its new vectors: ingest that file again); a damaged search
graph is dropped from the manifest (``bigknn prune`` makes it again). Damaged vectors of a
committed shard, or shards that do not add up, cannot be repaired in place: rebuild from the input files.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bigknn.core.errors import BadInput, BigknnError, Damaged
from bigknn.formats.read import file_sha256
from bigknn.core.knn_graph import EMPTY, LOCAL_ID_DTYPE
from bigknn.operations.merge_checks import STORE_KEY, staged
from bigknn.operations.search_arrays import SEARCH_ID_DTYPE
from bigknn.shards import Store, WriterLock, checksums, identity, user_ids
from bigknn.shards.manifest import MANIFEST
from bigknn.shards.names import graph_name, row_ids_name, search_name

# what repairs a problem
REBUILD = "rebuild"  # from the input files, into a new store
GRAPH = "graph"  # drop the shard's committed graph and its pairs; merge recomputes them
PAIRS = "pairs"  # drop invalid merged pairs; merge redoes the missing ones
STAGED = "staged"  # drop a staged graph of the interrupted ingest and its pairs; merge redoes them
PENDING = "pending"  # drop the interrupted ingest; ingest its file again
SEARCH = "search"  # drop the search graph; prune again
EDITED = "edited"  # put back a manifest field the store was built with (bigknn/shards/identity.py); by hand
UNREPAIRABLE = (REBUILD, EDITED)  # what --repair cannot mend


@dataclass
class Problem:
    what: str  # e.g. "shard 3 graph version 7 ids"
    file: str
    problem: str
    repair: str  # one of REBUILD, GRAPH, PAIRS, STAGED, PENDING, SEARCH, EDITED
    shard: int | None = None
    put_back: str = ""  # EDITED: the manifest's field as the store was built with it, as JSON


def verify(store: Store, contents: bool = True) -> dict:
    """The store's problems and what repairs them. ``contents``: read every chunk and check its checksum and
    the ids in it; without, only that every chunk file is there with its size (what ``bigknn info`` does)."""
    t0 = time.perf_counter()
    return _report(store, _check(store, contents), t0)


def repair(store_path: Path, wait_s: float = 0.0) -> dict:
    """Verify under the writer lock, then drop from the manifest what is damaged, so that ``bigknn merge``
    recomputes it. Raises when the damage needs a rebuild."""
    t0 = time.perf_counter()
    Store.open(store_path, pin=False, check_identity=False)  # refuse a missing or foreign directory first
    with WriterLock(store_path, wait_s):
        store = Store.open(store_path, pin=False, check_identity=False)
        checker = _check(store, contents=True)
        report = _report(store, checker, t0)
        if any(p.repair in UNREPAIRABLE for p in checker.problems):
            raise BigknnError(f"{store_path}: --repair cannot mend this damage; {report['repair'][0]}")
        report["repaired"] = _mend(store, checker.problems)
        if report["repaired"]:
            store.commit()
        store.close()
    report["repair"] = report["repair"][1:]  # what is left to do: the merge (and ingests)
    return report


def _report(store: Store, checker: "_Checker", t0: float) -> dict:
    return {"store": str(store.path), "format": store.manifest.format, "ok": not checker.problems,
            "contents_checked": checker.contents, "arrays": checker.arrays, "bytes": checker.nbytes,
            "arrays_without_checksums": checker.unverified,
            "damaged": [{"what": p.what, "file": p.file, "problem": p.problem} for p in checker.problems],
            "repair": _advice(store, checker.problems), "wall_s": round(time.perf_counter() - t0, 3)}


def _advice(store: Store, problems: list[Problem]) -> list[str]:
    """The commands that repair ``problems``, in order."""
    if not problems:
        return []
    if edited := [p for p in problems if p.repair == EDITED]:
        return [f"edit {shlex.quote(edited[0].file)}: put back what the store was built with: "
                + ", ".join(p.put_back for p in edited)]
    if any(p.repair == REBUILD for p in problems):
        inputs = ", ".join(i.get("path", "?") for i in store.manifest.inputs) or "the input files"
        return [f"rebuild a new store from {inputs} (bigknn build, then bigknn ingest of any later files): "
                "damaged vectors, user ids or shard bounds cannot be recomputed in place"]
    at = shlex.quote(str(store.path))  # advice is pasted into a shell: a name with spaces or $(...) stays one word
    steps = [f"bigknn verify {at} --repair", f"bigknn merge {at}"]
    if any(p.repair == SEARCH for p in problems):
        steps.append(f"bigknn prune {at}")
    pending = store.manifest.pending
    if pending and any(p.repair in (GRAPH, PENDING) for p in problems):
        if staged(pending):  # the interrupted merge of stores, from the start
            steps.append(" ".join([f"bigknn merge {at}", *(shlex.quote(str(i["path"])) for i in pending.inputs
                                                            if STORE_KEY in i)]))
        else:
            steps += [f"bigknn ingest {at} --input {shlex.quote(str(i['path']))}" for i in pending.inputs]
    return steps


def _check(store: Store, contents: bool) -> "_Checker":
    checker = _Checker(store, contents)
    checker.run()
    return checker


def _mend(store: Store, problems: list[Problem]) -> list[str]:
    m = store.manifest
    done: list[str] = []
    graphs = sorted({p.shard for p in problems if p.repair == GRAPH})
    if any(p.repair == PAIRS for p in problems):
        valid = _valid_pairs(store)
        done.append(f"dropped {len(m.merged) - len(valid)} invalid merged pair(s)")
        m.merged = [list(p) for p in valid]
    if m.pending is not None and (graphs or any(p.repair == PENDING for p in problems)):
        done.append("dropped the interrupted ingest of " + ", ".join(i["path"] for i in m.pending.inputs))
        m.pending = None
    if any(p.repair == SEARCH for p in problems):
        done.append(f"dropped search graph version {m.search.version}")
        m.search = None
    for sid in graphs:
        m.shards[sid].graph = None
        m.merged = [p for p in m.merged if sid not in p]
        done.append(f"dropped shard {sid}'s graph and its merged pairs")
    for sid in sorted({p.shard for p in problems if p.repair == STAGED}):
        if m.pending is not None:
            m.pending.graphs.pop(sid, None)
            m.pending.merged = [p for p in m.pending.merged if sid not in p]
            done.append(f"dropped the interrupted ingest's staged graph of shard {sid} and its merged pairs")
    return done


def _valid_pairs(store: Store) -> list[tuple[int, int]]:
    """The merged pairs that name two distinct shards with a graph, in order, each once."""
    shards = store.manifest.shards
    out: list[tuple[int, int]] = []
    for pair in store.manifest.merged:
        if (isinstance(pair, list) and len(pair) == 2 and all(isinstance(s, int) for s in pair)
                and 0 <= pair[0] < pair[1] < len(shards) and tuple(pair) not in out
                and shards[pair[0]].graph is not None and shards[pair[1]].graph is not None):
            out.append((pair[0], pair[1]))
    return out


class _Checker:
    def __init__(self, store: Store, contents: bool):
        self.store, self.contents = store, contents
        self.problems: list[Problem] = []
        self.arrays = self.nbytes = self.unverified = 0

    def run(self) -> None:
        m = self.store.manifest
        edited = identity.mismatches(self.store.path, m)
        for field, want, problem in edited:
            self.problems.append(Problem(f"manifest {field}", str(self.store.path / MANIFEST), problem, EDITED,
                                         put_back=f'"{field}": {json.dumps(want)}'))
        if edited or not self._shards_add_up():
            return  # arrays cannot be checked against a manifest that does not describe them
        if len(_valid_pairs(self.store)) != len(m.merged):
            self._add("merged pairs", self.store.path / MANIFEST, "invalid or repeated merged pairs "
                      "(a pair of a shard without a graph, out of range, or listed twice)", PAIRS)
        new = m.pending.shards if m.pending else []
        rows_all = m.rows + sum(s.rows for s in new)
        for index in sorted({s.source["input"] for s in m.shards if s.source is not None}):
            self._referenced(index)
        for s in m.shards:
            if s.source is None:
                self._vectors(s.id, s.rows, REBUILD)
            if s.graph is not None:
                self._graph(s.id, s.graph, s.rows, m.rows, GRAPH)
        built = m.partition.shards if m.partition is not None else 0  # shards stored by the partition
        for s in m.shards[:built]:
            self._array(row_ids_name(s.id), f"shard {s.id} row ids", (s.rows, 1), (np.dtype(np.int64),), REBUILD,
                        s.id, m.rows)
        for s in new:
            self._vectors(s.id, s.rows, PENDING)
        rows_of = {s.id: s.rows for s in m.shards + new}
        for sid, version in (m.pending.graphs if m.pending else {}).items():
            if sid in rows_of:
                self._graph(sid, version, rows_of[sid], rows_all, STAGED)
        search = m.search
        if search is not None and search.rows == m.rows and search.graphs == [s.graph for s in m.shards]:
            for s in m.shards:
                where = f"search graph version {search.version} shard {s.id}"
                shape = (s.rows, search.degree)
                self._array(search_name(search.version, f"shards/{s.id}/ids"), f"{where} ids", shape,
                            (SEARCH_ID_DTYPE,), SEARCH, s.id, m.rows)
                self._array(search_name(search.version, f"shards/{s.id}/lambdas"), f"{where} lambdas", shape,
                            (np.dtype(np.uint8),), SEARCH, s.id)
        if self.contents:
            for damage in user_ids.check(self.store.path, m.rows):
                self._add("user ids", damage.file, damage.problem, REBUILD)

    def _shards_add_up(self) -> bool:
        m = self.store.manifest
        new = m.pending.shards if m.pending else []
        offset = 0
        for i, (sid, first, rows) in enumerate([(s.id, s.offset, s.rows) for s in m.shards + new]):
            if sid != i or first != offset or rows < 1:
                self._add(f"shard {sid}", self.store.path / MANIFEST,
                          f"shard at position {i} has id {sid}, first row {first}, {rows} rows; expected id {i}, "
                          f"first row {offset}, at least one row", REBUILD, sid)
                return False
            offset += rows
        return True

    def _vectors(self, sid: int, rows: int, repair: str) -> None:
        m = self.store.manifest
        self._array(self.store.rows_array(sid), f"shard {sid} vectors", (rows, m.dim), (np.dtype(m.dtype),), repair,
                    sid)

    def _referenced(self, index: int) -> None:
        """An input whose rows shards reference (bigknn/shards/referenced.py): where and as its fingerprint
        says, and with ``contents`` its bytes' sha256 the one the build computed."""
        rec = self.store.manifest.inputs[index]
        try:
            vf = self.store.references().file(index)
        except BadInput as e:
            self._add(f"input {index}", e.path, e.problem, REBUILD)
            return
        if self.contents:
            self.nbytes += vf.raw.size
            if rec.get("sha256") is not None and file_sha256(vf) != rec["sha256"]:
                self._add(f"input {index}", vf.path, "its sha256 differs from the one the build computed (the "
                          "file was changed in place)", REBUILD)

    def _graph(self, sid: int, version: int, rows: int, id_limit: int, repair: str) -> None:
        where = f"shard {sid} graph version {version}"
        # int32: written before an ingest widened the store's ids (bigknn/shards/manifest.py hold_ids_of)
        id_dtypes = (LOCAL_ID_DTYPE, self.store.manifest.id_dtype)
        shape = self._array(graph_name(sid, version, "ids"), f"{where} ids", (rows, None), id_dtypes,
                            repair, sid, id_limit)
        if shape is not None:
            self._array(graph_name(sid, version, "dists"), f"{where} dists", shape, (np.dtype(np.float32),), repair,
                        sid)

    def _array(self, name: str, what: str, shape: tuple[int, int | None], dtypes: tuple[np.dtype, ...],
               repair: str, sid: int, id_limit: int | None = None) -> tuple[int, int] | None:
        """Check one array (metadata, then every chunk; ``shape[1]`` None: any width >= k; its dtype one of
        ``dtypes``); returns its shape when it is usable. ``id_limit``: an ids array, whose values must lie in
        [-1, id_limit)."""
        self.arrays += 1
        try:
            meta = self.store.array_meta(name)
        except Damaged as e:
            self._add(what, e.file, e.problem, repair, sid)
            return None
        have = tuple(meta.get("shape") or ())
        width_ok = len(have) == 2 and (have[1] == shape[1] if shape[1] is not None else
                                       have[1] >= self.store.manifest.k)
        if not width_ok or have[0] != shape[0] or _dtype(meta) not in dtypes:
            want = f"({shape[0]}, {shape[1] if shape[1] is not None else '>= k'})"
            self._add(what, self.store.path / name / "zarr.json", f"array of shape {have} {meta.get('data_type')}; "
                      f"the manifest implies {want} {dtypes[-1].name}", repair, sid)
            return None
        if not checksums.present(meta) and not self.store.manifest.checksummed:
            self.unverified += 1
        bounds = [0, 0]  # smallest and largest id seen

        def visit(rows: np.ndarray) -> None:
            if rows.size:
                bounds[0], bounds[1] = min(bounds[0], int(rows.min())), max(bounds[1], int(rows.max()))

        for damage in self.store.check_array(name, self.contents, visit if id_limit is not None else None):
            self._add(what, damage.file, damage.problem, repair, sid)
        self.nbytes += have[0] * have[1] * _dtype(meta).itemsize
        if id_limit is not None and (bounds[0] < EMPTY or bounds[1] >= id_limit):
            self._add(what, self.store.path / name, f"ids from {bounds[0]} to {bounds[1]}; rows are 0 to "
                      f"{id_limit - 1} ({EMPTY}: none)", repair, sid)
        return have

    def _add(self, what: str, file: object, problem: str, repair: str, sid: int | None = None) -> None:
        self.problems.append(Problem(what, str(file), problem, repair, sid))


def _dtype(meta: dict) -> np.dtype | None:
    name = meta.get("data_type")
    try:
        return np.dtype(name) if isinstance(name, str) else None
    except TypeError:
        return None
