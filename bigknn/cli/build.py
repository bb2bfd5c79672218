"""``bigknn build`` and ``bigknn merge``."""

from __future__ import annotations

from pathlib import Path

import click

from bigknn import api
from bigknn.api import DEFAULTS
from bigknn.cli.common import (backend_option, emit, gpu_mem_option, gpus_option, host_mem_option,
                               in_existing_directory, json_option, parse_bytes, scheduler_option,
                               show_progress, threads_option, wait_option)
from bigknn.core.metric import METRIC_HELP, METRIC_NAMES
from bigknn.core.params import AUTO_SAMPLES, CPU_AUTO_SAMPLES, MIN_LIST
from bigknn.algorithms.partition import METHODS as PARTITIONS
from bigknn.algorithms.partition.learn import DEFAULT_METHOD
from bigknn.operations.plan_model import AUTO_KMEANS_SHARDS
from bigknn.shards.referenced import MODES as VECTOR_MODES


@click.command()
@click.argument("input", type=click.Path(path_type=Path))
@click.option("-o", "--output", "store", type=click.Path(path_type=Path), required=True,
              help="Store directory to create (or to resume).")
@click.option("-k", "--k", type=click.IntRange(min=1), default=DEFAULTS.k, show_default=True,
              help="Neighbours per row.")
@click.option("--metric", type=click.Choice(METRIC_NAMES), default="l2", show_default=True, help=METRIC_HELP)
@click.option("--shard-rows", type=click.IntRange(min=0), default=0, show_default=True,
              help="Most rows per shard (shards are balanced). 0: the largest whose merge fits the GPU "
                   "memory budget (--gpu-mem, or what is free), 1M on the CPU.")
@click.option("--recall", type=click.FloatRange(min=0.0, max=1.0, max_open=True), default=DEFAULTS.recall,
              show_default=True,
              help="Target recall@10: every shard's GNND and every merge iterate until an estimate on a sample "
                   "of their rows reaches it (widening lists where progress stalls). 0: no target; --iters "
                   "and the update-fraction rule alone decide (experts).")
@click.option("--iters", type=click.IntRange(min=1), default=DEFAULTS.iters, show_default=True,
              help="GNND iteration cap per shard.")
@click.option("--merge-iters", type=click.IntRange(min=1), default=DEFAULTS.merge_iters, show_default=True,
              help="Iteration cap of each pairwise merge (GGM).")
@click.option("--samples", type=click.IntRange(min=0), default=0, show_default=True,
              help=f"p: NEW/OLD samples per list per iteration (0: a third of the list width, 4 to {AUTO_SAMPLES}; "
                   f"4 to {CPU_AUTO_SAMPLES} on the CPU).")
@click.option("--list-width", type=click.IntRange(min=0), default=0, show_default=True,
              help=f"Entries per list while building (0: max(k, {MIN_LIST})); wider lists reach higher recall@k.")
@click.option("--partition", type=click.Choice(PARTITIONS), default=DEFAULT_METHOD, show_default=True,
              help="How rows are split into shards: balanced k-means or an RP-tree learnt on a sample keep near "
                   "rows together, so only the near shard pairs the recall target needs are merged; contiguous "
                   f"ranges merge every pair. auto: k-means from {AUTO_KMEANS_SHARDS} contiguous shards on (fewer "
                   "save no merges), else contiguous. Ids are the input's row numbers either way.")
@click.option("--vectors", type=click.Choice(VECTOR_MODES), default="copy", show_default=True,
              help="copy: the store holds a checksummed copy of the rows. reference: the store reads them from "
                   "INPUT, one flat file (.fbin .u8bin .i8bin .f16bin .npy), which must stay where and as it is "
                   "(a changed or moved file is refused; `bigknn verify` rehashes it): no disk for a second copy. "
                   "Not with --metric cosine or --partition kmeans/rptree.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of every random choice (samples, partition, initial lists): the same seed and input give "
                   "the same graph.")
@click.option("--column", default=None,
              help="Parquet/Arrow inputs: the column of vectors (default: the only fixed-size list column).")
@click.option("--id-column", default=None,
              help="Parquet/Arrow inputs: a column of your ids (int64 or string), kept in the store so that "
                   "export --ids user, search --ids user and the API's ids=\"user\" give them back.")
