"""Runs on a Dask cluster (``--scheduler``): ``connect`` picks the cluster and yields its executor, ``executor`` runs a write path's
tasks there from the client, ``tasks`` is what the workers run. Importing this package imports no dask."""

from bigknn.engine.dask.connect import dask_executor

__all__ = ["dask_executor"]
