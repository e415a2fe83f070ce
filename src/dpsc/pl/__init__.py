"""Plotting: scanpy-style functions (``ax=``, ``show=``, ``save=``; Axes returned if not shown)."""

from ._audit import audit
from ._embedding import embedding
from ._federated import federated
from ._ledger import ledger
from ._privacy import privacy
from ._privacy_utility import privacy_utility

__all__ = ["audit", "embedding", "federated", "ledger", "privacy", "privacy_utility"]
