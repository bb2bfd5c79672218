#!/usr/bin/env bash
# One device call for the GPU acceptance runs; each step logs under $OUT and a table is printed last.
#   STEPS="t2 t2shards plan t4 t3 kill tests sanitizer t1 cli5m" bash scripts/gpu_acceptance.sh
# The public API against CAGRA (issue 37): STEPS="searchapi"; the recall promise over seeds (issue 36): STEPS="coverage".
# On the 2-GPU machine (issues 12 and 14): STEPS="dask10m big50 big100" (inputs by scripts/synth_parallel.sh);
# the largest build its disk holds (issue 35): GPUS=all STEPS="big250"; the memory model against the calls: STEPS="memmodel".
# Every family against cuVS (issue 10): STEPS="families"; 50M on 1 / 2 / all GPUs (issue 17): STEPS="scale".
# Two 25M stores merged against the 50M build (issue 39, item 3): GPUS=all STEPS="mergestores" (x4 machine).
# Needs: PYTHONPATH with bigknn and zarr (see README), a GPU. Data goes to $WORK (default /tmp/bk).
set -uo pipefail
OUT=${OUT:-/tmp/bk-out}; WORK=${WORK:-/tmp/bk}; mkdir -p "$OUT" "$WORK"
STEPS=${STEPS:-"t2 t2shards plan t4 t3 kill tests sanitizer t1 cli5m"}
GPUS=${GPUS:-0}
T2_ARGS=${T2_ARGS:-}  # build options of the T2 / T3 / kill runs (T2 itself: defaults)
CLI5M_ARGS=${CLI5M_ARGS:---list-width 48 --samples 16 --iters 18}  # shard size: automatic
T4_ARGS=${T4_ARGS:-}
PLAN_ARGS=${PLAN_ARGS:-}  # T7
B="python3 -m bigknn"
summary="$OUT/summary.txt"; : > "$summary"
note() { echo "$*" | tee -a "$summary"; }
step() { echo "=== $1 $(date +%T)" ; }
j() { python3 -c "import json,sys; d=json.load(sys.stdin); print(' '.join(f'{k}={d[k]}' for k in sys.argv[1:] if k in d))" "$@"; }

for s in $STEPS; do case $s in
tests)
  step tests
  python3 -m pytest -m gpu -q -rf tests/ 2>&1 | tee "$OUT/pytest_gpu.log" | grep -E "^(FAILED|ERROR)|passed|failed|assert" | tail -12
  note "pytest -m gpu: $(tail -1 "$OUT/pytest_gpu.log")" ;;
sanitizer)
  step sanitizer
  compute-sanitizer --tool memcheck --error-exitcode 9 python3 - > "$OUT/memcheck.log" 2>&1 <<'PY'
import numpy as np
from bigknn.backends.cuda import CudaBackend
from bigknn.core.knn_graph import ShardPart
from bigknn.core.knn_graph import KnnGraph
from bigknn.core.metric import IP, L2
from bigknn.core.params import GnndParams
from bigknn.core.synth import synth
# shards of more than EXACT_ROWS (2048) rows, so gnnd runs the NN-descent kernels, not the exact path
x = synth(5201, 100, seed=3); be = CudaBackend(); p = GnndParams(k=10, iters=4, merge_iters=3)
ga = be.gnnd(x[:2600], L2, p, 0); gb = be.gnnd(x[2600:], L2, p, 1)
assert be.last_stats.get("iters_run"), "gnnd took the exact path"
gb = KnnGraph(np.where(gb.ids >= 0, gb.ids + 2600, -1).astype(np.int32), gb.dists)
ma, mb = be.ggm(ShardPart(0, x[:2600], ga), ShardPart(2600, x[2600:], gb), L2, p, 2)
# a seeded merge (an ingest's): a batch of 601 rows (d 100, not a multiple of 32) into shard c through a
y = synth(3101, 100, seed=4); gc = be.gnnd(y[:2500], L2, p, 5); gn = be.gnnd(y[2500:], L2, p, 6)
gc = KnnGraph(np.where(gc.ids >= 0, gc.ids + 5201, -1).astype(np.int32), gc.dists)
gn = KnnGraph(np.where(gn.ids >= 0, gn.ids + 7701, -1).astype(np.int32), gn.dists)
sa, sn = be.ggm(ShardPart(0, x[:2600], ma), ShardPart(7701, y[2500:], gn), L2, p, 7)
be.ggm(ShardPart(5201, y[:2500], gc), ShardPart(7701, y[2500:], sn), L2, p, 8, vias=[ShardPart(0, x[:2600], sa)])
assert be.last_stats["seeded"]
be.gnnd(x[:2600].astype(np.uint8), IP, GnndParams(k=40, iters=3), 4)
be.exact_knn(x[:37], 11, L2, [(0, x[:2000]), (2000, x[2000:])])
print("memcheck workload done")
PY
  note "compute-sanitizer memcheck exit=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)" ;;
