"""``bigknn dedup`` and what ``bigknn export`` writes beyond the lists: the symmetric graph
(``--symmetric``) and HDBSCAN's core distances (``--core-distances``)."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from bigknn import api
from bigknn.core.atomic import atomic_path
from bigknn.cli.common import emit, json_option
from bigknn.core.errors import BadInput
from bigknn.core.extras import import_ahead
from bigknn.products.symmetric import MODES, WEIGHTS

symmetric_option = click.option(
    "--symmetric", type=click.Choice(MODES), default=None,
    help="Write the symmetric graph instead of the lists: union (an edge where either row lists the other; what "
         "UMAP's and scikit-learn's metric='precomputed' take) or mutual (where both do), to .npz (scipy CSR) or "
         ".parquet (row, col, weight), streamed block by block.")
weights_option = click.option(
    "--weights", type=click.Choice(WEIGHTS), default=None,
    help="With --symmetric: the graph's distances (the default), UMAP's fuzzy connectivities (umap), or 1 per "
         "edge (none).")
core_option = click.option(
    "--core-distances", "core_min_samples", type=click.IntRange(min=1), default=None, metavar="MIN_SAMPLES",
    help="Write HDBSCAN's core distances (.npy, one float32 a row): each row's distance to its MIN_SAMPLES-th "
         "nearest row counting itself (scikit-learn's min_samples; at most k + 1).")

edges_mem_option = click.option(
    "--host-mem", "host_mem", type=str, default=None,
    help="With --symmetric: host RAM for a row block's edges, e.g. 4G; beyond it the edges wait on disk in a "
         "temporary directory next to --output (default: half the machine's RAM).")


def export_products(store: Path, output: Path, symmetric: str | None, weights: str | None,
                    core_min_samples: int | None, include_self: bool, host_mem: int | None) -> dict | None:
    """What ``bigknn export`` writes when --symmetric or --core-distances is given (else None)."""
    if symmetric is None and (weights is not None or host_mem is not None):
        raise BadInput(output, "--weights and --host-mem apply to --symmetric")
    if symmetric is None and core_min_samples is None:
        return None
    if symmetric is not None and core_min_samples is not None:
        raise BadInput(output, "--symmetric and --core-distances write different files; give one")
    if include_self:
        raise BadInput(output, "--include-self applies to the lists, not to --symmetric or --core-distances")
    graph = api.open(store)
    if symmetric is not None:
        return graph.export_symmetric(output, symmetric, weights or "distance", host_mem=host_mem)
    if output.suffix.lower() != ".npy":
        raise BadInput(output, "core distances are written as .npy")
    core = graph.core_distances(core_min_samples)
    with atomic_path(output) as tmp, open(tmp, "wb") as f:
        np.save(f, core)
    return {"store": str(store), "rows": len(core), "min_samples": core_min_samples, "format": "npy",
            "files": [str(output)]}


@click.command()
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--max-distance", type=float, required=True,
              help="Rows at this distance or closer are near duplicates (the graph's distance: Euclidean for l2, "
                   "1 - cos for cosine, 1 - x.y for ip).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The groups' rows: .parquet, .csv or .npy (row, group, kept, group_size; groups of 2 or more).")
@click.option("--keep", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the ids of the rows to keep (one per group and every row in none): .npy, or "
                   ".txt/.ids with one id a line.")
@json_option
def dedup(store: Path, max_distance: float, output: Path, keep: Path | None, as_json: bool) -> None:
    """Near-duplicate groups: the connected components of the graph's edges at --max-distance or closer
    (union-find over the lists, shard by shard). A group's id is its lowest row id, which is the row it
    keeps; the others are the duplicates to drop. Groups larger than k + 1 are found through chains.

    \b
    Examples:
      bigknn dedup data.knn --max-distance 0.05 -o groups.parquet
      bigknn dedup data.knn --max-distance 0.05 -o groups.csv --keep keep.ids --json
      python -c "import pyarrow.parquet as pq; print(pq.read_table('groups.parquet').to_pandas().head())"
    """
    graph = api.open(store)
    if output.suffix.lower() == ".parquet":
        import_ahead("pyarrow.parquet")  # imported while the union runs
    emit(graph.components(max_distance).write(output, keep), as_json, "dedup")
