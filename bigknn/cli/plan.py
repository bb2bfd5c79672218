"""``bigknn plan``: size a build before starting it."""

from __future__ import annotations

from pathlib import Path

import click

from bigknn import api
from bigknn.cli.common import (backend_option, emit, gpu_mem_option, gpus_option, host_mem_option, json_option,
                               parse_bytes, show_progress)
from bigknn.core.human import human_bytes, human_duration
from bigknn.algorithms.partition import METHODS as PARTITIONS
from bigknn.algorithms.partition.learn import DEFAULT_METHOD
from bigknn.operations.calibrate import EXPONENT_RANGE
from bigknn.operations.plan_model import ASSUMED_PAIRS_PER_SHARD
from bigknn.shards.referenced import MODES as VECTOR_MODES

DTYPES = ("float32", "float16", "uint8", "int8")
SLOW_ON_CPU_S = 86400.0  # a CPU estimate above this gets a note that a GPU is the tool for the job


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
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="The store the build will write: its file system's rate is measured (default: INPUT's, "
                   "else the current directory's).")
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
                   "kmeans/rptree the near pairs only; auto picks as the build does.")
@click.option("--pairs-per-shard", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="Merges per shard of a partitioned build (default: --store's committed plan, else "
                   f"{ASSUMED_PAIRS_PER_SHARD}, the clustered synth's; the JSON's assumptions say which).")
@click.option("--vectors", type=click.Choice(VECTOR_MODES), default="copy", show_default=True,
              help="The build's --vectors: reference plans a store that writes no copy of the rows.")
@backend_option
@gpus_option
@gpu_mem_option
@host_mem_option
@json_option
def plan(input: Path | None, rows: int | None, dim: int | None, dtype: str, k: int, list_width: int,
         shard_rows: int | None, output: Path | None, store: Path | None, calibrate_rows: int | None,
         disk_gbps: float | None, partition: str, pairs_per_shard: float | None, vectors: str, backend: str,
         gpus: str | None, gpu_mem: str | None, host_mem: str | None, as_json: bool) -> None:
    """Shards, merges, disk, host and GPU memory per worker, and the estimated time of a build.

    Rates come from a store's recorded timings (--store) or from a short calibration run on this
    machine; the estimate scales them to the planned shard and merge sizes. The same plan is projected
    to 1, 2, 4 and 8 workers of the kind measured (GPUs: --gpus picks the plan's own), sharing this
    machine's disk; the disk floor (one read of the input, one write of what the store holds) says when
    a build is bound by its disk.

    \b
    Examples:
      bigknn plan --rows 1000000000 --dim 96 --k 32
      bigknn plan deep1b.fbin --gpus all --gpu-mem 120G
      bigknn plan --rows 1000000000 --dim 96 --store t2.knn --shard-rows 50000000
      bigknn plan --rows 1000000000 --dim 96 --k 32 --partition kmeans --store t2.knn
      bigknn plan big.fbin --host-mem 64G    # the shard cache of a build given --host-mem 64G
      bigknn plan big.fbin -o /data/big.knn  # the disk rate of the file system the store goes to
      bigknn plan big.fbin --vectors reference --partition contiguous   # no copy of big.fbin written
    """
    if input is None and (rows is None or dim is None):
        raise click.UsageError("give INPUT, or --rows and --dim")
    result = api.plan(input, rows, dim, dtype, k, list_width, shard_rows, store, calibrate_rows, disk_gbps, partition,
                      pairs_per_shard, backend, gpus, gpu_mem=parse_bytes(gpu_mem), host_mem=parse_bytes(host_mem),
                      progress=show_progress(as_json), output=output, vectors=vectors)
    if as_json:
        emit(result, as_json, "plan")
    else:
        show(result)