searchapi)
  # issue 37: bigknn through its public API (index.search, Graph.search, bigknn search) against CAGRA in the same
  # process; SEARCHAPI_INPUTS: families of scripts/families.py or FILE:METRIC (cuVS on PYTHONPATH for CAGRA)
  step searchapi
  for inp in ${SEARCHAPI_INPUTS:-u8}; do
    python3 scripts/bench_search_api.py "$inp" --rows ${SEARCHAPI_ROWS:-1000000} --work $WORK/api \
      --out "$OUT/search_api.jsonl" > "$OUT/search_api_$(basename "${inp%%:*}").log" 2>&1
    note "searchapi $inp: exit $? $(tail -1 "$OUT/search_api.jsonl" | cut -c1-400)"
  done ;;
coverage)
  # issue 36: the recall promise over seeds through bigknn.build (COVERAGE_ARGS: rows, seeds, families, --text)
  step coverage
  python3 scripts/bench_coverage.py --backend cuda ${COVERAGE_ARGS:---rows 200000 --seeds 20} \
    > "$OUT/coverage.jsonl" 2> "$OUT/coverage.log"
  note "coverage: exit $? $(tail -1 "$OUT/coverage.jsonl" | cut -c1-600)" ;;
t1)
  step t1
  python3 scripts/bench_gnnd.py --workloads t1 --iters 18 --samples 16 --list-width 48 > "$OUT/t1.jsonl" 2>&1
  python3 scripts/bench_gnnd.py --workloads t1default > "$OUT/t1default.jsonl" 2>&1
  note "T1 p16/w48/18it: $(tail -1 "$OUT/t1.jsonl" | j time_s recall@10)"
  note "T1 defaults:     $(tail -1 "$OUT/t1default.jsonl" | j time_s recall@10 iters_run)" ;;
search)
  # issue 15: the search kernels against the CPU reference, then the recall-vs-QPS run against CAGRA (needs cuVS
  # on PYTHONPATH for CAGRA; without it bigknn's curves only). SEARCH_INPUTS adds FILE:METRIC inputs (text).
  step search
  python3 -m pytest -m gpu -q -rf tests/test_gpu_search.py tests/test_gpu_prune.py > "$OUT/pytest_gpu_search.log" 2>&1
  note "pytest -m gpu (search, prune): $(tail -1 "$OUT/pytest_gpu_search.log")"
  [ -f $WORK/synth_q.fbin ] || python3 scripts/families.py synth -o $WORK/synth_q.fbin --rows 1010000 > /dev/null
  python3 scripts/bench_search.py $WORK/synth_q.fbin:l2 ${SEARCH_INPUTS:-} --work $WORK/search \
    --batch1-seconds 2 --out "$OUT/search.jsonl" > "$OUT/search.log" 2>&1
  note "search: $(grep -c '"workload"' "$OUT/search.jsonl") measurements in search.jsonl; $(tail -1 "$OUT/search.log" | cut -c1-200)" ;;
