"""``bigknn plan``: size a build before starting it: shards, merges, disk, memory, and time.

Time comes from rates measured on this machine (bigknn/operations/calibrate.py): a store's recorded timings
(``--store``: seconds of GNND per shard row, of GGM per merged pair row), or a short calibration run on the
input's own rows (GNND of shards and a merge of two, at two sizes, scaled to the planned shard size along
the power law through them). GNND time grows linearly with shard rows, a merge's with its two shards' rows:

    compute = S * R / gnnd_rate / min(W, S) + merge wall;  merge wall = rounds * 2R / ggm_rate

for S shards of R rows on W workers; a contiguous build merges all S(S-1)/2 pairs in the rounds of
side-by-side merges its Scheduler runs (``merge_rounds``: no two at once share a shard, so 3 shards on 2
GPUs take 3 rounds, not 3 / 2); a partitioned build (bigknn/algorithms/partition/) merges S x pairs-per-shard pairs
(the rate is a store's measured plan, or an assumption the plan states), W at a time. Disk reads and
writes (at measured rates, one disk shared by every worker) overlap with compute, except at the ends: no GPU
starts before its first shard is read (one shard per worker; the whole input for a one-shard build, and a
partitioned build first learns its partition and labels every row in one pass, as slow as the slower of its
read and its labelling, both timed by the calibration: ``labelling_s``), and the last merge's two graphs are
written after it ends, so

    total = max(start + compute + end, I/O)

The I/O is what the build's data path does (bigknn/engine/writer.py): the input read once (twice when
partitioned and too large for host RAM: labelling, then sharding); the store written once: the vectors' copy
(none with --vectors reference), a partitioned store's row ids, each shard's final graph k wide
(``store_bytes``: with the input's read, the disk floor); merges read shards back only where the host cache
cannot hold them all: as many as the build's Scheduler makes a cache of the planned size read, pairs of
cached shards first and the shards pending pairs need least soon dropped first (``replayed_reads``: 61 shards
through 10 cached, all pairs, read 297 shards, not the 1,827 of merges hitting cached shards at random), each
one written at the build's width when it was evicted
unwritten; and checkpoints of the cached graphs while merges change them, only while they stay within a
tenth of the bytes the run must write and of its time (``graph_rewrites``). Every plan is projected to 1, 2,
4 and 8 workers by this same model (bigknn/operations/sizing.py).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from bigknn.backends import device_memory_model
from bigknn.core.knn_graph import id_dtype
from bigknn.core.params import GnndParams
from bigknn.engine.limits import build_refusal, build_shards, smallest_shard_rows
from bigknn.operations.calibrate import rate_at
from bigknn.operations.diskrate import final_write_s
from bigknn.engine.pair_order import pending_pairs, round_count
from bigknn.engine.sharding_pass import shard_total
from bigknn.engine.scheduler import Pair, Scheduler
from bigknn.engine.pending import cache_parts, input_fits_host
from bigknn.engine.writer import checkpoint_allowance, checkpoint_interval, checkpoint_s
from bigknn.shards import Store

CPU_SHARD_ROWS = 1_000_000  # shard size on the CPU backend, where no device memory bounds it
# merges per shard of a partitioned build when no store's plan is at hand: the clustered synth (200K x 96, 17
# shards, recall 0.99) plans 39 pairs (2.3 per shard); data with less locality needs more
ASSUMED_PAIRS_PER_SHARD = 2.3
AUTO_KMEANS_SHARDS = 12  # --partition auto: k-means from this many contiguous shards on (resolve_partition)
SIMULATED_SHARDS = 40  # merge_rounds replays the Scheduler up to this many shards (0.2 s), counts beyond
SIMULATED_PAIRS = 2_000  # merge_reads replays the Scheduler up to this many merges (61 shards' 1,830: seconds)
NEAR_PAIRS_SEED = 0  # of the near pairs a partitioned plan draws (near_pairs)


def pairs_per_shard_from_store(store: Store) -> float | None:
    """Merges per shard of a partitioned store's committed plan (None: contiguous, or not planned yet)."""
    m = store.manifest
    return len(m.pairs) / len(m.shards) if m.partition is not None and m.pairs is not None else None


