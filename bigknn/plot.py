"""Figures people would rather look at than read: recall per sampled row (``bigknn eval recall --plot``,
``Graph.recall(plot=...)``), the in-degree distribution (``bigknn info --plot``,
``Graph.plot_in_degrees``) and recall against queries per second of a search sweep (``bigknn eval search
--plot``). matplotlib is an optional extra (``bigknn[plot]``); the image format follows
the file's extension (.png, .svg, .pdf, ...), and the file is written atomically like every output."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np

from bigknn.core.atomic import atomic_path, check_target
from bigknn.core.errors import BadInput
from bigknn.core.extras import install_hint


class MissingExtra(BadInput, ImportError):
    """An optional dependency is not installed (exit 2 on the command line; an ImportError in Python)."""


def pyplot(path: Path) -> ModuleType:
    """matplotlib's pyplot, off-screen, once ``path`` is known to name a format it writes; refuses (exit 2,
    nothing computed yet) without matplotlib, with an extension it does not know, or where no file can be
    written."""
    check_target(Path(path))
    try:
        import matplotlib
    except ImportError:
        raise MissingExtra(path, f"--plot needs matplotlib: {install_hint('plot')}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    formats = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    if Path(path).suffix.lower().removeprefix(".") not in formats:
        raise BadInput(path, f"name the picture with an image extension: {', '.join('.' + f for f in sorted(formats))}")
    return plt


def recall_histogram(path: Path, per_row: np.ndarray, shard_of_row: np.ndarray, shards: int, k: int,
                     title: str, target: float | None = None) -> None:
    """Left: how many sampled rows found 0..k of their exact top-k. Right: mean recall per shard, with the
    sampled rows each holds, so that a shard the merges served badly stands out. ``target``: the recall the
    build aimed at, drawn as a line on both. The recall axis runs from 0 to 1: a narrower one makes 0.995
    against 0.99 look like a failure."""
    plt = pyplot(path)
    from matplotlib.ticker import MaxNLocator

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1, 1.4]})
    found = np.rint(per_row * k).astype(int)
    left.bar(np.arange(k + 1) / k, np.bincount(found, minlength=k + 1), width=0.8 / k, color="tab:blue")
    left.set(xlabel=f"recall@{k} of a row", ylabel="sampled rows", yscale="log", title="rows", xlim=(-0.05, 1.05))
    sums = np.bincount(shard_of_row, weights=per_row, minlength=shards)
    counts = np.bincount(shard_of_row, minlength=shards)
    sampled = counts > 0
    means = np.divide(sums, counts, out=np.full(shards, np.nan), where=sampled)
    right.bar(np.nonzero(sampled)[0], means[sampled], color="tab:green", width=0.8)
    right.axhline(float(per_row.mean()), color="black", linewidth=1, linestyle="--",
                  label=f"all rows: {per_row.mean():.4f}")
    if target is not None:
        for ax in (left, right):
            line = ax.axvline if ax is left else ax.axhline
            line(target, color="tab:red", linewidth=1, label=f"target {target:g}")
        left.legend(loc="upper left")
    right.set(xlabel="shard", ylabel=f"mean recall@{k}", ylim=(0.0, 1.02), title="shards")
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.legend(loc="lower right")
    fig.suptitle(title)
    save(fig, path)


def in_degree_histogram(path: Path, degrees: np.ndarray, k: int, title: str) -> None:
    """How many rows are the neighbour of how many others. Every row lists k, so the mean in-degree is k; real
    embeddings grow hubs (rows in many lists) and orphans (in none), which graph methods feel."""
    plt = pyplot(path)
    fig, ax = plt.subplots(figsize=(8, 4))
    top = int(degrees.max()) if degrees.size else 0
    edges = degree_bins(top)
    counts, _ = np.histogram(degrees, bins=edges)
    ax.bar(edges[1:-1], counts[1:], width=np.diff(edges)[1:], align="edge", color="tab:purple")
    orphans = int(counts[0])
    ax.bar([0], [max(orphans, 0)], width=1.0, color="tab:red", label=f"in no list: {orphans:,} rows")
    ax.axvline(k, color="black", linewidth=1, linestyle="--", label=f"k = {k} (the mean)")
    ax.set(xlabel="in-degree (lists a row appears in)", ylabel="rows", yscale="log", title=title)
    ax.legend(loc="upper right")
    save(fig, path)


def degree_bins(top: int, bars: int = 200) -> np.ndarray:
    """Edges of the in-degree histogram's bars: whole degrees each (no bar straddles two, which drew a comb),
    degree 0 alone in the first (rows in no list stay visible), then bars of ``ceil(top / bars)`` degrees.

    >>> degree_bins(3).tolist(), degree_bins(1000)[:4].tolist()
    ([-0.5, 0.5, 1.5, 2.5, 3.5], [-0.5, 0.5, 5.5, 10.5])
    """
    width = max(1, -(-top // bars))
    return np.concatenate([[-0.5], np.arange(0.5, top + width + 0.5, width)])


def search_curve(path: Path, sweep) -> None:
    """Recall@k against queries per second of a search sweep (bigknn/operations/search_reports.py SearchSweep), each
    point labelled with its budget: the curve search indexes are compared by (up and right is better)."""
    plt = pyplot(path)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    recall = [p.recall for p in sweep.points]
    qps = [p.qps for p in sweep.points]
    ax.plot(recall, qps, marker="o", color="tab:blue", label=f"{sweep.procedure}, batch {sweep.batch:,}")
    for p in sweep.points:
        ax.annotate(f"{p.budget:g}", (p.recall, p.qps), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set(xlabel=f"recall@{sweep.k}", ylabel="queries per second", yscale="log",
           title=f"{Path(sweep.store).name}: {sweep.queries:,} queries, {sweep.backend}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower left")
    save(fig, path)


def save(fig, path: Path) -> None:
    """Write the figure under a temporary name, then rename it into place."""
    import matplotlib.pyplot as plt

    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lower().removeprefix("."), dpi=110, bbox_inches="tight")
    plt.close(fig)
