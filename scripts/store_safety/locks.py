"""Cases: the writer lock and leases (held, stale, another host's)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from store_safety.lab import Lab, case, ran, refusal


# ---- the lock and leases ------------------------------------------------------------------------------------
HOLD = ("import sys, time; from bigknn.shards import WriterLock\n"
        "with WriterLock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)")


@contextmanager
def held(lab: Lab, store: Path) -> Iterator[None]:
    """Another process holds the store's writer lock until the block ends (then it is killed)."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(store)], env=lab.env(), stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        yield
    finally:
        p.kill()


@case("lock", "`.lock` deleted while a writer holds the store; a second `merge`", "busy, exit 75")
def _(lab):
    s = lab.store()
    with held(lab, s):
        (s / ".lock").unlink()
        code, _, err = lab.run("merge", s)
    return refusal(code, err, "another writer holds the store", exit_code=75)


@case("lock", "`.lock` replaced by a new file while a writer holds the store; a second `ingest`", "busy, exit 75")
def _(lab):
    s = lab.store()
    with held(lab, s):
        (s / ".lock").unlink()
        (s / ".lock").write_text("{}")
        code, _, err = lab.ingest(s)
    return refusal(code, err, "another writer holds the store", exit_code=75)


@case("lock", "the writer holding the lock is killed (SIGKILL); the next `merge`", "runs at once (exit 0)")
def _(lab):
    s = lab.store()
    with held(lab, s):
        pass
    time.sleep(0.2)
    code, _, err = lab.run("merge", s)
    return ran(code, err)


def lease_case(name: str, expected: str, info: dict, mtime_offset: float, kept: bool):
    def fn(lab):
        s = lab.store()
        (s / ".readers").mkdir(exist_ok=True)
        lease = s / ".readers" / f"{info.get('pid', 1)}-abcdefabcdef.json"
        lease.write_text(json.dumps(info))
        t = time.time() + mtime_offset
        os.utime(lease, (t, t))
        code, _, _ = lab.ingest(s)
        return code == 0 and lease.exists() == kept, f"exit {code}; lease {'kept' if lease.exists() else 'removed'}"
    case("lease", name, expected)(fn)


HOST = socket.gethostname()
lease_case("a lease of unparsable JSON (a reader writing it), fresh", "kept (an opening reader)", {}, 0, True)
lease_case("a lease of a live pid on this host without a start time (older bigknn), 1 h old",
           "removed: expired by age", {"pid": os.getpid(), "host": HOST, "graphs": None}, -3600, False)
lease_case("a lease naming pid 2^40 on this host", "removed: no such process", {"pid": 1 << 40, "host": HOST,
                                                                                 "graphs": None}, 0, False)
lease_case("a lease from another host refreshed now", "kept", {"pid": 7, "host": "elsewhere.example", "graphs": None},
           0, True)
lease_case("a lease from another host dated 1 day ahead", "removed, with a warning", {"pid": 7, "host": "else.example",
                                                                                      "graphs": None}, 86400, False)
lease_case("a lease from another host silent for 11 min", "removed: expired", {"pid": 7, "host": "else.example",
                                                                              "graphs": None}, -660, False)


@case("lease", "a directory named like a lease in `.readers`", "left alone (not a reader's file)")
def _(lab):
    s = lab.store()
    d = s / ".readers" / "4242-aaaaaaaaaaaa.json"
    d.mkdir(parents=True)
    code, _, _ = lab.ingest(s)
    return code == 0 and d.is_dir(), f"exit {code}"
