"""Preprocessing: scanpy-style functions that prepare an AnnData for dpsc."""

from ._dp_pca import pca
from ._partition import partition

__all__ = ["partition", "pca"]
