"""The quality of a stored k-NN graph, as ``bigknn.Graph`` reports and draws it: recall against exact neighbours,
in-degrees, and their pictures (``bigknn eval recall --plot``, ``bigknn info --plot``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from bigknn import plot as draw
from bigknn.backends import get_backend
from bigknn.operations.evaluate import RECALL_K, SAMPLE_ROWS, recall_rows
from bigknn.operations.readout import in_degrees, neighbours_per_row, shard_of
from bigknn.results import InDegrees, RecallReport
from bigknn.shards import Store

PathLike = str | os.PathLike


class QualityMethods:
    """Mixed into ``bigknn.Graph``; ``_live()`` gives the open store."""

    def _live(self) -> Store:  # pragma: no cover - Graph's
        raise NotImplementedError

    def recall(self, sample: int = SAMPLE_ROWS, k: int = RECALL_K, truth: PathLike | None = None, seed: int = 0,
               rows: tuple[int, int] | None = None, backend: str = "auto", gpu_mem: int | None = None,
               plot: PathLike | None = None) -> RecallReport:
        """Measure recall@k on sampled rows against their exact neighbours (self excluded, ties counted).

        Parameters
        ----------
        sample : int
            Rows whose exact neighbours are computed (a scan of the store each).
        k : int
            Recall@k, at most the graph's k.
        truth : path, optional
            Ground truth ``.ibin`` (row i: exact neighbours of row i) instead of the exact scan.
        seed : int
            Seed of the row sample.
        rows : (int, int), optional
            Sample only global rows [lo, hi), e.g. the rows an ingest added.
        backend, gpu_mem
            As for ``build``.
        plot : path, optional
            Also draw the recall of each sampled row (a histogram) and each shard's mean into this image
            file (.png, .svg, .pdf; needs matplotlib: ``bigknn[plot]``).

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np, bigknn
        >>> x = np.random.default_rng(0).normal(size=(1000, 8)).astype(np.float32)
        >>> picture = os.path.join(tempfile.mkdtemp(), "recall.png")
        >>> with bigknn.build(x, k=10, backend="cpu") as g:
        ...     r = g.recall(sample=200, backend="cpu", plot=picture)
        >>> r.sample, r.k, r.recall >= 0.99, os.path.getsize(r.plot) > 0
        (200, 10, True, True)
        """
        store = self._live()
        if plot is not None:
            draw.pyplot(Path(plot))  # refuse a missing matplotlib or an unknown extension before the work
        result, sampled, per_row = recall_rows(store, get_backend(backend, gpu_mem), sample, k,
                                               None if truth is None else Path(truth), seed, rows)
        if plot is not None:  # the build's target is a recall@10
            target = (store.manifest.params.recall or None) if result["k"] == RECALL_K else None
            draw.recall_histogram(Path(plot), per_row, shard_of(store, sampled), len(store.manifest.shards),
                                  result["k"], f"{store.path.name}: recall@{result['k']} of {len(sampled):,} rows",
                                  target)
            result["plot"] = str(plot)
        return RecallReport(**result)

    def in_degrees(self, k: int | None = None) -> np.ndarray:
        """How many neighbour lists (their first ``k`` entries; default all) each row appears in: (rows,)
        int64, mean k. Rows in many lists are hubs, rows in none are never found as anyone's neighbour.

        Examples
        --------
        >>> import numpy as np, bigknn
        >>> x = np.array([[0.0], [1], [3], [7]], dtype=np.float32)
        >>> with bigknn.build(x, k=1, backend="cpu") as g:
        ...     g.in_degrees().tolist()        # 0->1, 1->0, 2->1, 3->2
        [1, 2, 1, 0]
        """
        return in_degrees(self._live(), k)

    def plot_in_degrees(self, path: PathLike, k: int | None = None) -> InDegrees:
        """Draw the in-degree distribution (``in_degrees``) into an image file (.png, .svg, .pdf; needs
        matplotlib: ``bigknn[plot]``) and return its summary; ``bigknn info --plot`` calls this.

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np, bigknn
        >>> x = np.random.default_rng(0).normal(size=(1000, 8)).astype(np.float32)
        >>> picture = os.path.join(tempfile.mkdtemp(), "degrees.png")
        >>> with bigknn.build(x, k=10, backend="cpu") as g:
        ...     d = g.plot_in_degrees(picture)
        >>> d.mean, d.max > 10, os.path.getsize(d.plot) > 0
        (10.0, True, True)
        """
        store = self._live()
        draw.pyplot(Path(path))
        k = neighbours_per_row(store, k)
        degrees = in_degrees(store, k)
        draw.in_degree_histogram(Path(path), degrees, k, f"{store.path.name}: in-degrees of {len(degrees):,} rows")
        return InDegrees.of(degrees, k, str(path))