cli5m)
  step cli5m
  $B synth $WORK/d5m.fbin --rows 5000000 --dim 96 --json > /dev/null
  $B build $WORK/d5m.fbin -o $WORK/d5m.knn --k 32 $CLI5M_ARGS --backend cuda --json > "$OUT/cli5m_build.json"
  $B eval recall $WORK/d5m.knn --backend cuda --json > "$OUT/cli5m_eval.json"
  note "5M CLI build: $(j shards wall_s phase_s phase_wall_s < "$OUT/cli5m_build.json")"
  note "5M eval:      $(j recall exact_s wall_s < "$OUT/cli5m_eval.json")" ;;
t2)
  step t2
  $B synth $WORK/d10m.fbin --rows 10000000 --dim 96 --seed 1 --json > /dev/null
  # the kernels compiled once (CuPy's cache), as on any machine after its first build: ~2.4 s on a fresh one
  $B synth $WORK/warm.fbin --rows 200000 --dim 96 --json > /dev/null
  $B build $WORK/warm.fbin -o $WORK/warm.knn --k 32 --backend cuda --gpus $GPUS --json > /dev/null; rm -rf $WORK/warm.knn
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  /usr/bin/time -v $B build $WORK/d10m.fbin -o $WORK/t2.knn --k 32 $T2_ARGS --backend cuda --gpus $GPUS --json \
     > "$OUT/t2_build.json" 2> "$OUT/t2_time.log"
  $B eval recall $WORK/t2.knn --backend cuda --json > "$OUT/t2_eval.json"
  note "T2 build: $(j wall_s phase_s phase_wall_s busy_frac read_gb written_gb < "$OUT/t2_build.json")"
  note "T2 eval (T5 10K x 10M): $(j recall exact_s wall_s < "$OUT/t2_eval.json")"
  note "T2 peak RSS: $(grep 'Maximum resident' "$OUT/t2_time.log")" ;;
t3)
  step t3  # T3: the 10-shard build on every GPU, against t2shards
  [ -f $WORK/d10m.fbin ] || $B synth $WORK/d10m.fbin --rows 10000000 --dim 96 --seed 1 --json > /dev/null
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  $B build $WORK/d10m.fbin -o $WORK/t3.knn --k 32 --shard-rows 1000000 $T2_ARGS --backend cuda --gpus all --json \
     > "$OUT/t3_build.json"
  $B eval recall $WORK/t3.knn --backend cuda --json > "$OUT/t3_eval.json"
  note "T3 build (--gpus all): $(j wall_s phase_s phase_wall_s busy_frac read_gb written_gb < "$OUT/t3_build.json")"
  note "T3 eval: $(j recall < "$OUT/t3_eval.json")" ;;
t2shards)
  step t2shards  # T2's set in 10 shards of 1M on one GPU: the out-of-core schedule, T3's baseline, T7's rates
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  $B build $WORK/d10m.fbin -o $WORK/t2shards.knn --k 32 --shard-rows 1000000 $T2_ARGS --backend cuda --gpus $GPUS \
     --json > "$OUT/t2shards_build.json"
  $B eval recall $WORK/t2shards.knn --backend cuda --json > "$OUT/t2shards_eval.json"
  note "T2 in 10 shards: $(j wall_s phase_wall_s busy_frac < "$OUT/t2shards_build.json") $(j recall < "$OUT/t2shards_eval.json")" ;;
t4)
  step t4
  # new rows of the T2 set's own distribution (same seed: same clusters), as a daily ingest brings
  $B synth $WORK/new100k.fbin --rows 100000 --dim 96 --seed 1 --first-row 10000000 --json > /dev/null
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null  # a daily cron ingest finds the store cold
  $B ingest $WORK/t2.knn --input $WORK/new100k.fbin --backend cuda --gpus $GPUS $T4_ARGS --json > "$OUT/t4_ingest.json"
  $B eval recall $WORK/t2.knn --backend cuda --rows 0:10000000 --sample 10000 --json > "$OUT/t4_old.json"
  $B eval recall $WORK/t2.knn --backend cuda --rows 10000000:10100000 --sample 10000 --json > "$OUT/t4_new.json"
  note "T4 ingest (T2 build took $(j wall_s < "$OUT/t2_build.json")): $(j wall_s phase_s < "$OUT/t4_ingest.json")"
  note "T4 recall old: $(j recall < "$OUT/t4_old.json") new: $(j recall < "$OUT/t4_new.json")" ;;
