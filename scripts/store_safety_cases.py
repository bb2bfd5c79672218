"""An adversarial pass over a store: links, hard links, permissions, a second file system, leases, the lock,
chunk checksums and environment variables. Each case sets up a copy of one small store, runs bigknn and checks
what must hold (a refusal naming the path, a file outside left byte-identical, damage reported); the table
printed is the one in docs/store-safety.md.

Permission cases drop the capabilities that let root ignore file modes (setpriv), so they mean the same run as
root or as a user; they are reported as not run where setpriv is missing.

    python scripts/store_safety_cases.py                 # every case, a Markdown table on stdout
    python scripts/store_safety_cases.py --only lock     # the cases whose name contains "lock"
    python scripts/store_safety_cases.py --json
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from store_safety.lab import CASES, Lab


# the cases add themselves to CASES as their modules load, in this order: the table's numbering
for part in ("links", "permissions", "filesystems", "locks", "checksums"):
    importlib.import_module(f"store_safety.{part}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bigknn-cases-", dir=".") as tmp:
        lab = Lab(Path(tmp).resolve())
        for n, (category, name, expected, fn) in enumerate(CASES, 1):
            if args.only not in name:
                continue
            try:
                ok, now = fn(lab)
            except Exception as e:  # noqa: BLE001 - a case that breaks is reported, not hidden
                ok, now = False, f"case failed: {type(e).__name__}: {e}"[:200]
            rows.append({"n": n, "category": category, "case": name, "expected": expected, "now": now, "ok": ok})
            print(f"{'ok  ' if ok else 'FAIL'} {n}. {name}: {now}", file=sys.stderr)
        subprocess.run(["chmod", "-R", "u+rwx", tmp])
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| # | kind | case | expected | now | |\n|---|---|---|---|---|---|")
    for r in rows:
        cells = [str(r["n"]), r["category"], r["case"], r["expected"], r["now"].replace("|", "\\|"),
                 "pass" if r["ok"] else "**FAIL**"]
        print("| " + " | ".join(cells) + " |")
    passed = sum(r["ok"] for r in rows)
    print(f"\n{passed} of {len(rows)} cases pass.")


if __name__ == "__main__":
    main()
