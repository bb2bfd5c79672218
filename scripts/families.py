#!/usr/bin/env python3
"""The benchmark data families of docs/design.md / issue 10, made here from a seed (nothing downloaded at run
time), one file each in a format bigknn reads, plus one JSON line per family on stdout.

    synth   1M x 96 float32, l2: the clustered synth of ``bigknn synth`` (same rows for the same seed)
    iid64   1M x 64 float32, l2: iid N(0, 1) (high intrinsic dimension)
    iid128  1M x 128 float32, l2: iid N(0, 1)
    u8      1M x 128 uint8, l2: SIFT-like, a 16-d latent mixture made non-negative, heavy-tailed, SIFT-normalised
    f16     1M x 768 float16, l2: a 32-d latent mixture lifted to 768-d
    text    1M x 384 float32, cosine: all-MiniLM-L6-v2 embeddings of prose on this machine (scripts/text_family.py;
            needs torch + sentence-transformers and the folder made by scripts/package_model.sh)
    tokens  1M x 384 float32, cosine: the same model's contextual word-piece embeddings of the same prose
            (ColBERT-style; scripts/text_family.py, same needs)
    sift    1M x 128 uint8, l2: real dense SIFT descriptors of the photographs Python packages install
            (scripts/image_family.py; needs opencv-python and scikit-image, scikit-learn, matplotlib for the photos)

    PYTHONPATH=$PWD python3 scripts/families.py u8 -o /tmp/fam/u8.u8bin
    PYTHONPATH=$PWD python3 scripts/families.py all -o /tmp/fam          # every family into /tmp/fam/NAME.EXT

Rows are made in blocks of 65536 on a thread pool, each block from its own seeded generator, and written
block by block into the output file (bounded memory; the same seed gives the same file whatever the threads).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from bigknn.formats import vectors_writer, write_vectors
from bigknn.core.synth import BLOCK_ROWS, synth_blocks

MakeBlock = Callable[[int, int], np.ndarray]  # (first row, rows) -> block
EXT = {"synth": ".fbin", "iid64": ".fbin", "iid128": ".fbin", "u8": ".u8bin", "f16": ".f16bin", "text": ".fbin",
       "tokens": ".fbin", "sift": ".u8bin"}
METRIC = {"text": "cosine", "tokens": "cosine"}  # every other family: l2
REAL = ("text", "tokens", "sift")  # made from what the machine holds, not from a seed alone
MIXTURES = {  # dim, clusters, latent dim, centre std, noise std: latent = centre + N(0, I), x = latent @ lift + noise
    "u8": (128, 1000, 16, 2.0, 0.25),
    "f16": (768, 1000, 32, 2.0, 0.05),
}


def pooled_blocks(rows: int, make: MakeBlock, threads: int | None = None) -> Iterator[np.ndarray]:
    """Yield ``make(start, n)`` for consecutive blocks of BLOCK_ROWS rows, computed on a thread pool (NumPy
    releases the GIL), in order, with a bounded number of blocks in flight."""
    starts = range(0, rows, BLOCK_ROWS)
    workers = threads or min(16, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers) as pool:
        ahead = workers + 2
        futures = [pool.submit(make, s, min(BLOCK_ROWS, rows - s)) for s in starts[:ahead]]
        for i in range(len(starts)):
            block, futures[i] = futures[i].result(), None
            if i + ahead < len(starts):
                s = starts[i + ahead]
                futures.append(pool.submit(make, s, min(BLOCK_ROWS, rows - s)))
            yield block


def iid(dim: int, seed: int) -> MakeBlock:
    """iid N(0, 1) float32 rows."""
    def make(start: int, n: int) -> np.ndarray:
        return np.random.default_rng([seed, dim, start // BLOCK_ROWS]).standard_normal((n, dim), np.float32)
    return make


def mixture(dim: int, clusters: int, latent: int, centre_std: float, noise: float, seed: int,
            finish: Callable[[np.ndarray], np.ndarray] = lambda x: x, dtype: type = np.float32) -> MakeBlock:
    """Gaussian clusters in ``latent`` dims (centres ~ N(0, centre_std^2 I), points = centre + N(0, I)),
    lifted to ``dim`` by a random latent x dim matrix N(0, 1/latent), plus N(0, noise^2) in every dim; then
    ``finish`` and the cast to ``dtype``, 8192 rows at a time (bounded temporaries at 768-d)."""
    setup = np.random.default_rng([seed, dim, latent, clusters])
    centres = setup.normal(0.0, centre_std, (clusters, latent)).astype(np.float32)
    lift = setup.normal(0.0, latent ** -0.5, (latent, dim)).astype(np.float32)

    def make(start: int, n: int) -> np.ndarray:
        rng = np.random.default_rng([seed, dim, latent, clusters, start // BLOCK_ROWS])
        labels = rng.integers(0, clusters, n)
        out = np.empty((n, dim), dtype)
        for i in range(0, n, 8192):
            z = centres[labels[i:i + 8192]] + rng.standard_normal((len(labels[i:i + 8192]), latent), np.float32)
            x = rng.standard_normal((len(z), dim), np.float32)
            x *= noise
            x += z @ lift
            out[i:i + len(z)] = finish(x)
        return out
    return make


def sift_like(x: np.ndarray) -> np.ndarray:
    """Float rows -> uint8 the way SIFT quantises its histograms: rectify and sharpen (max(x, 0)^1.5: about
    half the entries zero, a heavy tail), L2-normalise, clip at 0.2, renormalise, x512, round, cap at 255."""
    v = np.maximum(x, 0.0)
    v *= np.sqrt(v)
    v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    np.minimum(v, 0.2, out=v)
    v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    return np.minimum(np.rint(v * 512.0), 255.0).astype(np.uint8)


def synthetic(family: str, seed: int) -> tuple[MakeBlock, int, np.dtype, dict]:
    """The block maker, dim, dtype and recipe of a synthetic family."""
    if family == "synth":
        def make(start: int, n: int) -> np.ndarray:  # rows [start, start + n) of the `bigknn synth` set
            return next(synth_blocks(n, 96, seed=seed, threads=1, first_row=start))
        return make, 96, np.dtype(np.float32), {"recipe": "bigknn.core.synth: 200 Gaussian clusters in 12-d, lifted "
                                                "to 96-d, + N(0, 0.05^2) (= bigknn synth --dim 96)"}
    if family in ("iid64", "iid128"):
        dim = int(family[3:])
        return iid(dim, seed), dim, np.dtype(np.float32), {"recipe": f"iid N(0, 1) in {dim}-d"}
    dim, clusters, latent, centre_std, noise = MIXTURES[family]
    recipe = {"recipe": f"{clusters} Gaussian clusters in {latent}-d (centres N(0, {centre_std}^2 I), points "
              f"centre + N(0, I)), lifted to {dim}-d by N(0, 1/{latent}), + N(0, {noise}^2)",
              "intrinsic_dim": latent}
    if family == "u8":
        recipe["recipe"] += ("; then SIFT-like quantisation: max(x,0)^1.5, L2-normalise, clip 0.2, renormalise, "
                             "x512, round, cap 255")
        make = mixture(dim, clusters, latent, centre_std, noise, seed, sift_like, np.uint8)
        return make, dim, np.dtype(np.uint8), recipe
    make = mixture(dim, clusters, latent, centre_std, noise, seed, dtype=np.float16)
    return make, dim, np.dtype(np.float16), recipe


def write_family(family: str, out: Path, rows: int, seed: int, threads: int | None = None,
                 passages_out: Path | None = None, text_roots: list[str] | None = None) -> dict:
    """Write one family to ``out``; return its JSON record."""
    t0 = time.perf_counter()
    if out.suffix.lower() != EXT[family]:
        raise SystemExit(f"{out}: family {family} is written as {EXT[family]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    rec = {"family": family, "file": str(out), "seed": seed}
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if family in ("text", "tokens"):
        import text_family

        if not (text_family.MODEL_DIR / "model.safetensors").exists():
            raise SystemExit(f"{family}: no model in {text_family.MODEL_DIR}: run scripts/package_model.sh, carry "
                             ".model")
    if family == "tokens":
        texts, found = text_family.passages(rows, seed, text_roots, threads)  # far more tokens than rows
        x, model = text_family.embed_tokens(texts, rows)
        write_vectors(out, x)
        rec.update(rows=len(x), rows_requested=rows, dim=384, dtype="float32", metric="cosine", unit_norm=True,
                   provenance={**model, **found})
    elif family == "sift":
        import image_family

        x, photos = image_family.descriptors(rows, seed, threads)
        if len(x) < rows:
            print(f"sift: only {len(x)} distinct descriptors on this machine, {rows} asked", file=sys.stderr)
        write_vectors(out, x)
        rec.update(rows=len(x), rows_requested=rows, dim=128, dtype="uint8", metric="l2", provenance=photos)
    elif family == "text":
        texts, found = text_family.passages(rows, seed, text_roots, threads)
        t1 = time.perf_counter()
        if len(texts) < rows:
            print(f"text: only {len(texts)} distinct passages on this machine, {rows} asked", file=sys.stderr)
        with vectors_writer(out, len(texts), 384, np.float32) as mm:
            model = text_family.embed(texts, mm)
        if passages_out is not None:
            passages_out.write_text("".join(p + "\n" for p in texts), encoding="utf-8")
        rec.update(rows=len(texts), rows_requested=rows, dim=384, dtype="float32", metric="cosine", unit_norm=True,
                   provenance={**model, **found}, passages_s=round(t1 - t0, 2),
                   embed_s=round(time.perf_counter() - t1, 2))
    else:
        make, dim, dtype, recipe = synthetic(family, seed)
        with vectors_writer(out, rows, dim, dtype) as mm:
            at = 0
            for block in pooled_blocks(rows, make, threads):
                mm[at:at + len(block)] = block
                at += len(block)
        rec.update(rows=rows, dim=dim, dtype=dtype.name, metric="l2", provenance=recipe)
    rec["seconds"] = round(time.perf_counter() - t0, 2)
    return rec


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("family", choices=[*EXT, "all"])
    ap.add_argument("-o", "--out", type=Path, required=True, help="output file (a folder for 'all')")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="generator threads / text reader and image processes")
    ap.add_argument("--passages", type=Path, default=None, help="text: also write the passages, one per line")
    ap.add_argument("--text-root", action="append", default=None,
                    help="text: read prose under this folder (repeatable) instead of the Python and system folders")
    args = ap.parse_args(argv)
    if args.rows < 1:
        ap.error("--rows must be positive")
    jobs = [(f, args.out / f"{f}{EXT[f]}") for f in EXT] if args.family == "all" else [(args.family, args.out)]
    for family, out in jobs:
        rec = write_family(family, out, args.rows, args.seed, args.threads, args.passages, args.text_root)
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
