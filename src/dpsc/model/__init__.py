"""User-facing models (scvi-tools ``BaseModelClass`` subclasses) and shared-model loaders."""

from ._dpdcan import DPDCAN
from ._shared import SharedEncoder

__all__ = ["DPDCAN", "SharedEncoder"]
