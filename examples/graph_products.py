# %% [markdown]
# # What the graph is for: near duplicates, symmetric graphs, HDBSCAN
#
# A notebook-style script (`# %%` cells) for the README's chapters on graph products: each result is computed
# from the store's lists shard by shard, so the same calls work on a graph far bigger than RAM. Small sets,
# so it runs in seconds on a CPU.
#
# Run it: `python examples/graph_products.py` (UMAP and Leiden steps run where umap-learn / leidenalg are
# installed).

# %%
import importlib.util
import os
import shutil
import tempfile

import numpy as np
from sklearn.cluster import HDBSCAN
from sklearn.metrics import adjusted_rand_score

import bigknn

rng = np.random.default_rng(0)
out = tempfile.mkdtemp()

# %% [markdown]
# ## Near-duplicate groups (semantic deduplication)
# 2,000 unrelated rows plus 5 planted groups of 2 to 40 near copies (jitter 0.001): the rows within
# max_distance of each other, chained, form a group; each group keeps its lowest row id.

# %%
groups = [c + 0.001 * rng.normal(size=(s, 32)) for c, s in zip(rng.normal(size=(5, 32)) * 5, (2, 3, 8, 20, 40))]
docs = np.concatenate([rng.normal(size=(2000, 32)) * 5, *groups]).astype(np.float32)
with bigknn.build(docs, k=10) as g:
    dup = g.components(max_distance=0.05)
    summary = dup.write(os.path.join(out, "groups.parquet"), keep=os.path.join(out, "keep.npy"))
print("groups:", summary["groups"], "rows removed:", summary["rows_removed"], "largest:", summary["largest_group"])
kept = np.load(os.path.join(out, "keep.npy"))
print("rows kept:", len(kept))

# %% [markdown]
# ## Symmetric graphs: UMAP's precomputed input, fuzzy connectivities, Leiden on the mutual graph

# %%
x = np.concatenate([rng.normal(c, 1.0, size=(500, 8)) for c in (0, 6, 12)]).astype(np.float32)
truth = np.repeat([0, 1, 2], 500)
with bigknn.build(x, k=15) as g:
    distances = g.symmetric("union")  # symmetric distances: metric="precomputed"
    connectivities = g.symmetric("union", weights="umap")  # UMAP's fuzzy graph (scanpy's connectivities)
    mutual = g.symmetric("mutual", weights=None)  # an edge where both rows list each other
print("union:", distances.nnz, "entries, symmetric:", (distances != distances.T).nnz == 0)
print("fuzzy weights in (0, 1]:", bool((connectivities.data > 0).all() and (connectivities.data <= 1).all()))
if importlib.util.find_spec("umap") is not None:
    import umap

    embedding = umap.UMAP(metric="precomputed", n_neighbors=15, random_state=0).fit_transform(distances)
    print("UMAP embedding:", embedding.shape)
else:
    print("UMAP skipped: pip install 'bigknn[umap]'")
if importlib.util.find_spec("leidenalg") is not None:
    import igraph
    import leidenalg

    edges = mutual.tocoo()
    graph = igraph.Graph(n=mutual.shape[0], edges=list(zip(edges.row[edges.row < edges.col],
                                                           edges.col[edges.row < edges.col])))
    leiden = np.array(leidenalg.find_partition(graph, leidenalg.ModularityVertexPartition, seed=0).membership)
    print("Leiden on the mutual graph, ARI:", round(adjusted_rand_score(truth, leiden), 3))
else:
    print("Leiden skipped: pip install 'bigknn[leiden]'")

# %% [markdown]
# ## HDBSCAN on the mutual-reachability graph
# min_samples counts the row itself (scikit-learn's convention) and needs min_samples <= k + 1. Pass the
# graph with min_samples=1, which leaves its weights as they are.

# %%
with bigknn.build(x, k=32) as g:
    reach = g.mutual_reachability(min_samples=10)
labels = HDBSCAN(metric="precomputed", min_samples=1, min_cluster_size=20, copy=True).fit_predict(reach)
exact = HDBSCAN(min_samples=10, min_cluster_size=20, copy=True).fit_predict(x)
print("HDBSCAN clusters:", len(set(labels) - {-1}), "ARI against HDBSCAN on the rows:",
      round(adjusted_rand_score(exact, labels), 3))
shutil.rmtree(out)  # the groups and kept rows written above
