"""``Graph``'s graph products (symmetric, components, core_distances, mutual_reachability and their file
outputs): the Python side of ``bigknn export --symmetric``, ``bigknn export --core-distances`` and
``bigknn dedup``, kept apart from bigknn/stored_graph.py, which mixes them in."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from bigknn.products import components as comp
from bigknn.products import reachability, symmetric as sym
from bigknn.shards import Store

PathLike = str | os.PathLike


class ProductMethods:
    """Mixed into ``bigknn.Graph``; ``_live()`` gives the open store."""

    def _live(self) -> Store:  # pragma: no cover - Graph's
        raise NotImplementedError

    def symmetric(self, mode: str = "union", weights: str | None = "distance", k: int | None = None,
                  host_mem: int | None = None) -> Any:
        """The symmetric graph as a ``scipy.sparse.csr_matrix`` (rows, rows), columns ascending per row.

        ``mode``: "union" (an edge where either row lists the other: what UMAP's and scikit-learn's
        ``metric="precomputed"`` take) or "mutual" (where both do). ``weights``: "distance" (the graph's
        distances: Euclidean for l2, 1 - cos for cosine), "umap" (UMAP's fuzzy connectivities: per-row sigma
        and rho as umap-learn's ``smooth_knn_dist`` with n_neighbors = k + 1, joined a + b - ab for the union
        and ab for the mutual graph; scanpy's ``connectivities``, Leiden's weights) or None (1 per edge).
        ``k``: neighbours per row to use (default all). Built in two streamed passes; the edges wait on disk
        (in the system's temporary directory) where they exceed ``host_mem`` bytes (default: half the RAM).
        The matrix itself is in memory: ``export_symmetric`` writes one that is not.

        Examples
        --------
        >>> import numpy as np, bigknn
        >>> x = np.array([[0.0], [1], [3], [7]], dtype=np.float32)
        >>> with bigknn.build(x, k=1, backend="cpu") as g:
        ...     union, mutual = g.symmetric(), g.symmetric("mutual", weights=None)
        >>> union.toarray().tolist()           # lists 0->1, 1->0, 2->1, 3->2, both ways
        [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 2.0, 0.0], [0.0, 2.0, 0.0, 4.0], [0.0, 0.0, 4.0, 0.0]]
        >>> mutual.nnz, (union != union.T).nnz
        (2, 0)
        """
        return sym.symmetric_csr(self._live(), mode, weights, k, host_mem)

    def export_symmetric(self, path: PathLike, mode: str = "union", weights: str | None = "distance",
                         k: int | None = None, host_mem: int | None = None) -> dict:
        """Write the symmetric graph (as ``symmetric``) block by block, never whole in memory: ``.npz``
        (``scipy.sparse.load_npz`` reads it) or ``.parquet`` edges (row, col, weight; every pair both ways;
        needs pyarrow). Temporary edge files go next to ``path``. Returns the summary ``bigknn export
        --symmetric`` prints.

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np, bigknn, scipy.sparse
        >>> x = np.random.default_rng(0).normal(size=(200, 4)).astype(np.float32)
        >>> out = os.path.join(tempfile.mkdtemp(), "sym.npz")
        >>> with bigknn.build(x, k=5, backend="cpu") as g:
        ...     report = g.export_symmetric(out, weights="umap")
        ...     same = (scipy.sparse.load_npz(out) != g.symmetric(weights="umap")).nnz == 0
        >>> report["format"], report["weights"], same
        ('npz', 'umap', True)
        """
        return sym.write_symmetric(self._live(), Path(path), mode, weights, k, host_mem)

    def components(self, max_distance: float, k: int | None = None) -> comp.Components:
        """Near-duplicate groups: the connected components of the graph's edges at distance <=
        ``max_distance`` (the graph's distances: Euclidean for l2, 1 - cos for cosine), by union-find over the
        lists, a graph chunk per thread (memory: 8 bytes a row). Each group's id is its lowest row id, which is
        the row it keeps. A group is found through chains however large; a row with more than k near duplicates is
        still grouped with all of them where they chain, but may not see each directly.

        Examples
        --------
        >>> import numpy as np, bigknn
        >>> x = np.array([[0.0], [5], [0.001], [9], [5.002], [0.002]], dtype=np.float32)
        >>> with bigknn.build(x, k=2, backend="cpu") as g:
        ...     c = g.components(max_distance=0.01)
        >>> c.labels.tolist(), c.kept.tolist()
        ([0, 1, 0, 3, 1, 0], [True, True, False, True, False, False])
        >>> c.summary()["groups"], c.summary()["rows_removed"]
        (2, 3)
        """
        return comp.components(self._live(), max_distance, k)

    def core_distances(self, min_samples: int) -> np.ndarray:
        """HDBSCAN's core distances (rows,): each row's distance to its (min_samples - 1)-th neighbour, i.e.
        the min_samples-th row counting itself, as scikit-learn's ``HDBSCAN(min_samples=…)`` counts
        (scikit-learn-contrib's ``hdbscan`` counts without self: pass it min_samples - 1). 1 <= min_samples
        <= k + 1.

        Examples
        --------
        >>> import numpy as np, bigknn
        >>> x = np.array([[0.0], [1], [3], [7]], dtype=np.float32)
        >>> with bigknn.build(x, k=2, backend="cpu") as g:
        ...     g.core_distances(min_samples=2).tolist(), g.core_distances(3).tolist()
        ([1.0, 1.0, 2.0, 4.0], [3.0, 2.0, 3.0, 6.0])
        """
        return reachability.core_distances(self._live(), min_samples)

    def mutual_reachability(self, min_samples: int, join: bool = True, host_mem: int | None = None) -> Any:
        """HDBSCAN's mutual-reachability graph as a symmetric ``scipy.sparse.csr_matrix``: the union graph's
        edges weighted max(core_a, core_b, d). Pass it to ``sklearn.cluster.HDBSCAN(metric="precomputed",
        min_samples=1)`` (min_samples 1 leaves these weights as they are). A graph of several components is
        joined by the exact cheapest cross-component edges (Borůvka; a scan of the vectors, held in memory
        meanwhile, that measures only the balls of rows whose bound can beat each component's best edge), or
        with ``join=False`` refused in one line.

        Examples
        --------
        >>> import numpy as np, bigknn
        >>> from sklearn.cluster import HDBSCAN
        >>> rng = np.random.default_rng(0)
        >>> x = np.concatenate([rng.normal(0, 1, (300, 2)), rng.normal(12, 1, (300, 2))]).astype(np.float32)
        >>> with bigknn.build(x, k=15, backend="cpu") as g:
        ...     mr = g.mutual_reachability(min_samples=10)
        >>> labels = HDBSCAN(metric="precomputed", min_samples=1, min_cluster_size=20, copy=True).fit_predict(mr)
        >>> clusters = [set(labels[:300].tolist()) - {-1}, set(labels[300:].tolist()) - {-1}]
        >>> [len(c) for c in clusters], clusters[0] & clusters[1]   # one cluster a blob (two components, joined)
        ([1, 1], set())
        """
        return reachability.mutual_reachability(self._live(), min_samples, join, host_mem)
