# synth_parallel.sh OUT ROWS DIM SEED: a large `bigknn synth` file made in 16 parallel parts (rows FIRST_ROW.. of the same
# distribution, `--first-row`), joined under one header (FIRST_ROW=F: rows F..F+ROWS of that set); 100M x 128 uint8 in 53 s on 32 cores (one process: ~9 min)
set -u; out=$1; rows=$2; dim=$3; seed=$4; P=16; per=$(( (rows + P - 1) / P )); ext=${out##*.}
for i in $(seq 0 $((P-1))); do
  first=$((i*per)); n=$(( rows - first < per ? rows - first : per ))
  python3 -m bigknn synth $out.part$i.$ext --rows $n --dim $dim --seed $seed --first-row $((${FIRST_ROW:-0} + first)) \
    --json > /dev/null &
done; wait
python3 - "$out" "$rows" "$dim" "$P" "$ext" <<'PY'
import sys, os, shutil, numpy as np
out, rows, dim, P, ext = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
with open(out, "wb") as f:
    f.write(np.array([rows, dim], np.int32).tobytes())
    for i in range(P):
        part = f"{out}.part{i}.{ext}"
        with open(part, "rb") as p:
            p.seek(8); shutil.copyfileobj(p, f, 64 << 20)
        os.remove(part)
print(out, os.path.getsize(out))
PY
