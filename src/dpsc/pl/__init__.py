"""Plotting: scanpy-style functions (``ax=``, ``show=``, ``save=``; Axes returned if not shown)."""

from ._audit import audit
from ._embedding import embedding
from ._privacy import privacy

__all__ = ["audit", "embedding", "privacy"]
