"""``bigknn synth``: the clustered benchmark workload, streamed to a file."""

from __future__ import annotations

import time
from pathlib import Path

import click
import numpy as np

from bigknn.cli.common import emit, json_option, reporter_for
from bigknn.core.errors import BadInput
from bigknn.formats import vectors_writer
from bigknn.core.synth import as_dtype, synth_blocks

DTYPES = {".fbin": np.float32, ".npy": np.float32, ".f16bin": np.float16, ".u8bin": np.uint8, ".i8bin": np.int8}


@click.command()
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--rows", type=click.IntRange(min=1), required=True, help="Number of vectors.")
@click.option("--dim", type=click.IntRange(min=1), required=True, help="Dimension of each vector.")
@click.option("--clusters", type=click.IntRange(min=1), default=200, show_default=True,
              help="Gaussian clusters the rows are drawn from.")
@click.option("--intrinsic-dim", type=click.IntRange(min=1), default=12, show_default=True,
              help="Dimension the clusters live in before the random lift to --dim (the data's true dimension).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the generator: the same seed gives the same rows (another seed: e.g. queries).")
@click.option("--first-row", type=click.IntRange(min=0), default=0, show_default=True,
              help="Write rows FIRST_ROW.. of a larger set: more rows of the distribution of a file of "
                   "FIRST_ROW rows with the same seed (a batch to ingest into its store).")
@click.option("--force", is_flag=True, help="Replace OUT if it exists (by default an existing file is refused).")
@json_option
def synth(out: Path, rows: int, dim: int, clusters: int, intrinsic_dim: int, seed: int, first_row: int,
          force: bool, as_json: bool) -> None:
    """Write clustered vectors with low intrinsic dimension (the clustered family of docs/design.md) to OUT.

    The dtype follows OUT's extension: .fbin/.npy float32, .f16bin float16, .u8bin/.i8bin
    quantised (x*10 shifted into the type's range).

    \b
    Examples:
      bigknn synth data.fbin --rows 100000 --dim 96
      bigknn synth data.fbin --rows 100000 --dim 96 --force      # replace data.fbin
      bigknn synth data.u8bin --rows 1000000 --dim 128 --seed 3
      bigknn synth new.fbin --rows 10000 --dim 96 --first-row 100000   # new rows for data.fbin's store
    """
    ext = out.suffix.lower()
    if ext not in DTYPES:
        raise click.BadParameter(f"{out}: write .fbin, .f16bin, .u8bin, .i8bin or .npy", param_hint="OUT")
    if out.exists() and not force:
        raise BadInput(out, "exists; pass --force to replace it")
    dtype = DTYPES[ext]
    t0 = time.perf_counter()
    reporter = reporter_for(as_json)
    with vectors_writer(out, rows, dim, dtype) as mm, reporter.phase("synth", rows, "rows") as advance:
        start = 0
        for block in synth_blocks(rows, dim, clusters, intrinsic_dim, seed, first_row=first_row):
            mm[start:start + len(block)] = as_dtype(block, dtype)
            start += len(block)
            advance(len(block))
    emit({"file": str(out), "rows": rows, "dim": dim, "dtype": np.dtype(dtype).name, "clusters": clusters,
          "intrinsic_dim": intrinsic_dim, "seed": seed, "first_row": first_row,
          "wall_s": round(time.perf_counter() - t0, 3)},
         as_json, "synth")
