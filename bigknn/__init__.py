"""bigknn: approximate k-NN graphs for vector sets far beyond GPU memory (GNND + GGM)."""

__version__ = "0.1.0"
