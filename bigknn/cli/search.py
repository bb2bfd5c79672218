"""``bigknn prune``, ``bigknn search``, ``bigknn truth`` and ``bigknn eval search`` (registered in evaluate.py):
the kNN graph -> a search graph, and searching it."""

from __future__ import annotations

from pathlib import Path

import click

from bigknn import api
from bigknn.cli.common import (backend_option, emit, gpu_mem_option, host_mem_option, json_option, parse_bytes,
                               plot_option, show_progress, wait_option)
from bigknn.operations.export import ID_KINDS
from bigknn.algorithms.search_params import ALPHA, METHODS, PROCEDURES
from bigknn.operations.search_stream import STREAM_BATCH

queries_option = click.option("--queries", type=click.Path(dir_okay=False, path_type=Path), required=True,
                              help="Query vectors (.fbin, .u8bin, .i8bin, .f16bin, .fvecs, .bvecs, .npy), the "
                                   "store's dimension.")
k_option = click.option("-k", "--k", type=click.IntRange(min=1), default=10, show_default=True,
                        help="Neighbours per query.")
batch_option = click.option("--batch", type=click.IntRange(min=1), default=None,
                            help="Queries searched together (default: all); QPS is measured over batches of it.")
procedure_option = click.option(
    "--procedure", type=click.Choice(PROCEDURES), default="auto", show_default=True,
    help="small: independent greedy searches per query (budget: how many); large: best-first over a search "
         "list (budget: its length); auto: large (small's greedy searches stop short of recall 0.97 on text).")
seed_option = click.option("--seed", type=int, default=0, show_default=True,
                           help="Seed of the entry sample (the rows searches start from).")
output_option = click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
                             help=".ibin to write (ids, then distances; row i: query i).")


@click.command()
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--method", type=click.Choice(METHODS), default="tsdg", show_default=True,
              help="tsdg: two-stage diversification (occlusion factors); rng: relative-neighbourhood rule plus "
                   "GGNN's symmetric links.")
@click.option("--degree", type=click.IntRange(min=2), default=32, show_default=True,
              help="Most edges a row keeps.")
@click.option("--alpha", type=float, default=ALPHA, show_default=True,
              help="tsdg: relaxation of the first stage (>= 1; 1 is plain diversification).")
@backend_option
@gpu_mem_option
@host_mem_option
@wait_option
@json_option
def prune(store: Path, method: str, degree: int, alpha: float, backend: str, gpu_mem: str | None,
          host_mem: str | None, wait_s: float, as_json: bool) -> None:
    """Turn the store's kNN graph into a search graph (a new version in the store; the kNN graph is kept).
    A kNN graph of twice the degree (bigknn build --k 64 for degree 32) gives a better search graph.

    \b
    Examples:
      bigknn prune data.knn                          # tsdg, degree 32
      bigknn prune data.knn --gpu-mem 1G             # a capped GPU: the same graph
      bigknn prune data.knn --method rng --degree 64
      bigknn prune data.knn --alpha 1.1 --json
    """
    report = api.open(store).prune(method, degree, alpha, backend, parse_bytes(gpu_mem), parse_bytes(host_mem),
                                   wait_s, show_progress(as_json))
    emit(report.to_dict(), as_json, "prune")


@click.command()
@click.argument("store", type=click.Path(path_type=Path))
@queries_option
@k_option
@click.option("--budget", type=float, default=None,
              help="small: searches per query (default 16); large: the search list's length (default 64).")
@click.option("--batch", type=click.IntRange(min=1), default=None,
              help=f"Queries searched together (default {STREAM_BATCH:,}); the file is read and its results "
                   "written batch by batch, so a query file of any size streams through.")
@procedure_option
@seed_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help=".ibin (ids, then distances; row i: query i) or .parquet (query, rank, id, distance).")
@click.option("--ids", type=click.Choice(ID_KINDS), default="row", show_default=True,
              help="row: input row numbers; user: the ids of the store's --id-column (a .parquet output).")
