"""The ``simpipe`` command: a thin layer over the Python API (``main`` is the console script)."""

from simpipe.cli.main import main

__all__ = ["main"]
