"""How much of a store an ingest of new rows must touch: the old rows whose exact k-NN list a batch enters, and
the 4 KiB pages of the rows file and of the graph those rows lie on (rows in file order). Issue 39 asks a 1 %
batch to cost <= 15 % of the build with the page cache dropped; this measures the floor a store that updates
its lists in place has to read (docs/perf-notes.md, session 54).

    PYTHONPATH=. python3 scripts/ingest_footprint.py --rows 100000 --dim 96 --k 32 --fractions 0.001,0.01

One JSON line per family and batch fraction. ``predicted_uniform``: 1 - (1 - new / all)^k, the share of lists
entered were every row's neighbours drawn uniformly from old and new rows alike.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from bigknn.core.synth import synth

PAGE = 4096
BLOCK = 4096  # old rows whose distances are computed at once


def squared_norms(x: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", x, x)


def kth_old_key(old: np.ndarray, k: int) -> np.ndarray:
    """Each old row's squared distance to its k-th nearest other old row (exact), computed as ``entered``
    computes its keys, so that a new row at an old neighbour's distance is not counted as entering."""
    sq = squared_norms(old)
    out = np.empty(len(old), np.float32)
    for lo in range(0, len(old), BLOCK):
        q = old[lo:lo + BLOCK]
        d2 = sq[lo:lo + BLOCK, None] - 2 * q @ old.T + sq[None]
        d2[np.arange(len(q)), np.arange(lo, lo + len(q))] = np.inf
        out[lo:lo + len(q)] = np.partition(d2, k - 1, axis=1)[:, k - 1]
    return out


def entered(old: np.ndarray, new: np.ndarray, kth: np.ndarray) -> np.ndarray:
    """Whether some new row is closer to each old row than its k-th old neighbour."""
    sq_old, sq_new = squared_norms(old), squared_norms(new)
    out = np.zeros(len(old), bool)
    for lo in range(0, len(old), BLOCK):
        d2 = sq_old[lo:lo + BLOCK, None] - 2 * old[lo:lo + BLOCK] @ new.T + sq_new[None]
        out[lo:lo + BLOCK] = (d2 < kth[lo:lo + BLOCK, None]).any(1)
    return out


def pages_touched(mask: np.ndarray, bytes_per_row: int) -> float:
    """Share of the 4 KiB pages (rows in order, ``bytes_per_row`` each) holding at least one masked row."""
    per_page = max(1, PAGE // bytes_per_row)
    return float(np.logical_or.reduceat(mask, np.arange(0, len(mask), per_page)).mean())


def rows_of(family: str, n: int, dim: int, seed: int) -> np.ndarray:
    if family == "synth":
        return synth(n, dim, seed=seed)
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000, help="Old rows.")
    ap.add_argument("--dim", type=int, default=96)
    ap.add_argument("--k", type=int, default=32, help="The store's list width.")
    ap.add_argument("--fractions", default="0.001,0.01", help="Batch sizes as fractions of the old rows.")
    ap.add_argument("--families", default="synth,iid", help="synth (clustered) and/or iid (Gaussian).")
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    for family in args.families.split(","):
        for fraction in (float(f) for f in args.fractions.split(",")):
            new_rows = max(1, int(args.rows * fraction))
            x = rows_of(family, args.rows + new_rows, args.dim, args.seed)
            old, new = x[:args.rows], x[args.rows:]
            hit = entered(old, new, kth_old_key(old, args.k))
            print(json.dumps({
                "workload": "ingest footprint", "family": family, "old_rows": args.rows, "new_rows": new_rows,
                "dim": args.dim, "k": args.k, "lists_entered": round(float(hit.mean()), 4),
                "predicted_uniform": round(1 - (1 - new_rows / len(x)) ** args.k, 4),
                "rows_pages": round(pages_touched(hit, args.dim * 4), 4),
                "graph_pages": round(pages_touched(hit, args.k * 8), 4)}), flush=True)


if __name__ == "__main__":
    main()