@backend_option
@gpu_mem_option
@json_option
def search(store: Path, queries: Path, k: int, budget: float | None, batch: int | None, procedure: str, seed: int,
           output: Path, ids: str, backend: str, gpu_mem: str | None, as_json: bool) -> None:
    """Search the pruned graph for the k nearest rows of each query (run `bigknn prune` first). The search graph is
    loaded once; the queries stream through it in batches, each batch's results written as it finishes (the
    output appears whole at the end). A .parquet output, or --ids user, is written once all are searched. QPS
    counts the searches; wall_s the whole run.

    \b
    Examples:
      bigknn prune data.knn                                # once: the search graph
      bigknn synth q.fbin --rows 1000 --dim 96 --seed 1    # queries like data.fbin's rows
      bigknn search data.knn --queries q.fbin -o found.ibin
      bigknn search data.knn --queries q.fbin --k 10 --budget 128 --procedure large -o found.ibin
      bigknn search data.knn --queries q.fbin --batch 1 --budget 8 --procedure small -o found.ibin --json
      bigknn search emb.knn --queries q.fbin -o found.parquet --ids user
    """
    graph = api.open(store)
    if ids == "user" or output.suffix.lower() == ".parquet":
        report = graph.search(queries, k, budget, batch, procedure, seed, output, backend, parse_bytes(gpu_mem),
                              ids).report
    else:
        report = graph.search_file(queries, output, k, budget, batch, procedure, seed, backend, parse_bytes(gpu_mem),
                                   show_progress(as_json))
    emit(report.to_dict(), as_json, "search")


@click.command()
@click.argument("store", type=click.Path(path_type=Path))
@queries_option
@k_option
@output_option
@backend_option
@gpu_mem_option
@json_option
def truth(store: Path, queries: Path, k: int, output: Path, backend: str, gpu_mem: str | None,
          as_json: bool) -> None:
    """Exact k nearest rows of each query (a brute-force scan of the store): the ground truth of `bigknn eval
    search`.

    \b
    Examples:
      bigknn synth q.fbin --rows 1000 --dim 96 --seed 1    # queries like data.fbin's rows
      bigknn truth data.knn --queries q.fbin -o gt.ibin
      bigknn truth data.knn --queries q.fbin --k 100 -o gt100.ibin --json
    """
    report = api.open(store).truth(queries, output, k, backend, parse_bytes(gpu_mem))
    emit(report.to_dict(), as_json, "truth")


@click.command(name="search")
@click.argument("store", type=click.Path(path_type=Path))
@queries_option
@click.option("--truth", "truth_path", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Ground truth .ibin of the queries (`bigknn truth`).")
@k_option
@click.option("--budgets", type=str, default=None,
              help="Comma-separated budgets to sweep (default: the procedure's, e.g. 1,2,4,...,128 searches).")
@batch_option
@procedure_option
@seed_option
@backend_option
@gpu_mem_option
@plot_option
@json_option
def eval_search(store: Path, queries: Path, truth_path: Path, k: int, budgets: str | None, batch: int | None,
                procedure: str, seed: int, backend: str, gpu_mem: str | None, plot: Path | None,
                as_json: bool) -> None:
    """Recall@k and queries per second of the search at each budget (the recall-vs-QPS table).

    \b
    Examples:
      bigknn prune data.knn                                # once: the search graph
      bigknn synth q.fbin --rows 1000 --dim 96 --seed 1    # queries like data.fbin's rows
      bigknn truth data.knn --queries q.fbin -o gt.ibin
      bigknn eval search data.knn --queries q.fbin --truth gt.ibin --plot curve.png
      bigknn eval search data.knn --queries q.fbin --truth gt.ibin --batch 1 --budgets 1,4,16 --json
    """
    sweep = api.open(store).search_sweep(queries, truth_path, k, parse_budgets(budgets), batch, procedure, seed,
                                         backend, parse_bytes(gpu_mem), plot)
    result = sweep.to_dict()
    if not as_json:
        result["points"] = [f"{p['budget']:g}: recall {p['recall']:.4f}, {p['qps']:,.0f} QPS" for p in result["points"]]
    emit(result, as_json, "search sweep")


def parse_budgets(text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of numbers", param_hint="--budgets") from None
