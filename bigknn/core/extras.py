"""How to install an optional extra, in one place: bigknn is installed from its checkout (it is not on the
package index yet), so an error's hint names the packages themselves and the extra of the checkout."""

from __future__ import annotations

import importlib
import threading

EXTRAS = {"plot": "matplotlib", "sklearn": "scikit-learn scipy", "scipy": "scipy", "umap": "umap-learn",
          "dask": "dask distributed", "gpu-cuda12": "cupy-cuda12x", "gpu-cuda13": "cupy-cuda13x"}


def install_hint(extra: str) -> str:
    """What to type for ``extra``.

    >>> install_hint("plot")
    "pip install matplotlib (or pip install -e '.[plot]' in the bigknn checkout)"
    """
    return f"pip install {EXTRAS[extra]} (or pip install -e '.[{extra}]' in the bigknn checkout)"


def import_ahead(module: str) -> None:
    """Start importing ``module`` in a background thread, so that its import (pyarrow's takes a good part of a
    second) overlaps the caller's own work; a module that is not installed is left for the caller's own
    import to report."""

    def load() -> None:
        try:
            importlib.import_module(module)
        except ImportError:
            pass

    threading.Thread(target=load, name=f"import-{module}", daemon=True).start()
