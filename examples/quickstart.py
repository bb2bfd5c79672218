# %% [markdown]
# # bigknn quick start
#
# A notebook-style script (the `# %%` cells open as cells in Jupyter, VS Code and Spyder): build the
# k-nearest-neighbour graph of an array, read it as arrays and as a scipy sparse matrix, put bigknn in a
# scikit-learn Pipeline, and hand the graph to UMAP. A few thousand rows, so it runs in seconds on a CPU;
# the same calls take a billion rows on GPUs (with `store=` a directory on a big disk).
#
# Run it: `python examples/quickstart.py` (UMAP runs where umap-learn is installed: `pip install umap-learn`).

# %%
import importlib.util

import numpy as np

import bigknn

# 3000 points of a rolled-up sheet (a 2-d manifold) in 16 dimensions, slightly noisy
rng = np.random.default_rng(0)
t, h = 1.5 * np.pi * (1 + 2 * rng.random(3000)), 20 * rng.random(3000)
sheet = np.stack([t * np.cos(t), h, t * np.sin(t)], axis=1)
rotation = np.linalg.qr(rng.normal(size=(16, 16)))[0][:3]  # 3 orthonormal rows
x = (sheet @ rotation + 0.05 * rng.normal(size=(3000, 16))).astype(np.float32)

# %% Build the graph: every row gets its 15 nearest other rows
g = bigknn.build(x, k=15)  # no store: a temporary one, deleted by g.close()
print(g)
print("build's own recall estimate:", g.info.recall_estimate.recall)

# %% Neighbours as arrays: (rows, k) ids and Euclidean distances, nearest first
ids, distances = g.neighbors()
print("row 0's nearest rows:", ids[0, :5], "at", distances[0, :5].round(3))

# %% Measured recall@10 on 500 sampled rows against exact neighbours
print("recall@10:", g.recall(sample=500).recall)

# %% The graph as a scipy.sparse CSR matrix (each row: its 15 distances)
csr = g.to_scipy()
print("CSR:", csr.shape, "with", csr.nnz, "entries")

# %% scikit-learn: KNNGraphTransformer is a KNeighborsTransformer, for estimators taking metric="precomputed"
from sklearn.manifold import Isomap
from sklearn.pipeline import make_pipeline

pipe = make_pipeline(bigknn.KNNGraphTransformer(n_neighbors=10),
                     Isomap(n_neighbors=10, n_components=2, metric="precomputed"))
flat = pipe.fit_transform(x)
print("Isomap unrolls the sheet: |correlation| of its first axis with the roll's angle:",
      round(abs(np.corrcoef(flat[:, 0], t)[0, 1]), 3))

# %% UMAP on the graph: precomputed_knn takes (ids, distances) with each row itself first
if importlib.util.find_spec("umap") is not None:
    import umap

    emb = umap.UMAP(n_neighbors=15, precomputed_knn=g.umap_knn(15)).fit_transform(x)
    print("UMAP embedding:", emb.shape)
else:
    print("UMAP skipped: pip install umap-learn")

# %%
g.close()
