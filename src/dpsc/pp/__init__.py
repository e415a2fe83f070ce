"""Preprocessing: scanpy-style functions that prepare an AnnData for dpsc."""

from ._partition import partition

__all__ = ["partition"]