plan)
  step plan
  $B plan --rows 1000000000 --dim 96 --k 32 $PLAN_ARGS --store $WORK/t2shards.knn --backend cuda --json > "$OUT/t7_plan.json"
  note "T7 plan 1B x 96 (rates of the 10-shard T2 store): $(j shards shard_rows merges estimate_s estimate_h < "$OUT/t7_plan.json")" ;;
dask10m)
  step dask10m  # T2's 10 shards in-process (--gpus all) against --scheduler local:N, same recall
  [ -f $WORK/d10m.fbin ] || $B synth $WORK/d10m.fbin --rows 10000000 --dim 96 --seed 1 --json > /dev/null
  python3 scripts/bench_dask.py --input $WORK/d10m.fbin --store-base $WORK/bench --workload t2-10m \
    -- --k 32 --shard-rows 1000000 > "$OUT/dask10m.jsonl" 2> "$OUT/dask10m.err"
  note "Dask vs in-process, T2: $(tr '\n' ' ' < "$OUT/dask10m.jsonl" | cut -c1-900)" ;;
big50)
  step big50  # 50M x 96, defaults, both GPUs, in-process and on Dask (each store deleted once measured)
  [ -f $WORK/d50m.fbin ] || bash scripts/synth_parallel.sh $WORK/d50m.fbin 50000000 96 2 > /dev/null
  python3 scripts/bench_dask.py --input $WORK/d50m.fbin --store-base $WORK/bench --workload 50m \
    -- --k 32 > "$OUT/big50.jsonl" 2> "$OUT/big50.err"
  note "50M: $(tr '\n' ' ' < "$OUT/big50.jsonl" | cut -c1-900)"
  rm -f $WORK/d50m.fbin ;;
mergestores)
  # issue 39 item 3: two 25M x 96 stores built apart from the halves of one 50M set, merged (`bigknn merge STORE
  # OTHER`), against the build of the whole, page cache dropped before each; target: the merge <= 40 % of the
  # build's time, recall >= 0.99 over all rows and over each half. Needs ~130 GB of disk (the x4 machine).
  step mergestores
  M=$WORK/m50; mkdir -p $M
  [ -f $M/h1.fbin ] || bash scripts/synth_parallel.sh $M/h1.fbin 25000000 96 2 > /dev/null
  [ -f $M/h2.fbin ] || FIRST_ROW=25000000 bash scripts/synth_parallel.sh $M/h2.fbin 25000000 96 2 > /dev/null
  rm -rf $M/h1.knn $M/h2.knn $M/whole.knn
  for h in h1 h2; do $B build $M/$h.fbin -o $M/$h.knn --k 32 --gpus $GPUS --json > "$OUT/ms_$h.json"; done
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  $B build "$M/h*.fbin" -o $M/whole.knn --k 32 --gpus $GPUS --json > "$OUT/ms_whole.json" 2> "$OUT/ms_whole.err"
  $B eval recall $M/whole.knn --backend cuda --json > "$OUT/ms_whole_eval.json"
  rm -rf $M/whole.knn
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  $B merge $M/h1.knn $M/h2.knn --gpus $GPUS --json > "$OUT/ms_merge.json" 2> "$OUT/ms_merge.err"
  $B eval recall $M/h1.knn --backend cuda --json > "$OUT/ms_merge_eval.json"
  $B eval recall $M/h1.knn --backend cuda --rows 0:25000000 --sample 10000 --json > "$OUT/ms_merge_h1.json"
  $B eval recall $M/h1.knn --backend cuda --rows 25000000:50000000 --sample 10000 --json > "$OUT/ms_merge_h2.json"
  note "50M build: $(j wall_s shards merges_done < "$OUT/ms_whole.json") recall $(j recall < "$OUT/ms_whole_eval.json")"
  note "25M halves built: $(j wall_s shards < "$OUT/ms_h1.json") / $(j wall_s shards < "$OUT/ms_h2.json")"
  note "merge of the halves: $(j wall_s merges_run phase_s < "$OUT/ms_merge.json") recall $(j recall < "$OUT/ms_merge_eval.json") (first half $(j recall < "$OUT/ms_merge_h1.json"), second $(j recall < "$OUT/ms_merge_h2.json"))"
  rm -rf $M ;;
