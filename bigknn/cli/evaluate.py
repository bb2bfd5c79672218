"""``bigknn eval``: measure graph quality."""

from __future__ import annotations

from pathlib import Path

import click

from bigknn import api
from bigknn.cli.common import backend_option, emit, gpu_mem_option, json_option, parse_bytes, plot_option
from bigknn.cli.search import eval_search
from bigknn.operations.evaluate import RECALL_K, SAMPLE_ROWS


@click.group(name="eval")
def eval_group() -> None:
    """Measure the quality of a store's graph.

    \b
    Examples:
      bigknn eval recall data.knn
      bigknn truth data.knn --queries data.fbin --k 11 -o rows_gt.ibin   # each row's, itself first
      bigknn eval recall data.knn --truth rows_gt.ibin --k 10 --json
      bigknn synth q.fbin --rows 1000 --dim 96 --seed 1             # queries like data.fbin's rows
      bigknn truth data.knn --queries q.fbin -o gt.ibin
      bigknn eval search data.knn --queries q.fbin --truth gt.ibin --plot curve.png
    """


@eval_group.command()
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--sample", type=click.IntRange(min=1), default=SAMPLE_ROWS, show_default=True,
              help="Rows whose exact neighbours are computed.")
@click.option("-k", "--k", type=click.IntRange(min=1), default=RECALL_K, show_default=True, help="Recall@k.")
@click.option("--truth", type=click.Path(path_type=Path), default=None,
              help="Ground truth .ibin (row i: exact neighbours of row i) instead of exact search.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the row sample.")
@click.option("--rows", "row_range", type=str, default=None,
              help="Sample only global rows LO:HI (e.g. the rows an ingest added).")
@backend_option
@gpu_mem_option
@plot_option
@json_option
def recall(store: Path, sample: int, k: int, truth: Path | None, seed: int, row_range: str | None, backend: str,
           gpu_mem: str | None, plot: Path | None, as_json: bool) -> None:
    """Recall@k of the graph on sampled rows: self excluded, ties with the exact k-th neighbour count.

    \b
    Examples:
      bigknn eval recall data.knn
      bigknn eval recall data.knn --sample 2000 --k 10 --json
      bigknn truth data.knn --queries data.fbin --k 11 -o rows_gt.ibin   # each row's, itself first
      bigknn eval recall data.knn --truth rows_gt.ibin
      bigknn eval recall data.knn --rows 100000:110000    # only the rows new.fbin added (bigknn synth --help)
      bigknn eval recall data.knn --plot recall.png           # recall per row and per shard, drawn
    """
    result = api.open(store).recall(sample, k, truth, seed, parse_range(row_range), backend, parse_bytes(gpu_mem),
                                    plot)
    emit(result.to_dict(), as_json, "recall")


def parse_range(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        lo, hi = (int(v) for v in text.split(":"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not LO:HI", param_hint="--rows") from None
    return lo, hi


eval_group.add_command(eval_search)