def show(p: dict) -> None:
    """The plan for people: sizes in GB, time in the largest readable unit."""
    backend, on_gpu, dtype = p["backend"], p["on_device"], p["dtype"]
    est = p["estimate_s"]
    rates = p["rates"]
    assumed = p["assumptions"]
    disk = assumed["disk"]
    floor = p["disk_floor"]
    lines = [
        f"plan: {p['rows']:,} rows x {p['dim']} ({dtype}), k {p['k']}, lists of {p['list_width']}",
        f"  shards       {p['shards']:,} of {p['shard_rows']:,} rows ({p['partition']}); {p['merges']:,} of "
        f"{p['all_pairs']:,} pairs merged, on {p['workers']} worker{'s' * (p['workers'] > 1)}",
        f"  disk         {human_bytes(p['disk_bytes'])} for the store ({stored(p['store_bytes'])}; "
        f"{human_bytes(disk['free_bytes'])} free{', TOO LITTLE' if disk['free_bytes'] < p['disk_bytes'] else ''}); "
        f"{human_bytes(p['read_bytes'])} read and {human_bytes(p['written_bytes'])} written during the build "
        f"({human_bytes(p['rewritten_bytes'])} of graphs before they are final)",
        f"  host memory  {human_bytes(p['host_bytes_per_worker'])} per worker, {human_bytes(p['host_bytes_total'])} "
        f"in all; the shard cache holds {p['cached_shards']:,} of {p['shards']:,} shards",
        f"  read back    {p['merge_reads']:,} shards for merges: {assumed['merge_reads']}",
        f"  GPU memory   {human_bytes(p['gpu_bytes_per_worker'])} per worker" if on_gpu else
        f"  GPU memory   {human_bytes(p['gpu_bytes_per_worker'])} per worker, if built on a GPU",
        f"  time         ≈ {human_duration(est['total'])} on {backend}: "
        f"{'partition learnt and every row labelled' if p['partition'] != 'contiguous' else 'first shards read'} "
        f"{human_duration(est['start'])}, GNND {human_duration(est['gnnd'])}, merges {human_duration(est['ggm'])}, "
        f"last graphs written {human_duration(est['end'])}; disk I/O {human_duration(est['io'])} (overlapped): "
        f"{p['bound']}-bound",
        f"  disk floor   {human_duration(floor['s'])}: one read of the input ({human_bytes(floor['read_bytes'])}) "
        f"and one write of the store ({human_bytes(floor['written_bytes'])}) at the disk rates below",
        "  projected    " + "; ".join(projected(q) for q in p["projections"]),
        f"  rates        GNND {rates['gnnd_rows_per_s']:,} rows/s"
        + (f" (one shard across {rates['gnnd_spans_gpus']} GPUs)" if rates["gnnd_spans_gpus"] else "")
        + f", merges {rates['ggm_rows_per_s']:,} pair rows/s at shards of {rates['at_rows']:,} rows",
        f"  measured     {rates['source']}: " + scaling(rates) + spanning(rates),
        f"  disk rates   read {disk['read_gbps']} GB/s, write {disk['write_gbps']} GB/s ({disk['source']})"
        + (f"; the page cache takes {human_bytes(disk['dirty_bytes'])} of writes at {disk['cache_write_gbps']} GB/s"
           if disk.get("dirty_bytes") and disk.get("cache_write_gbps") else ""),
        f"  assumed      host RAM {human_bytes(assumed['host_ram_bytes'])}"
        + (f", GPU memory {human_bytes(assumed['gpu_bytes'])}" if assumed["gpu_bytes"] else "")
        + (f", {assumed['pairs_per_shard']} merges per shard ({assumed['pairs_source']})"
           if p["partition"] != "contiguous" else ""),
    ]
    if "label_rows_per_s" in rates:
        lines.insert(-3, f"  labelling    {rates['label_rows_per_s']:,.0f} rows/s after "
                         f"{human_duration(rates['learn_s'])} of learning ({assumed['labelling']})")
    if (refused := p["build_refuses"]) is not None:
        lines.insert(1, "  refused      bigknn build refuses"
                        f" --shard-rows {refused['shard_rows']:,} ({refused['why']}); "
                        f"planned with --shard-rows {refused['planned_shard_rows']:,}: pass it to build")
    if p["over_gpu_fit"]:
        lines.insert(2 if refused else 1, "  note         shards as large as build takes do not fit a merge in this "
                                          "GPU's memory: no build of this size fits; use more GPU memory (--gpu-mem) "
                                          "or fewer rows")
    if not on_gpu and est["total"] > SLOW_ON_CPU_S:
        lines.append(f"  note         {human_duration(est['total'])} on the CPU: a GPU would take a small fraction of "
                     "that; run `bigknn plan` on a GPU machine (or with --store of a store built there) to see")
    click.echo("\n".join(lines))


def projected(q: dict) -> str:
    """One worker count's projection, for people."""
    return (f"{q['workers']} worker{'s' * (q['workers'] > 1)}: {human_duration(q['estimate_s']['total'])} "
            f"({q['shards']:,} shard{'s' * (q['shards'] > 1)}, {q['bound']}-bound)")


def stored(parts: dict) -> str:
    """What the store holds, for people: the rows' copy (or none: referenced), row ids, the final graph."""
    vectors = human_bytes(parts["vectors"]) + " of vectors" if parts["vectors"] else "vectors referenced, not copied"
    ids = f", {human_bytes(parts['row_ids'])} of row ids" if parts["row_ids"] else ""
    return f"{vectors}{ids}, {human_bytes(parts['graph'])} of final graph"


def spanning(rates: dict) -> str:
    """The GNND across GPUs as calibrated, where it was (a one-shard plan on GPUs that span it)."""
    if "spanning_gnnd_rows_per_s" not in rates:
        return ""
    return (f"; GNND across {rates['spanning_gpus']} GPUs {rates['spanning_gnnd_rows_per_s']:,} rows/s at "
            f"{rates['spanning_at_rows']:,} rows (scaled as the one-GPU GNND)")


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
