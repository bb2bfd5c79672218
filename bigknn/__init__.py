"""bigknn: approximate k-NN graphs for vector sets far beyond GPU memory (GNND + GGM).

``bigknn.build(data, k=...)`` builds a graph, ``bigknn.open(store)`` opens one built before; both give a
``Graph`` (neighbour arrays, scipy CSR, UMAP's ``precomputed_knn``, export, ingest, recall checks).
``bigknn.KNNGraphTransformer`` is the scikit-learn transformer (needs scikit-learn: ``bigknn[sklearn]``).
"""

__version__ = "0.1.0"

from bigknn.core import numba_cache as numbacache  # noqa: E402 - before anything imports numba

numbacache.ensure()

# after __version__, which the CLI imports
from bigknn.api import Graph, build, ingest, merge, open, plan, verify  # noqa: E402
from bigknn.core.errors import BadInput, BigknnError, StoreBusy  # noqa: E402
from bigknn.operations.loaded_index import LoadedIndex  # noqa: E402
from bigknn.results import (BuildReport, ExportReport, InDegrees, Info, IngestReport, Neighbors,  # noqa: E402
                            RecallEstimate, RecallReport)

__all__ = ["BadInput", "BigknnError", "BuildReport", "ExportReport", "Graph", "InDegrees", "Info", "IngestReport",
           "KNNGraphTransformer", "LoadedIndex", "Neighbors", "RecallEstimate", "RecallReport", "StoreBusy",
           "__version__", "build", "ingest", "merge", "open", "plan", "verify"]


def __getattr__(name: str) -> type:
    """``KNNGraphTransformer`` is imported on first use, so that ``import bigknn`` never imports scikit-learn."""
    if name == "KNNGraphTransformer":
        try:
            from bigknn.sklearn import KNNGraphTransformer
        except ImportError as e:
            from bigknn.core.extras import install_hint

            raise ImportError(f"KNNGraphTransformer needs scikit-learn: {install_hint('sklearn')}") from e
        return KNNGraphTransformer
    raise AttributeError(f"module 'bigknn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
