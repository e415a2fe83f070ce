"""User-facing models (scvi-tools ``BaseModelClass`` subclasses) and shared-model loaders."""

from ._dcan_privacy import DEFAULT_KMEANS_OPTIONS, DEFAULT_PLAN_OPTIONS, RELEASE_KINDS, planned_step_counts
from ._dpdcan import DPDCAN
from ._shared import SharedEncoder

__all__ = [
    "DEFAULT_KMEANS_OPTIONS",
    "DEFAULT_PLAN_OPTIONS",
    "DPDCAN",
    "RELEASE_KINDS",
    "SharedEncoder",
    "planned_step_counts",
]
