"""``bigknn ingest``: fold new files into a store (what the cron job runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from bigknn import api
from bigknn.cli.common import (backend_option, emit, gpu_mem_option, gpus_option, host_mem_option, json_option,
                               parse_bytes, scheduler_option, show_progress, threads_option)
from bigknn.core.errors import StoreBusy


@click.command()
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--input", "inputs", type=click.Path(path_type=Path), multiple=True,
              help="A file to ingest (repeatable; ingested in the order given).")
@click.option("--watch-dir", type=click.Path(path_type=Path), default=None,
              help="Ingest every input file in this drop folder not yet ingested, oldest first; hidden "
                   "files and files still being written are skipped (the next run takes them).")
@click.option("--column", default=None,
              help="Parquet/Arrow inputs: the column of vectors (default: the only fixed-size list column). A "
                   "store built with --id-column takes each input's ids from the column of that name.")
@click.option("--wait", "wait_s", type=float, default=0.0, show_default=True,
              help="Seconds to wait for another writer before giving up.")
@click.option("--busy-exit", type=click.IntRange(0, 255), default=75, show_default=True,
              help="Exit code when another writer still holds the store after --wait (e.g. 75 for cron alerts).")
@backend_option
@threads_option
@gpus_option
@gpu_mem_option
@host_mem_option
@scheduler_option
@json_option
def ingest(store: Path, inputs: tuple[Path, ...], watch_dir: Path | None, column: str | None, wait_s: float,
           busy_exit: int,
           backend: str, threads: int | None, gpus: str | None, gpu_mem: str | None, host_mem: str | None,
           scheduler: str | None,
           as_json: bool) -> None:
    """Add new vectors to a finished store: every row, old and new, again holds its top-k over the whole set.

    New rows get ids after the last existing id, in input order. Inputs are checked against the store
    (dimension, dtype, finite values) before anything is written; a file that changes while it is read is
    refused. A file already ingested (same size and sha256) is skipped; an interrupted ingest resumes on
    the next run; readers see the old graph until the ingest's single final commit.

    \b
    Examples:
      bigknn ingest data.knn --input day1.fbin --input day2.fbin
      bigknn ingest emb.knn --input 2026-11-28.parquet --column emb
      bigknn ingest data.knn --watch-dir /srv/drop --wait 300 --busy-exit 75 --json
    """
    if bool(inputs) == bool(watch_dir):
        raise click.UsageError("give --input FILE (one or more) or --watch-dir DIR")
    try:
        report = api.ingest(store, inputs, watch_dir, backend, gpus, threads=threads, gpu_mem=parse_bytes(gpu_mem),
                            host_mem=parse_bytes(host_mem), wait=wait_s, progress=show_progress(as_json),
                            scheduler=scheduler, column=column)
    except StoreBusy as e:
        click.echo(f"bigknn: {e}", err=True)
        sys.exit(busy_exit)
    emit(report.to_dict(), as_json, "ingest")
