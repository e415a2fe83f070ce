"""Datasets: a small real count matrix shipped with dpsc and readers for benchmark files."""

from ._embedded import pbmc4k
from ._readers import read_h5

__all__ = ["pbmc4k", "read_h5"]
