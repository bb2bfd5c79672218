"""``KNNGraphTransformer``: scikit-learn's ``KNeighborsTransformer`` contract on bigknn graphs, so a
bigknn graph can feed any estimator that takes a precomputed sparse distance graph (``Isomap``, ``TSNE``,
``DBSCAN``, ``HDBSCAN``, ``SpectralClustering``, UMAP with ``metric="precomputed"``) in a ``Pipeline``.

Needs scikit-learn (the ``sklearn`` extra: ``pip install scikit-learn scipy``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from bigknn.api import DEFAULTS, build
from bigknn.operations.input_arrays import host_array
from bigknn.operations.readout import csr_parts

MODES = ("distance",)  # what bigknn gives: KNeighborsTransformer's "connectivity" is not offered


class KNNGraphTransformer(TransformerMixin, BaseEstimator):
    """Transform rows into their k-neighbours graph: a sparse (rows, fitted rows) matrix of distances.

    As in ``sklearn.neighbors.KNeighborsTransformer(mode="distance")``, each fitted row's graph row holds
    ``n_neighbors + 1`` entries: itself at distance 0 (an explicit entry), then its ``n_neighbors``
    nearest rows, nearest first. ``fit`` builds the approximate graph of the fitted rows with
    ``bigknn.build`` (in a temporary store, deleted with the transformer); ``transform`` of the fitted
    rows returns it, and ``transform`` of new rows finds their ``n_neighbors + 1`` nearest fitted rows
    exactly (a scan of the fitted rows: costly for many new rows).

    Parameters
    ----------
    mode : {"distance"}
        The graph's values, as in ``KNeighborsTransformer``.
    n_neighbors : int
        Neighbours per row, self not counted.
    metric : {"l2", "ip", "cosine"}
        Distances as ``bigknn.Graph.neighbors`` gives them (``l2``: Euclidean, sklearn's default).
    recall : float
        Target recall@10 of the build.
    backend : {"auto", "cpu", "cuda"}
        Where the build runs.
    seed : int
        Seed of the build.

    Attributes
    ----------
    graph_ : bigknn.Graph
        The fitted rows' graph (``graph_.umap_knn()``, ``graph_.recall()``...).
    n_features_in_ : int
        Dimension of the fitted rows.
    n_samples_fit_ : int
        Number of fitted rows.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.manifold import Isomap
    >>> from sklearn.pipeline import make_pipeline
    >>> from bigknn import KNNGraphTransformer
    >>> x = np.random.default_rng(0).normal(size=(500, 8)).astype(np.float32)
    >>> graph = KNNGraphTransformer(n_neighbors=10, backend="cpu").fit_transform(x)
    >>> graph.shape, graph.nnz
    ((500, 500), 5500)
    >>> pipe = make_pipeline(KNNGraphTransformer(n_neighbors=10, backend="cpu"),
    ...                      Isomap(n_neighbors=10, n_components=2, metric="precomputed"))
    >>> pipe.fit_transform(x).shape
    (500, 2)
    """

    def __init__(self, *, mode: str = "distance", n_neighbors: int = 5, metric: str = "l2",
                 recall: float = DEFAULTS.recall, backend: str = "auto", seed: int = 0):
        self.mode = mode
        self.n_neighbors = n_neighbors
        self.metric = metric
        self.recall = recall
        self.backend = backend
        self.seed = seed

    def fit(self, X: Any, y: Any = None) -> KNNGraphTransformer:
        """Build the k-NN graph of the rows of ``X``; ``y`` is ignored.

        Examples
        --------
        >>> import numpy as np
        >>> from bigknn import KNNGraphTransformer
        >>> x = np.random.default_rng(0).normal(size=(300, 4)).astype(np.float32)
        >>> t = KNNGraphTransformer(n_neighbors=5, backend="cpu").fit(x)
        >>> t.n_samples_fit_, t.graph_.info.k
        (300, 5)
        """
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        x = host_array(X)
        self.graph_ = build(x, k=self.n_neighbors, metric=self.metric, recall=self.recall, backend=self.backend,
                            seed=self.seed)
        self._fit_X = x
        self.n_features_in_ = x.shape[1]
        self.n_samples_fit_ = x.shape[0]
        return self

    def transform(self, X: Any) -> Any:
        """The ``scipy.sparse.csr_matrix`` (rows of X, fitted rows) of each row's ``n_neighbors + 1``
        nearest fitted rows; for the fitted rows themselves, the built graph with self first.

        Examples
        --------
        >>> import numpy as np
        >>> from bigknn import KNNGraphTransformer
        >>> x = np.array([[0.0], [1], [3], [7]], dtype=np.float32)
        >>> t = KNNGraphTransformer(n_neighbors=1, backend="cpu").fit(x)
        >>> t.transform(np.array([[2.9]], dtype=np.float32)).toarray().astype(float).round(2).tolist()
        [[0.0, 1.9, 0.1, 0.0]]
        """
        check_is_fitted(self)
        x = host_array(X)
        if x is self._fit_X or np.array_equal(x, self._fit_X):
            return self.graph_.to_scipy(self.n_neighbors, include_self=True)
        from scipy.sparse import csr_matrix

        nearest = self.graph_.exact_neighbors(x, self.n_neighbors + 1, backend=self.backend)
        return csr_matrix(csr_parts(*nearest), shape=(len(x), self.n_samples_fit_))

    def fit_transform(self, X: Any, y: Any = None) -> Any:
        """``fit(X).transform(X)``: the graph of X's rows, self first in each row.

        Examples
        --------
        >>> import numpy as np
        >>> from bigknn import KNNGraphTransformer
        >>> x = np.array([[0.0], [1], [3], [7]], dtype=np.float32)
        >>> m = KNNGraphTransformer(n_neighbors=1, backend="cpu").fit_transform(x)
        >>> m.indices.tolist(), m.data.tolist()      # row i: itself at 0, then its nearest row
        ([0, 1, 1, 0, 2, 1, 3, 2], [0.0, 1.0, 0.0, 1.0, 0.0, 2.0, 0.0, 4.0])
        """
        return self.fit(X, y).transform(X)
