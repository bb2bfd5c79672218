"""What ``bigknn plan`` and ``bigknn.plan`` gather before sizing a build (plan.py): the input's shape (its file's
header, or the rows and dimension given), the shard size (the largest that fits the workers' device memory, or
the one given), merges per shard (a store's committed plan, or the assumption), disk rates, and the rates of
GNND and GGM (a store's recorded timings, or a short calibration on the input's own rows)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bigknn.backends import Backend, CallShape
from bigknn.formats import open_source
from bigknn.core.metric import L2
from bigknn.core.params import GnndParams
from bigknn.operations.calibrate import (SPANNING_STEPS, calibrate, calibrate_spanning, calibration_sizes,
                                         calibration_steps, rates_from_store, sample_rows, time_labelling)
from bigknn.operations.diskrate import measure_disk
from bigknn.operations.plan_model import (ASSUMED_PAIRS_PER_SHARD, auto_shard_rows, pairs_per_shard_from_store, plan,
                                          planned_shards)
from bigknn.core.errors import BadInput, free_bytes
from bigknn.engine.limits import build_shards
from bigknn.engine.sharding_pass import shard_total
from bigknn.shards.referenced import FLAT_SUFFIXES, refusal
from bigknn.engine.pending import physical_memory
from bigknn.core.progress import Reporter
from bigknn.shards import Store

# rows of the larger calibration shard (its merge takes seconds): the planned shard's up to this on a GPU
GPU_CALIBRATION_ROWS = 4_000_000
CPU_CALIBRATION_ROWS = 20_000  # and this on the CPU
PROJECTED_WORKERS = (1, 2, 4, 8)  # worker counts every plan also projects to (issue 35: 1, 2, 4 and 8 GPUs)


def size_build(input: Path | None, rows: int | None, dim: int | None, dtype: str, params: GnndParams,
               shard_rows: int | None, store: Path | None, calibrate_rows: int | None, disk_gbps: float | None,
               partition: str, pairs_per_shard: float | None, backends: list[Backend], gpu_mem: int | None,
               host_mem: int | None, reporter: Reporter, output: Path | None = None, vectors: str = "copy") -> dict:
    """The plan of a build of ``input`` (or of ``rows`` x ``dim`` of ``dtype``) on ``backends``, with what it
    was made on: the ``backend`` that calibrated, ``on_device`` (a device bounds its calls), the ``dtype`` read,
    and ``projections``: the same plan for PROJECTED_WORKERS workers of the calibrated kind, one node's disk
    shared by all of them."""
    vf = None
    if input is not None:
        vf = open_source(input)
        rows, dim, itemsize, dtype = vf.rows, vf.dim, vf.read_dtype.itemsize, vf.read_dtype.name
    elif rows is None or dim is None:
        raise ValueError("give an input file, or rows and dim")
    else:
        itemsize = np.dtype(dtype).itemsize
    fits_gpu = auto_shard_rows(backends, dim, itemsize, params, gpu_mem, rows)
    budgets = [b for b in (be.memory_budget() for be in backends) if b is not None] or [gpu_mem]
    on_device = backends[0].memory_budget() is not None

    def sized(workers: int) -> tuple[int, str, dict | None]:
        at = planned_shards(rows, shard_rows, fits_gpu, workers, params.width(), partition)
        if vectors == "reference" and (why := refusal_of_reference(input, at[1], rows, at[0], params)):
            raise BadInput(input or "--vectors reference", why)
        return at

    size, method, refused = sized(len(backends))
    measured = Store.open(store, pin=False) if store is not None else None
    pairs_source = "--pairs-per-shard"
    if pairs_per_shard is None:
        from_store = pairs_per_shard_from_store(measured) if measured is not None else None
        pairs_per_shard = ASSUMED_PAIRS_PER_SHARD if from_store is None else from_store
        pairs_source = f"the plan of {store}" if from_store is not None else "assumed (the clustered synth's)"
    where = probe_dir(output, input)
    if disk_gbps is None:
        disk = measure_disk(where)
    else:
        disk = {"read_gbps": disk_gbps, "write_gbps": disk_gbps, "source": "--disk-gbps"}
    disk["free_bytes"] = free_bytes(where)  # where the store goes: does it fit there?
    assumptions = {"host_ram_bytes": physical_memory(), "gpu_bytes": budgets[0],
                   "pairs_per_shard": round(pairs_per_shard, 3), "pairs_source": pairs_source,
                   "workers": "the projections' workers share this machine's disk: I/O does not scale with them"}
    if measured is not None:
        rates = rates_from_store(measured)
    else:
        c_rows = calibrate_rows or (min(size, GPU_CALIBRATION_ROWS) if on_device else CPU_CALIBRATION_ROWS)
        c_rows = min(c_rows, rows // 2) if vf is not None else c_rows
        sizes = calibration_sizes(c_rows, params.width())
        x, what = sample_rows(vf, 2 * c_rows, dim, dtype)
        # a first run's compile: said, and outside the calibration (its first, untimed calls wait for it)
        backends[0].warm_up(reporter.note, CallShape(dim, str(x.dtype), L2, params))
        with reporter.phase("calibrate", calibration_steps(sizes), "steps") as advance:
            rates = calibrate(backends[0], x, sizes, params, what, advance=advance)
        wide = backends[0].spanning(backends[1:]) if len(backends) > 1 else None
        if wide is not None and build_shards(rows, size, params.width(), method) == 1:  # the build will span
            with reporter.phase("calibrate across GPUs", SPANNING_STEPS, "steps") as advance:
                rates.update(calibrate_spanning(wide, x, sizes, params, len(backends), advance=advance))
        partitioned = [at for at in (sized(w) for w in PROJECTED_WORKERS) if at[1] != "contiguous"]
        if partitioned:  # some plan labels its rows first: time that on the same rows
            at = min(partitioned, key=lambda a: a[0])
            rates.update(time_labelling(backends[0], x, at[1], build_shards(rows, at[0], params.width(), at[1])))
    if "label_timed" in rates:
        assumptions["labelling"] = rates["label_timed"]
    elif measured is not None:
        assumptions["labelling"] = "the store's build had no partition pass: a partitioned plan counts its labelling " \
                                   "as one more read of the input"
    over_fit = bool(budgets[0]) and size > fits_gpu

    def planned(workers: int, at: tuple[int, str, dict | None]) -> dict:
        return plan(rows, dim, itemsize, params, at[0], workers, rates, disk, at[1], pairs_per_shard, assumptions,
                    host_mem, vectors)

    result = planned(len(backends), (size, method, refused))
    result["build_refuses"] = None if refused is None else {**refused, "over_gpu_fit": over_fit}
    result["over_gpu_fit"] = over_fit
    result["projections"] = [projection(result if w == len(backends) else planned(w, sized(w)))
                             for w in PROJECTED_WORKERS]
    return {**result, "backend": backends[0].name, "on_device": on_device, "dtype": dtype}


def projection(p: dict) -> dict:
    """What a projection for another worker count states: its shards, merges, bytes and time."""
    keys = ("workers", "partition", "shards", "shard_rows", "merges", "read_bytes", "written_bytes", "bound",
            "estimate_s", "estimate_h")
    return {key: p[key] for key in keys}


def refusal_of_reference(input: Path | None, method: str, rows: int, shard_rows: int,
                         params: GnndParams) -> str | None:
    """Why ``bigknn build --vectors reference`` refuses this build (as build.py's check does), or None: only
    one flat file's contiguous shards can reference it (the plan has no metric: l2, which keeps rows as
    they are)."""
    if shard_total(rows, shard_rows, params.width()) == 1:
        method = "contiguous"  # one shard: nothing to partition
    suffix = FLAT_SUFFIXES[0] if input is None else Path(input).suffix.lower()
    return refusal(suffix, False, method, True)


def probe_dir(output: Path | None, input: Path | None) -> Path:
    """Where the disk probe goes: the nearest existing directory of the store the build will write, else
    the input's directory, else the current one."""
    if output is not None:
        return next(p for p in (output.absolute(), *output.absolute().parents) if p.is_dir())
    return input.parent if input is not None else Path.cwd()