big100)
  step big100  # the measured 100M-row build: plan's projection, then the build and its recall
  [ -f $WORK/d100m.u8bin ] || bash scripts/synth_parallel.sh $WORK/d100m.u8bin 100000000 128 7 > /dev/null
  $B plan $WORK/d100m.u8bin --k 32 --gpus all --json > "$OUT/big100_plan.json"
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  $B build $WORK/d100m.u8bin -o $WORK/d100m.knn --k 32 --gpus all --json > "$OUT/big100_build.json" 2> "$OUT/big100_build.err"
  $B eval recall $WORK/d100m.knn --backend cuda --json > "$OUT/big100_eval.json"
  note "100M plan: $(j shards shard_rows merges estimate_s < "$OUT/big100_plan.json")"
  note "100M build: $(j wall_s shards merges_done busy_frac read_gb written_gb < "$OUT/big100_build.json") recall $(j recall < "$OUT/big100_eval.json")" ;;
big250)
  # issue 35: the largest set the 2-GPU machine's disk (128 GB) holds, 250M x 64 uint8 (16 GB in, a 64 GB graph):
  # the plan's projection, then the build with the page cache dropped, its recall, and the disk's rates beside it
  step big250
  [ -f $WORK/d250m.u8bin ] || bash scripts/synth_parallel.sh $WORK/d250m.u8bin 250000000 64 7 > /dev/null
  $B plan $WORK/d250m.u8bin --k 32 --gpus $GPUS --json > "$OUT/big250_plan.json" 2> "$OUT/big250_plan.err"
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  $B build $WORK/d250m.u8bin -o $WORK/d250m.knn --k 32 --gpus $GPUS --json > "$OUT/big250_build.json" 2> "$OUT/big250_build.err"
  $B eval recall $WORK/d250m.knn --backend cuda --sample 10000 --json > "$OUT/big250_eval.json"
  note "250M plan: $(j shards shard_rows merges estimate_s < "$OUT/big250_plan.json")"
  note "250M build: $(j wall_s shards merges_done busy_frac read_gb written_gb < "$OUT/big250_build.json") recall $(j recall < "$OUT/big250_eval.json")"
  rm -rf $WORK/d250m.knn ;;
memmodel)
  # issue 35: what GNND and GGM allocate against what they planned, at the 250M build's row shape (64 x uint8)
  step memmodel
  python3 scripts/gpu_memory_model.py --rows ${MEM_ROWS:-1000000,4000000,8000000} --dim 64 --dtype uint8 \
    > "$OUT/memmodel.txt" 2>&1
  tail -10 "$OUT/memmodel.txt" | tee -a "$summary" ;;
