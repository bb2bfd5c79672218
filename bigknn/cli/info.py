"""``bigknn info`` and ``bigknn export``."""

from __future__ import annotations

from pathlib import Path

import click

from bigknn import api
from bigknn.cli.common import emit, json_option, parse_bytes, plot_option
from bigknn.cli.products import core_option, edges_mem_option, export_products, symmetric_option, weights_option
from bigknn.core.errors import BadInput
from bigknn.operations.export import FORMATS, ID_KINDS, format_of
from bigknn.operations.verify import verify
from bigknn.plot import pyplot
from bigknn.results import Info
from bigknn.shards import Store, read_store


def describe(store: Store) -> dict:
    """The store's ``Info``, and the files of its state that are missing or of the wrong size (the cheap part
    of ``bigknn verify``): a store with any is not complete."""
    damaged = [f"{d['what']}: {d['file']}: {d['problem']}" for d in verify(store, contents=False)["damaged"]]
    info = Info.of(store).to_dict()
    return {**info, "complete": info["complete"] and not damaged, "damaged": damaged}


@click.command()
@click.argument("store", type=click.Path(path_type=Path))
@plot_option
@json_option
def info(store: Path, plot: Path | None, as_json: bool) -> None:
    """Shards, rows, k, metric, merges done and pending, disk use, missing files (`bigknn verify` checks all),
    and the build's recall@10 estimate (sample size, 99 % interval, the target it was built for).

    \b
    Examples:
      bigknn info data.knn
      bigknn info data.knn --json | jq .merges_pending
      bigknn info data.knn --plot degrees.png     # the in-degree distribution (hubs), drawn
    """
    if plot is not None:
        pyplot(plot)  # refuse a missing matplotlib or an unknown extension before reading anything
    result = read_store(store, describe, suspect=lambda d: bool(d["damaged"]))
    if plot is not None:
        result["in_degree"] = api.open(store).plot_in_degrees(plot).to_dict()
    emit(result, as_json, "store")


@click.command()
@click.argument("store", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="File to write; its extension names the format: .ibin, .npy (distances go to "
                   "<name>.dists.npy), .npz (scipy.sparse CSR matrix) or .parquet (an edge list: src, dst, "
                   "distance, rank; needs pyarrow).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="Only checked against the extension of --output, which decides.")
@click.option("--include-self", is_flag=True,
              help="List each row itself first, at distance 0 (k + 1 columns), as UMAP and scikit-learn expect.")
@click.option("--ids", type=click.Choice(ID_KINDS), default="row", show_default=True,
              help="row: input row numbers; user: the ids of the store's --id-column (.parquet, or .npy for "
                   "integer ids).")
@symmetric_option
@weights_option
@core_option
@edges_mem_option
@json_option
def export(store: Path, output: Path, fmt: str | None, include_self: bool, ids: str, symmetric: str | None,
           weights: str | None, core_min_samples: int | None, host_mem: str | None, as_json: bool) -> None:
    """Write the finished graph: row i holds global row i's neighbour ids (input order, 0-based), nearest
    first, self excluded unless --include-self, and their distances, ascending (l2: Euclidean; cosine:
    1 - cos; ip: 1 - inner product).

    \b
    Examples:
      bigknn export data.knn -o graph.ibin
      bigknn export data.knn -o graph.npy                  # also writes graph.dists.npy
      bigknn export data.knn -o graph.npz --include-self   # scipy.sparse.load_npz("graph.npz")
      bigknn export emb.knn -o edges.parquet --ids user     # pandas.read_parquet("edges.parquet")
      bigknn export data.knn -o sym.npz --symmetric union                 # UMAP / sklearn metric="precomputed"
      bigknn export data.knn -o conn.parquet --symmetric union --weights umap --host-mem 4G
      bigknn export data.knn -o core.npy --core-distances 10              # HDBSCAN's, min_samples 10
    """
    products = export_products(store, output, symmetric, weights, core_min_samples, include_self,
                               parse_bytes(host_mem))
    if products is not None:
        emit(products, as_json, "export")
        return
    graph = api.open(store)
    if fmt is not None and format_of(output) != fmt:
        raise BadInput(output, f"--format {fmt} writes a .{fmt} file")
    emit(graph.export(output, include_self, ids).to_dict(), as_json, "export")
