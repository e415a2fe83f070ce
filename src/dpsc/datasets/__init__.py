"""Datasets: a small real count matrix shipped with dpsc and readers for benchmark files."""

from ._embedded import gdsc_subset, pbmc4k
from ._gdsc import read_gdsc
from ._readers import read_h5

__all__ = ["gdsc_subset", "pbmc4k", "read_gdsc", "read_h5"]
