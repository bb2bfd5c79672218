"""``bigknn plan``: size a build before starting it."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from bigknn.backends import get_backends
from bigknn.cli.common import backend_option, emit, gpu_mem_option, gpus_option, json_option, parse_bytes
from bigknn.formats import open_vectors
from bigknn.params import GnndParams
from bigknn.pipeline.plan import auto_shard_rows, calibrate, plan as make_plan, rates_from_store
from bigknn.shards import Store

DTYPES = ("float32", "float16", "uint8", "int8")


@click.command()
@click.argument("input", type=click.Path(path_type=Path), required=False)
@click.option("--rows", type=click.IntRange(min=2), default=None, help="Rows (instead of INPUT).")
@click.option("--dim", type=click.IntRange(min=1), default=None, help="Dimension (instead of INPUT).")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--k", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--list-width", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--shard-rows", type=click.IntRange(min=2), default=None,
              help="Rows per shard (default: the largest whose merge fits --gpu-mem, or 1M on the CPU).")
@click.option("--store", type=click.Path(path_type=Path), default=None,
              help="Take rates from this store's recorded timings instead of calibrating.")
@click.option("--calibrate-rows", type=click.IntRange(min=1000), default=None,
              help="Rows of the calibration shard (default 1M on a GPU, 20K on the CPU).")
@click.option("--disk-gbps", type=float, default=2.0, show_default=True, help="Disk bandwidth to assume.")
@backend_option
@gpus_option
@gpu_mem_option
@json_option
def plan(input: Path | None, rows: int | None, dim: int | None, dtype: str, k: int, list_width: int,
         shard_rows: int | None, store: Path | None, calibrate_rows: int | None, disk_gbps: float, backend: str,
         gpus: str | None, gpu_mem: str | None, as_json: bool) -> None:
    """Shards, merges, disk, host and GPU memory per worker, and the estimated time of a build.

    Rates come from a store's recorded timings (--store) or from a short calibration run on this
    machine; the estimate scales them to the planned shard and merge sizes.

    \b
    Examples:
      bigknn plan --rows 1000000000 --dim 96 --k 32
      bigknn plan deep1b.fbin --gpus all --gpu-mem 120G
      bigknn plan --rows 1000000000 --dim 96 --store t2.knn --shard-rows 50000000
    """
    if input is not None:
        vf = open_vectors(input)
        rows, dim, itemsize = vf.rows, vf.dim, vf.read_dtype.itemsize
    elif rows is None or dim is None:
        raise click.UsageError("give INPUT, or --rows and --dim")
    else:
        itemsize = np.dtype(dtype).itemsize
    params = GnndParams(k=k, list_width=list_width)
    backends = get_backends(backend, gpus, parse_bytes(gpu_mem))
    if shard_rows is None:
        shard_rows = auto_shard_rows(backends, dim, itemsize, params, parse_bytes(gpu_mem))
    if store is not None:
        rates = rates_from_store(Store.open(store, pin=False))
    else:
        c_rows = calibrate_rows or (1_000_000 if backends[0].name == "cuda" else 20_000)
        rates = calibrate(backends[0], c_rows, dim, params)
    emit(make_plan(rows, dim, itemsize, params, min(shard_rows, rows), len(backends), rates, disk_gbps * 1e9),
         as_json, "plan")

