"""Runs on a Dask cluster (``--scheduler``): ``connect`` picks the cluster, ``executor`` runs a write path's
tasks there from the client, ``tasks`` is what the workers run. Importing this package imports no dask."""

from bigknn.cluster.connect import active, use_scheduler

__all__ = ["active", "use_scheduler"]
