#!/usr/bin/env python3
"""Print JSON lines (benchmark output) as a short table: one row per line, the named fields (dotted paths
reach into nested objects), so a device call can end with a readable summary.

    python3 scripts/jsonl_table.py $OUT/t1.jsonl family tool variant graph_degree time_s recall@10.recall
"""

from __future__ import annotations

import json
import sys


def field(rec: dict, path: str):
    for part in path.split("."):
        if not isinstance(rec, dict) or part not in rec:
            return "-"
        rec = rec[part]
    return rec


def main(argv: list[str]) -> int:
    path, names = argv[0], argv[1:]
    rows = [[str(field(json.loads(line), n)) for n in names] for line in open(path) if line.strip()]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    for r in [names] + rows:
        print("  ".join(v[:40].ljust(min(w, 40)) for v, w in zip(r, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