def plan(rows: int, dim: int, itemsize: int, params: GnndParams, shard_rows: int, workers: int, rates: dict,
         disk: dict, partition: str = "contiguous", pairs_per_shard: float = ASSUMED_PAIRS_PER_SHARD,
         assumptions: dict | None = None, host_mem: int | None = None, vectors: str = "copy") -> dict:
    """The plan of a build; ``disk``: {"read_gbps", "write_gbps", "source"} (diskrate.measure_disk);
    ``assumptions``: what else it rests on (host RAM, GPU memory, where pairs-per-shard came from), reported;
    ``host_mem``: the host cache's bytes (``--host-mem``; default half this machine's RAM); ``vectors``: the
    build's --vectors (``reference``: the store writes no copy of the rows)."""
    width = params.width()
    shards = build_shards(rows, shard_rows, width, partition)  # as many as the build makes
    partitioned = partition != "contiguous" and shards > 1
    if not partitioned:
        merges = shards * (shards - 1) // 2
    else:
        merges = min(shards * (shards - 1) // 2, math.ceil(shards * pairs_per_shard))
    r = math.ceil(rows / shards)
    row_bytes = dim * itemsize
    shard_bytes = r * (row_bytes + width * 8)  # in the host cache, as the build sizes it (pending.cache_shards)
    entry = id_dtype(rows).itemsize + 4  # one list entry (id, distance), in memory and on disk
    wide_graph = r * width * entry  # a shard's graph while merges change it: what checkpoints and evictions write
    gnnd_rate, ggm_rate = rate_at(rates, "gnnd", r), rate_at(rates, "ggm", r)
    spans = shards == 1 and workers > 1 and rates.get("spanning_gpus") == workers
    if spans:  # measured across these GPUs, scaled to the shard along the one-GPU GNND's power law
        gnnd_rate = rates["spanning_gnnd_rows_per_s"] * gnnd_rate / rate_at(rates, "gnnd", rates["spanning_at_rows"])
    gnnd_s = shards * r / gnnd_rate
    merge_s = 2 * r / ggm_rate  # one merge of two shards
    merge_wall = (merge_rounds(shards, workers) * merge_s if not partitioned
                  else merges * merge_s / workers)
    gnnd_wall = gnnd_s / min(workers, shards)  # one shard's GNND runs on one worker
    compute_s = gnnd_wall + merge_wall
    # a partitioned build labels every row first, then shards them: from RAM where the input fits the host budget
    kept = not partitioned or input_fits_host(rows * row_bytes, host_mem)
    input_bytes = rows * row_bytes
    cached = cache_parts(shard_bytes, workers, host_mem)
    held = min(cached, shards)
    misses, misses_how = merge_reads(shards, merges, cached, partitioned, workers)
    store = store_bytes(rows, dim, itemsize, params.k, vectors, partitioned)
    read_bps, write_bps = disk["read_gbps"] * 1e9, disk["write_gbps"] * 1e9
    copied_bytes = 0 if vectors == "reference" else rows * row_bytes  # as the writer's must_write counts them
    rewrites = graph_rewrites(merges, held, misses, wide_graph, compute_s - r / gnnd_rate, write_bps,
                              copied_bytes + rows * params.k * entry)
    read_bytes = (1 if kept else 2) * input_bytes + misses * (r * row_bytes + wide_graph)
    written_bytes = store["total"] + rewrites
    io_s = read_bytes / read_bps + written_bytes / write_bps
    # no GPU starts before its first shard is read (the whole input, for one shard), nor a partitioned build's
    # before its partition is learnt and its labelling pass has read and labelled every row
    start_s = (0 if not partitioned else labelling_s(rows, input_bytes / read_bps, rates)) + (
        0 if partitioned and kept else min(workers, shards) * r * row_bytes / read_bps)
    end_s = final_write_s((2 if merges else 1) * r * params.k * entry, disk)  # the last merge's graphs (or the GNND's)
    total_s = max(start_s + compute_s + end_s, io_s)
    floor_s = input_bytes / read_bps + store["total"] / write_bps
    return {
        "rows": rows, "dim": dim, "k": params.k, "list_width": width, "partition": partition, "shards": shards,
        "shard_rows": r, "merges": merges, "all_pairs": shards * (shards - 1) // 2,
        "rounds": round_count(shards), "workers": workers, "vectors": vectors,
        "disk_bytes": store["total"], "store_bytes": store, "cached_shards": held,
        "host_bytes_per_worker": 2 * shard_bytes, "host_bytes_total": (2 * workers + 2) * shard_bytes,
        "gpu_bytes_per_worker": merge_gpu_bytes(r, dim, itemsize, params) if shards > 1 else
        device_memory_model().whole_bytes(r, dim, itemsize, params),  # one shard: its GNND, no merge
        "io_bytes": round(read_bytes + written_bytes), "read_bytes": round(read_bytes),
        "written_bytes": round(written_bytes), "rewritten_bytes": round(rewrites), "merge_reads": round(misses),
        "disk_floor": {"read_bytes": input_bytes, "written_bytes": store["total"], "s": round(floor_s, 1)},
        "bound": "disk" if io_s >= start_s + compute_s + end_s else "compute",
        "estimate_s": {"start": round(start_s, 1), "gnnd": round(gnnd_wall, 1), "ggm": round(merge_wall, 1),
                       "end": round(end_s, 1), "io": round(io_s, 1), "total": round(total_s, 1)},
        "estimate_h": round(total_s / 3600, 2),
        "rates": {**planned_rates(rates, r, gnnd_rate, ggm_rate), "gnnd_spans_gpus": workers if spans else None},
        "assumptions": {"disk": disk, "merge_reads": misses_how, **(assumptions or {})},
    }


def labelling_s(rows: int, read_s: float, rates: dict) -> float:
    """A partitioned build's time before its first GNND: learning the partition, then one pass over the input
    that reads it and labels its rows at once (as fast as the slower of the two); the read alone where the
    rates have no labelling timed."""
    label_rate = rates.get("label_rows_per_s")
    return rates.get("learn_s", 0.0) + max(read_s, rows / label_rate if label_rate else 0.0)


def store_bytes(rows: int, dim: int, itemsize: int, k: int, vectors: str, partitioned: bool) -> dict:
    """What the finished store holds, each written once by the build: the rows' copy (none with ``--vectors
    reference``: the store reads the input's own bytes), a partitioned store's input row numbers (int64), and
    the final graph, k wide (ids in the store's id dtype, float32 distances)."""
    parts = {"vectors": 0 if vectors == "reference" else rows * dim * itemsize,
             "row_ids": rows * 8 if partitioned else 0,
             "graph": rows * k * (id_dtype(rows).itemsize + 4)}
    return {**parts, "total": sum(parts.values())}


def graph_rewrites(merges: int, held: int, misses: float, wide_graph: int, after_first_s: float, write_bps: float,
                   must_write: int) -> float:
    """Bytes of graphs written before they are final, as the build's Writer writes them: each shard read back
    for a merge was evicted unwritten, so written once at the build's width first (the cache's pressure);
    and checkpoints, each of the ``held`` cached graphs, due every interval after the first GNND result
    (``after_first_s`` of compute follow it) and only while their writes stay within the allowance of
    CHECKPOINT_SHARE of the bytes the run must write (``must_write``: vectors and final graphs; evictions spend
    it first) and of its time (writer.checkpoint_interval). At most two writes a merge: one per result."""
    evicted = misses * wide_graph
    per_checkpoint = held * wide_graph
    interval = checkpoint_interval(checkpoint_s(), per_checkpoint / write_bps)
    checkpoints = int(max(0.0, after_first_s) // interval) if interval > 0 else merges
    allowance = checkpoint_allowance(must_write)
    if allowance is not None and per_checkpoint > 0:
        checkpoints = min(checkpoints, int(max(0.0, allowance - evicted) // per_checkpoint))
    return min(checkpoints * per_checkpoint + evicted, 2 * merges * wide_graph)


def planned_shards(rows: int, shard_rows: int | None, fits: int, workers: int, width: int,
                   partition: str) -> tuple[int, str, dict | None]:
    """(shard rows, partition, what build refuses or None) of the plan of a build on ``workers`` workers: the
    --shard-rows given, or the automatic size (``automatic_shards`` of ``fits``, as build picks it); where
    build refuses the size given, the smallest it takes (``fitting_shard_rows``)."""
    asked, method = (shard_rows, partition) if shard_rows is not None else automatic_shards(
        rows, fits, workers, width, partition)
    method = resolve_partition(method, rows, asked, width)
    planned, refusal = fitting_shard_rows(rows, asked, width, method)
    refused = None if refusal is None else {"shard_rows": asked, "why": refusal, "planned_shard_rows": planned}
    return min(planned, rows), method, refused


def fitting_shard_rows(rows: int, shard_rows: int, width: int, partition: str) -> tuple[int, str | None]:
    """The --shard-rows to plan with: ``shard_rows``, or where ``bigknn build`` would refuse it, the smallest it
    takes, with the reason it refuses ``shard_rows`` (a plan never proposes a build that build refuses)."""
    refusal = build_refusal(rows, shard_rows, width, partition)
    if refusal is None:
        return shard_rows, None
    return max(shard_rows, smallest_shard_rows(rows, width, partition)), refusal


def merge_reads(shards: int, merges: int, cached: int, partitioned: bool, workers: int) -> tuple[float, str]:
    """Shards the merges read back from the store, and how they were counted (stated in the plan's assumptions):
    none where the cache holds every shard; else the replay of the build's own order (``replayed_reads``),
    which reads far fewer than merges hitting cached shards at random; that (merges x 2 x the share not
    cached) only beyond SIMULATED_PAIRS merges, where the replay's cost (merges^2) would hold the plan up."""
    if cached >= shards:
        return 0.0, "every shard cached: nothing read back"
    if merges > SIMULATED_PAIRS:
        return merges * 2 * (1 - cached / shards), (
            f"over {SIMULATED_PAIRS:,} merges: counted as random cache hits (merges x 2 x the share not cached), "
            "not replayed; the build, cached pairs first, reads fewer")
    pairs = near_pairs(shards, merges) if partitioned else pending_pairs(shards, set())
    how = (f"the build's Scheduler (pairs of cached shards first) replayed through a cache of {cached} shards "
           "that drops those its pending pairs need least soon first, one worker, after every GNND")
    if workers > 1:
        how += f"; {workers} workers take pairs as merges end: replayed as one"
    if partitioned:
        how += "; near pairs drawn at random (real ones cluster: fewer reads)"
    return float(replayed_reads(pairs, shards, cached)), how


def near_pairs(shards: int, merges: int) -> list[Pair]:
    """A partitioned build's pairs as the plan models them: ``merges`` pairs drawn at random (seeded: a plan
    is repeatable), in the order the build hands them to its Scheduler (Ledger.todo_pairs: the schedule's,
    the unplanned left out). Which pairs are near is the data's; a partition's shard numbers say nothing of
    it, and random pairs share fewer shards than near ones, so they count reads on the safe side."""
    every = pending_pairs(shards, set())
    keep = set(np.random.default_rng(NEAR_PAIRS_SEED).choice(len(every), merges, replace=False).tolist())
    return [p for n, p in enumerate(every) if n in keep]


def replayed_reads(pairs: list[Pair], shards: int, cached: int) -> int:
    """Shards read while one worker merges ``pairs`` (given in the build's order) through a cache of
    ``cached`` shards, each next pair chosen by the build's Scheduler told what the cache holds (as the build
    tells it where the cache is smaller than the store): its order, not a copy of it. The merges start with
    the last ``cached`` GNND results cached (a partitioned build plans its pairs after every GNND; GNND goes
    first whenever a shard waits for it). The cache drops shards in the Scheduler's eviction order, as the
    build's does (ShardCache.eviction_order); its prefetching and its dirty shards held past capacity are
    left out."""
    lru = OrderedDict.fromkeys(range(shards - cached, shards))
    sched = Scheduler(pairs, ready=range(shards), held=lru.__contains__)
    reads, last = 0, set()
    while (task := sched.next_task(prefer=last)) is not None:
        pair = task[1]
        for sid in pair:  # the merge touches its pair (ShardCache.touch), then reads what is missing
            if sid in lru:
                lru.move_to_end(sid)
        for sid in pair:
            if sid not in lru:
                reads += 1
                lru[sid] = None
                while len(lru) > cached:  # a cache of one shard drops the merge's other shard
                    order = sched.eviction_order(list(lru), set(lru)) or list(lru)
                    del lru[order[0]]
        sched.release(pair)
        last = set(pair)
    return reads


def planned_rates(rates: dict, shard_rows: int, gnnd_rate: float, ggm_rate: float) -> dict:
    """The plan's "rates": those it used (at its shard size) and what they came from: the measured rates
    (at ``measured_at_rows``), each calibration size's, and the exponents that scaled them."""
    measured = {f"measured_{k}": round(rates[k]) for k in ("gnnd_rows_per_s", "ggm_rows_per_s")}
    exponents = {k: None if rates.get(k) is None else round(rates[k], 3) for k in ("gnnd_exponent", "ggm_exponent")}
    return {"source": rates.get("source", "given"), "gnnd_rows_per_s": round(gnnd_rate),
            "ggm_rows_per_s": round(ggm_rate), "at_rows": shard_rows, **measured,
            "measured_at_rows": rates.get("at_rows"), **exponents,
            "points": [{k: round(v) for k, v in p.items()} for p in rates.get("points", [])],
            **{k: round(rates[k], 3) for k in ("label_rows_per_s", "learn_s") if k in rates},
            **{k: round(rates[k]) for k in ("spanning_gnnd_rows_per_s", "spanning_gpus", "spanning_at_rows")
               if k in rates}}


def merge_gpu_bytes(shard_rows: int, dim: int, itemsize: int, params: GnndParams) -> int:
    """Device bytes of one GGM of two shards of ``shard_rows`` rows, as the device backend plans it (its
    MemoryModel: bigknn/backends/base.py)."""
    return device_memory_model().merge_bytes(shard_rows, dim, itemsize, params)


def largest_shard_rows(gpu_bytes: int, dim: int, itemsize: int, params: GnndParams) -> int:
    """The biggest shard whose merge (two shards at once) fits ``gpu_bytes``."""
    fixed = merge_gpu_bytes(0, dim, itemsize, params)
    per_row = (merge_gpu_bytes(1 << 20, dim, itemsize, params) - fixed) / (1 << 20)
    return max(params.width() + 1, int((gpu_bytes - fixed) // per_row))


def auto_shard_rows(backends, dim: int, itemsize: int, params: GnndParams, gpu_mem: int | None = None,
                    rows: int | None = None) -> int:
    """Rows per shard when the user gives none: all ``rows`` where one GNND of them fits every GPU's budget
    (what is free, capped by ``--gpu-mem``), or fits them with its lists spread over the GPUs where the
    backends can span them (Backend.spanning): one shard, no merge, which no schedule of merges beats; else the
    largest shard whose merge fits. Without a GPU: sized for ``gpu_mem`` when given (planning a GPU job on
    another machine), else CPU_SHARD_ROWS."""
    budgets = [budget for b in backends if (budget := b.memory_budget()) is not None]
    if not budgets and gpu_mem:
        budgets = [gpu_mem]
    if not budgets:
        return CPU_SHARD_ROWS
    model = device_memory_model()
    if rows is not None and model.whole_bytes(rows, dim, itemsize, params) <= min(budgets):
        return rows
    spans = len(budgets) > 1 and backends[0].spanning(backends[1:]) is not None
    if rows is not None and spans and model.spanning_bytes(rows, dim, itemsize, params, len(budgets)) <= min(budgets):
        return rows
    return largest_shard_rows(min(budgets), dim, itemsize, params)


def merge_rounds(shards: int, workers: int) -> int:
    """Rounds of side-by-side merges the pipeline's Scheduler runs for all pairs of ``shards`` ready shards,
    ``workers`` taking a free pair at a time (merges of equal length): shards - 1 rounds of one merge each
    make a single worker's, fewer of several merges make a multi-GPU run's. Replayed on the Scheduler up to
    SIMULATED_SHARDS shards (its cost grows as shards^4: 300 shards took 7 minutes); beyond, where nearly every
    round is full, the rounds of full ones."""
    pairs = shards * (shards - 1) // 2
    if workers < 2 or shards > SIMULATED_SHARDS:
        return -(-pairs // max(1, min(workers, shards // 2)))
    sched = Scheduler(pending_pairs(shards, set()), ready=range(shards))  # in the build's order
    rounds = 0
    while sched.pending:
        taken = []
        while len(taken) < workers and sched.has_free_pair():
            taken.append(sched.next_task(prefer=set())[1])
        for pair in taken:
            sched.release(pair)
        rounds += 1
    return rounds


def all_pairs_merge_cost(shards: int, workers: int) -> float:
    """Wall time of an all-pairs merge schedule in merges of the whole input's size: its rounds, each merging
    2 / ``shards`` of the input. One worker: shards - 1, so one GPU wants the fewest shards."""
    return merge_rounds(shards, workers) * 2 / shards if shards > 1 else 0.0


def resolve_partition(method: str, rows: int, shard_rows: int, width: int) -> str:
    """The partition a build of ``rows`` rows at ``shard_rows`` runs for ``method``: itself, or for ``auto``
    k-means once the contiguous build would make AUTO_KMEANS_SHARDS shards, else contiguous. Fewer shards
    save no merges by partitioning: pairs.choose_pairs takes every pair once more than ALL_PAIRS_FRACTION of
    them are needed, which ASSUMED_PAIRS_PER_SHARD near pairs per shard are below that count, and a
    partitioned build starts no GNND before its labelling pass ends (docs/perf-notes.md: 50M x 96 in 3-4
    shards on one GPU). From there on near pairs grow with the shards, all pairs with their square."""
    if method != "auto":
        return method
    return "kmeans" if shard_total(rows, shard_rows, width) >= AUTO_KMEANS_SHARDS else "contiguous"


def automatic_shards(rows: int, fits: int, workers: int, width: int, method: str) -> tuple[int, str]:
    """(--shard-rows, partition) of a build whose shard size is automatic: ``fits`` (the largest shard the
    device takes), spread over ``workers`` for a contiguous build (``spread_for_workers``), the partition
    resolved at that size (``resolve_partition``); never smaller than the build accepts (limits.MAX_MERGES),
    so that no default build is refused (where that is larger than ``fits``, no shard that fits is accepted:
    ``bigknn plan`` says so)."""
    method = resolve_partition(method, rows, fits, width)
    size = spread_for_workers(rows, fits, workers) if method == "contiguous" else fits
    return max(size, smallest_shard_rows(rows, width, method)), method


def spread_for_workers(rows: int, shard_rows: int, workers: int) -> int:
    """The automatic shard size of a contiguous build on ``workers`` GPUs: ``shard_rows`` (the largest that
    fits) unless a few more, smaller shards let merges run side by side sooner. Three shards merge one pair at
    a time (any two of their pairs share a shard: 50M x 96 on 1, 2 and 4 H200s took 80, 76 and 77 s); four
    merge two at once, in 3 rounds of half the size: 1.5 input-sized merges of wall instead of 2."""
    least = max(1, -(-rows // shard_rows))
    if workers < 2:
        return shard_rows
    best = min(range(least, least + workers + 1), key=lambda s: (all_pairs_merge_cost(s, workers), s))
    return shard_rows if best == least else -(-rows // best)
