"""Preprocessing: scanpy-style functions that prepare an AnnData for dpsc."""

from ._dp_hvg import highly_variable_genes
from ._dp_pca import pca
from ._partition import partition

__all__ = ["highly_variable_genes", "partition", "pca"]
