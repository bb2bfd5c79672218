"""``bigknn plan``: size a build before starting it."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from bigknn.backends import get_backends
from bigknn.cli.common import (backend_option, emit, gpu_mem_option, gpus_option, host_mem_option, json_option,
                               parse_bytes, reporter_for)
from bigknn.formats import open_vectors
from bigknn.params import GnndParams
from bigknn.human import human_bytes, human_duration
from bigknn.partition import METHODS as PARTITIONS
from bigknn.partition.learn import DEFAULT_METHOD
from bigknn.pipeline.diskrate import measure_disk
from bigknn.pipeline.calibrate import (EXPONENT_RANGE, calibrate, calibration_sizes, calibration_steps,
                                       rates_from_store, sample_rows)
from bigknn.pipeline.plan import (ASSUMED_PAIRS_PER_SHARD, auto_shard_rows, fitting_shard_rows,
                                  pairs_per_shard_from_store, plan as make_plan, spread_for_workers)
from bigknn.pipeline.steps import physical_memory
from bigknn.shards import Store

DTYPES = ("float32", "float16", "uint8", "int8")
SLOW_ON_CPU_S = 86400.0  # a CPU estimate above this gets a note that a GPU is the tool for the job
# rows of the larger calibration shard (its merge takes seconds): the planned shard's up to this on a GPU
GPU_CALIBRATION_ROWS = 4_000_000
CPU_CALIBRATION_ROWS = 20_000  # and this on the CPU


@click.command()
@click.argument("input", type=click.Path(path_type=Path), required=False)
@click.option("--rows", type=click.IntRange(min=2), default=None, help="Rows (instead of INPUT).")
@click.option("--dim", type=click.IntRange(min=1), default=None, help="Dimension (instead of INPUT).")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True,
              help="Dtype of the rows (with --rows and --dim): sizes the store and the calibration rows.")
@click.option("-k", "--k", type=click.IntRange(min=1), default=32, show_default=True,
              help="Neighbours per row of the planned build.")
@click.option("--list-width", type=click.IntRange(min=0), default=0, show_default=True,
              help="Entries per list while building, as bigknn build --list-width (0: max(k, 32)).")
@click.option("--shard-rows", type=click.IntRange(min=2), default=None,
              help="Rows per shard (default: the largest whose merge fits --gpu-mem, or 1M on the CPU).")
@click.option("--store", type=click.Path(path_type=Path), default=None,
              help="Take rates from this store's recorded timings instead of calibrating.")
@click.option("--calibrate-rows", type=click.IntRange(min=1000), default=None,
              help="Rows of the larger calibration shard; the other has a quarter of them (default: the planned "
                   "shard's up to 4M on a GPU, 20K on the CPU; at most half of INPUT's rows).")
@click.option("--disk-gbps", type=click.FloatRange(min=0.001), default=None,
              help="Disk bandwidth (GB/s, read and write) to assume instead of measuring it (256 MiB written "
                   "and read back uncached in INPUT's directory, else the current one).")
@click.option("--partition", type=click.Choice(PARTITIONS), default=DEFAULT_METHOD, show_default=True,
              help="The build's partition (bigknn build --partition): contiguous merges every shard pair, "
                   "kmeans/rptree the near pairs only.")
@click.option("--pairs-per-shard", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="Merges per shard of a partitioned build (default: --store's committed plan, else "
                   f"{ASSUMED_PAIRS_PER_SHARD}, the clustered synth's; the JSON's assumptions say which).")
@backend_option
@gpus_option
@gpu_mem_option
@host_mem_option
@json_option
def plan(input: Path | None, rows: int | None, dim: int | None, dtype: str, k: int, list_width: int,
         shard_rows: int | None, store: Path | None, calibrate_rows: int | None, disk_gbps: float | None,
         partition: str, pairs_per_shard: float | None, backend: str, gpus: str | None, gpu_mem: str | None,
         host_mem: str | None, as_json: bool) -> None:
    """Shards, merges, disk, host and GPU memory per worker, and the estimated time of a build.

    Rates come from a store's recorded timings (--store) or from a short calibration run on this
    machine; the estimate scales them to the planned shard and merge sizes.

    \b
    Examples:
      bigknn plan --rows 1000000000 --dim 96 --k 32
      bigknn plan deep1b.fbin --gpus all --gpu-mem 120G
      bigknn plan --rows 1000000000 --dim 96 --store t2.knn --shard-rows 50000000
      bigknn plan --rows 1000000000 --dim 96 --k 32 --partition kmeans --store t2.knn
      bigknn plan big.fbin --host-mem 64G    # the shard cache of a build given --host-mem 64G
    """
    vf = None
    if input is not None:
        vf = open_vectors(input)
        rows, dim, itemsize = vf.rows, vf.dim, vf.read_dtype.itemsize
    elif rows is None or dim is None:
        raise click.UsageError("give INPUT, or --rows and --dim")
    else:
        itemsize = np.dtype(dtype).itemsize
    params = GnndParams(k=k, list_width=list_width)
    backends = get_backends(backend, gpus, parse_bytes(gpu_mem))
    fits_gpu = auto_shard_rows(backends, dim, itemsize, params, parse_bytes(gpu_mem))
    if shard_rows is None:
        shard_rows = fits_gpu
        if partition == "contiguous":
            shard_rows = spread_for_workers(rows, shard_rows, len(backends))
    asked = shard_rows
    shard_rows, refusal = fitting_shard_rows(rows, shard_rows, params.width(), partition)
    measured = Store.open(store, pin=False) if store is not None else None
    pairs_source = "--pairs-per-shard"
    if pairs_per_shard is None:
        from_store = pairs_per_shard_from_store(measured) if measured is not None else None
        pairs_per_shard = ASSUMED_PAIRS_PER_SHARD if from_store is None else from_store
        pairs_source = f"the plan of {store}" if from_store is not None else "assumed (the clustered synth's)"
    if disk_gbps is None:
        disk = measure_disk(input.parent if input is not None else Path.cwd())
    else:
        disk = {"read_gbps": disk_gbps, "write_gbps": disk_gbps, "source": "--disk-gbps"}
    gpu_bytes = [b for b in (be.memory_budget() for be in backends) if b is not None] or [parse_bytes(gpu_mem)]
    assumptions = {"host_ram_bytes": physical_memory(), "gpu_bytes": gpu_bytes[0],
                   "pairs_per_shard": round(pairs_per_shard, 3), "pairs_source": pairs_source,
                   "labelling": "the partition's labelling pass is counted as one more read of the input; its "
                                "nearest-centroid search runs on the backend and is not timed"}
    if measured is not None:
        rates = rates_from_store(measured)
    else:
        on_gpu = backends[0].name == "cuda"
        c_rows = calibrate_rows or (min(shard_rows, GPU_CALIBRATION_ROWS) if on_gpu else CPU_CALIBRATION_ROWS)
        c_rows = min(c_rows, rows // 2) if vf is not None else c_rows
        sizes = calibration_sizes(c_rows, params.width())
        x, what = sample_rows(vf, 2 * c_rows, dim, dtype)
        progress = reporter_for(as_json)
        backends[0].warm_up(progress.note)  # a first run's compile: said, and outside the calibration
        with progress.phase("calibrate", calibration_steps(sizes), "steps") as advance:
            rates = calibrate(backends[0], x, sizes, params, what, advance=advance)
    result = make_plan(rows, dim, itemsize, params, min(shard_rows, rows), len(backends), rates, disk, partition,
                       pairs_per_shard, assumptions, parse_bytes(host_mem))
    result["build_refuses"] = None if refusal is None else {
        "shard_rows": asked, "why": refusal, "planned_shard_rows": shard_rows,
        "over_gpu_fit": shard_rows > fits_gpu and any(b.memory_budget() is not None for b in backends)}
    if as_json:
        emit(result, as_json, "plan")
    else:
        show(result, backends[0].name, dtype if vf is None else vf.read_dtype.name)


def show(p: dict, backend: str, dtype: str) -> None:
    """The plan for people: sizes in GB, time in the largest readable unit."""
    est = p["estimate_s"]
    rates = p["rates"]
    assumed = p["assumptions"]
    disk = assumed["disk"]
    lines = [
        f"plan: {p['rows']:,} rows x {p['dim']} ({dtype}), k {p['k']}, lists of {p['list_width']}",
        f"  shards       {p['shards']:,} of {p['shard_rows']:,} rows ({p['partition']}); {p['merges']:,} of "
        f"{p['all_pairs']:,} pairs merged, on {p['workers']} worker{'s' * (p['workers'] > 1)}",
        f"  disk         {human_bytes(p['disk_bytes'])} for the store; {human_bytes(p['io_bytes'])} read and "
        "written during the build",
        f"  host memory  {human_bytes(p['host_bytes_per_worker'])} per worker, {human_bytes(p['host_bytes_total'])} "
        f"in all; the shard cache holds {p['cached_shards']:,} of {p['shards']:,} shards",
        f"  read back    {p['merge_reads']:,} shards for merges: {assumed['merge_reads']}",
        f"  GPU memory   {human_bytes(p['gpu_bytes_per_worker'])} per worker" if backend == "cuda" else
        f"  GPU memory   {human_bytes(p['gpu_bytes_per_worker'])} per worker, if built on a GPU",
        f"  time         ≈ {human_duration(est['total'])} on {backend}: first shards read "
        f"{human_duration(est['start'])}, GNND {human_duration(est['gnnd'])}, merges {human_duration(est['ggm'])}, "
        f"last graphs written {human_duration(est['end'])}; disk I/O {human_duration(est['io'])} (overlapped)",
        f"  rates        GNND {rates['gnnd_rows_per_s']:,} rows/s, merges {rates['ggm_rows_per_s']:,} pair rows/s "
        f"at shards of {rates['at_rows']:,} rows",
        f"  measured     {rates['source']}: " + scaling(rates),
        f"  disk rates   read {disk['read_gbps']} GB/s, write {disk['write_gbps']} GB/s ({disk['source']})",
        f"  assumed      host RAM {human_bytes(assumed['host_ram_bytes'])}"
        + (f", GPU memory {human_bytes(assumed['gpu_bytes'])}" if assumed["gpu_bytes"] else "")
        + (f", {assumed['pairs_per_shard']} merges per shard ({assumed['pairs_source']})"
           if p["partition"] != "contiguous" else ""),
    ]
    if (refused := p["build_refuses"]) is not None:
        lines.insert(1, "  refused      bigknn build refuses"
                        f" --shard-rows {refused['shard_rows']:,} ({refused['why']}); "
                        f"planned with --shard-rows {refused['planned_shard_rows']:,}: pass it to build")
        if refused["over_gpu_fit"]:
            lines.insert(2, "  note         shards that large do not fit a merge in this GPU's memory: no build of "
                            "this size fits; use more GPU memory (--gpu-mem) or fewer rows")
    if backend == "cpu" and est["total"] > SLOW_ON_CPU_S:
        lines.append(f"  note         {human_duration(est['total'])} on the CPU: a GPU would take a small fraction of "
                     "that; run `bigknn plan` on a GPU machine (or with --store of a store built there) to see")
    click.echo("\n".join(lines))


def scaling(rates: dict) -> str:
    """Where the plan's rates came from: the measured sizes' rates and the power law that scaled them."""
    points = rates["points"] or [{"rows": rates["measured_at_rows"], **{
        k: rates[f"measured_{k}"] for k in ("gnnd_rows_per_s", "ggm_rows_per_s")}}]
    measured = "; ".join(f"GNND {p['gnnd_rows_per_s']:,}, merges {p['ggm_rows_per_s']:,} at {p['rows']:,} rows"
                         for p in points)
    if rates["gnnd_exponent"] is None:
        return f"{measured} (one size: not scaled to the planned one)"
    return (f"{measured}; scaled as rows^-b, b {rates['gnnd_exponent']} (GNND), {rates['ggm_exponent']} "
            f"(merges), clamped to {list(EXPONENT_RANGE)}")
