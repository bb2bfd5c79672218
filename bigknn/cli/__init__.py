"""The ``bigknn`` command line."""

from bigknn.cli.app import cli, main

__all__ = ["cli", "main"]
