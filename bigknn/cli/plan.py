"""``bigknn plan``: size a build before starting it."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from bigknn.backends import get_backends
from bigknn.cli.common import (backend_option, emit, gpu_mem_option, gpus_option, json_option, parse_bytes,
                               reporter_for)
from bigknn.formats import open_vectors
from bigknn.params import GnndParams
from bigknn.human import human_bytes, human_duration
from bigknn.pipeline.plan import CALIBRATION_STEPS, auto_shard_rows, calibrate, plan as make_plan, rates_from_store
from bigknn.shards import Store

DTYPES = ("float32", "float16", "uint8", "int8")
SLOW_ON_CPU_S = 86400.0  # a CPU estimate above this gets a note that a GPU is the tool for the job


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
        with reporter_for(as_json).phase("calibrate", CALIBRATION_STEPS, "steps") as advance:
            rates = calibrate(backends[0], c_rows, dim, params, advance)
    result = make_plan(rows, dim, itemsize, params, min(shard_rows, rows), len(backends), rates, disk_gbps * 1e9)
    if as_json:
        emit(result, as_json, "plan")
    else:
        show(result, backends[0].name, dtype if input is None else vf.read_dtype.name)


def show(p: dict, backend: str, dtype: str) -> None:
    """The plan for people: sizes in GB, time in the largest readable unit."""
    est = p["estimate_s"]
    rates = p["rates"]
    lines = [
        f"plan: {p['rows']:,} rows x {p['dim']} ({dtype}), k {p['k']}, lists of {p['list_width']}",
        f"  shards       {p['shards']:,} of {p['shard_rows']:,} rows; {p['merges']:,} merges in {p['rounds']:,} "
        f"rounds on {p['workers']} worker{'s' * (p['workers'] > 1)}",
        f"  disk         {human_bytes(p['disk_bytes'])} for the store; {human_bytes(p['io_bytes'])} read and "
        "written during the build",
        f"  host memory  {human_bytes(p['host_bytes_per_worker'])} per worker, {human_bytes(p['host_bytes_total'])} "
        "in all",
        f"  GPU memory   {human_bytes(p['gpu_bytes_per_worker'])} per worker" if backend == "cuda" else
        f"  GPU memory   {human_bytes(p['gpu_bytes_per_worker'])} per worker, if built on a GPU",
        f"  time         ≈ {human_duration(est['total'])} on {backend}: GNND {human_duration(est['gnnd'])}, merges "
        f"{human_duration(est['ggm'])}, disk I/O {human_duration(est['io'])} (overlapped with compute)",
        f"  rates        {rates['source']}: GNND {rates['gnnd_rows_per_s']:,} rows/s, merges "
        f"{rates['ggm_rows_per_s']:,} rows/s",
    ]
    if backend == "cpu" and est["total"] > SLOW_ON_CPU_S:
        lines.append(f"  note         {human_duration(est['total'])} on the CPU: a GPU would take a small fraction of "
                     "that; run `bigknn plan` on a GPU machine (or with --store of a store built there) to see")
    click.echo("\n".join(lines))