families)
  # issue 10: T1 on every family in GPU memory (cuVS NN-Descent / brute force in the same process where
  # /tmp/cuvs_site holds cuVS: ../shared/device/cuvs.sh), then out of core (4 shards of 250K), estimate vs eval
  step families
  F=$WORK/fam; mkdir -p $F
  for fe in synth.fbin iid64.fbin iid128.fbin u8.u8bin f16.f16bin; do
    [ -f $F/$fe ] || python3 scripts/families.py ${fe%%.*} -o $F/$fe --threads 12 >> "$OUT/families.jsonl" &
  done; wait
  peers() { [ -d /tmp/cuvs_site ] && echo "--peers $1" || echo "--peers exact"; }
  PYTHONPATH=/tmp/cuvs_site:${PYTHONPATH:-} python3 scripts/bench_families.py $F/synth.fbin:l2 $F/u8.u8bin:l2 \
    $F/f16.f16bin:l2 ${FAMILY_INPUTS:-} $(peers nnd) --out "$OUT/t1.jsonl" > "$OUT/t1.log" 2>&1
  PYTHONPATH=/tmp/cuvs_site:${PYTHONPATH:-} python3 scripts/bench_families.py $F/iid64.fbin:l2 $F/iid128.fbin:l2 \
    $(peers bf,exact) --out "$OUT/t1.jsonl" >> "$OUT/t1.log" 2>&1
  python3 scripts/jsonl_table.py "$OUT/t1.jsonl" family tool graph_degree max_iterations time_s recall@10.recall \
    iters_run | tee -a "$summary"
  for fm in synth.fbin:l2 u8.u8bin:l2 f16.f16bin:l2 iid64.fbin:l2 iid128.fbin:l2; do
    f=${fm%%:*}; n=${f%%.*}
    $B build $F/$f -o $WORK/ooc.$n.knn --metric ${fm##*:} --shard-rows 250000 --backend cuda --gpus $GPUS --json \
      > "$OUT/ooc.$n.json" 2>> "$OUT/ooc.err"
    $B eval recall $WORK/ooc.$n.knn --backend cuda --json > "$OUT/ooc.$n.eval.json"
    note "out of core $n: $(j wall_s recall_estimate < "$OUT/ooc.$n.json") eval $(j recall < "$OUT/ooc.$n.eval.json")"
    rm -rf $WORK/ooc.$n.knn
  done ;;
scale)
  # issue 17: one 50M x 96 set on 1, 2, ... GPUs of this machine, same settings (SCALE_ARGS), page cache dropped
  step scale
  [ -f $WORK/d50m.fbin ] || bash scripts/synth_parallel.sh $WORK/d50m.fbin 50000000 96 2 > /dev/null
  for g in ${SCALE_GPUS:-0 0,1 all}; do
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
    $B build $WORK/d50m.fbin -o $WORK/s50.knn --k 32 --gpus $g ${SCALE_ARGS:-} --json > "$OUT/scale.$g.json" 2> "$OUT/scale.$g.err"
    $B eval recall $WORK/s50.knn --backend cuda --json > "$OUT/scale.$g.eval.json"
    note "50M --gpus $g: $(j wall_s shards merges_done busy_frac read_gb written_gb < "$OUT/scale.$g.json") recall $(j recall < "$OUT/scale.$g.eval.json")"
    rm -rf $WORK/s50.knn
  done ;;
kill)
  step kill
  $B synth $WORK/d4m.fbin --rows 4000000 --dim 96 --seed 3 --json > /dev/null
  # checkpoints every second, so that the kill lands between committed merges
  BIGKNN_CHECKPOINT_S=1 $B build $WORK/d4m.fbin -o $WORK/k.knn --k 32 --shard-rows 500000 $T2_ARGS --backend cuda --json > /dev/null 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    python3 -c "import json,sys; m=json.load(open('$WORK/k.knn/manifest.json')); sys.exit(0 if len(m['merged'])>=3 else 1)" 2>/dev/null && break
    kill -0 $pid 2>/dev/null || break; sleep 0.2
  done
  kill -9 $pid; wait $pid 2>/dev/null
  $B info $WORK/k.knn --json > "$OUT/kill_info_before.json"
  $B merge $WORK/k.knn --backend cuda --json > "$OUT/kill_merge.json"
  $B eval recall $WORK/k.knn --backend cuda --json > "$OUT/kill_eval.json"
  $B build $WORK/d4m.fbin -o $WORK/k2.knn --k 32 --shard-rows 500000 $T2_ARGS --backend cuda --json > /dev/null
  $B eval recall $WORK/k2.knn --backend cuda --json > "$OUT/kill_ref_eval.json"
  note "kill mid-merge: at kill $(j merges_done merges_pending < "$OUT/kill_info_before.json"); after merge $(j merges_done < "$OUT/kill_merge.json") recall $(j recall < "$OUT/kill_eval.json") vs uninterrupted $(j recall < "$OUT/kill_ref_eval.json")" ;;
esac; done
# at most 8 files come back from the device: the JSON results and logs travel as one archive
(cd "$OUT" && tar czf results.tgz --exclude=results.tgz --exclude=summary.txt --exclude=run.log * && \
   find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt ! -name run.log -delete)
echo "================ summary"; cat "$summary"