@backend_option
@threads_option
@gpus_option
@gpu_mem_option
@host_mem_option
@wait_option
@scheduler_option
@json_option
def build(input: Path, store: Path, k: int, metric: str, shard_rows: int, recall: float, iters: int, merge_iters: int,
          samples: int, list_width: int, partition: str, vectors: str, seed: int, column: str | None,
          id_column: str | None, backend: str, threads: int | None,
          gpus: str | None, gpu_mem: str | None, host_mem: str | None, wait_s: float, scheduler: str | None,
          as_json: bool) -> None:
    """Build the k-NN graph of INPUT into a store. INPUT is a file (.fbin .u8bin .i8bin .f16bin .fvecs
    .bvecs .ivecs .npy, Parquet .parquet, Arrow IPC .arrow/.feather) or a directory or quoted glob of such
    files, read as one dataset in sorted path order (Parquet and Arrow through pyarrow, a row group at a time).

    Rows are split into shards (contiguous ranges, or near rows together with --partition kmeans/rptree),
    each gets a GNND graph, then shard pairs are merged (GGM: every pair, or the near pairs the recall target
    needs), so each row ends with its top-k over the whole set. Each step is committed: rerunning the same
    command after a crash resumes; a store built from another input or with other parameters is refused.

    \b
    Examples:
      bigknn build data.fbin -o data.knn --k 32
      bigknn build data.fbin -o data.knn --k 32 --shard-rows 25000 --backend cpu --threads 4
      bigknn build emb.npy -o emb.knn --metric cosine --k 16 --json
      bigknn build data.fbin -o data.knn --recall 0.995
      bigknn build embeddings/ -o emb.knn --column emb --id-column doc_id
      bigknn build 'parts/*.npy' -o parts.knn
      bigknn build data.fbin -o data.knn --partition kmeans --shard-rows 1000000
      bigknn build data.fbin -o data.knn --vectors reference      # no copy of data.fbin in the store
      bigknn build deep10m.fbin -o deep.knn --shard-rows 1000000 --gpus all --host-mem 64G
      bigknn build /shared/deep10m.fbin -o /shared/deep.knn --scheduler tcp://head:8786
    """
    in_existing_directory(store, "-o")
    graph = api.build(input, k=k, metric=metric, store=store, recall=recall, backend=backend, gpus=gpus,
                      threads=threads, shard_rows=shard_rows, list_width=list_width, samples=samples, iters=iters,
                      merge_iters=merge_iters, seed=seed, partition=partition, column=column, id_column=id_column,
                      vectors=vectors, gpu_mem=parse_bytes(gpu_mem),
                      host_mem=parse_bytes(host_mem), wait=wait_s, progress=show_progress(as_json), scheduler=scheduler)
    emit(graph.report.to_dict(), as_json, "build")


@click.command()
@click.argument("store", type=click.Path(path_type=Path))
@click.argument("others", nargs=-1, type=click.Path(path_type=Path))
@backend_option
@threads_option
@gpus_option
@gpu_mem_option
@host_mem_option
@wait_option
@scheduler_option
@json_option
def merge(store: Path, others: tuple[Path, ...], backend: str, threads: int | None, gpus: str | None,
          gpu_mem: str | None, host_mem: str | None, wait_s: float, scheduler: str | None, as_json: bool) -> None:
    """Finish a store's pending work: GNND of unbuilt shards and every pending shard-pair merge, or the
    rest of an interrupted ingest or merge.

    With OTHERS: fold those stores, built independently (another machine, another day; same dim, dtype,
    metric, k and list width; contiguous), into STORE, reusing their graphs: their rows get ids after STORE's,
    in the order given, and only shard pairs across stores are merged: the way to split a build across
    machines without a cluster. A killed merge is finished by the same command; readers see the old graph
    until it ends. A store merged before is skipped. The recall estimate stays the one measured before the
    merge (its graph_rows says so): `bigknn eval recall` measures the merged graph.

    \b
    Examples:
      bigknn merge data.knn
      bigknn merge data.knn --wait 600 --json
      bigknn merge /shared/data.knn --scheduler local:2
      bigknn build day1.fbin -o day1.knn -k 32 && bigknn merge data.knn day1.knn --json
      bigknn merge /shared/all.knn /shared/part1.knn /shared/part2.knn --gpus all
    """
    report = api.merge(store, backend, gpus, others=others, threads=threads, gpu_mem=parse_bytes(gpu_mem),
                       host_mem=parse_bytes(host_mem), wait=wait_s, progress=show_progress(as_json),
                       scheduler=scheduler)
    emit(report.to_dict(), as_json, "merge")
