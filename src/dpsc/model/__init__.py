"""User-facing models (scvi-tools ``BaseModelClass`` subclasses) and shared-model loaders."""

from ._dcan_privacy import DEFAULT_KMEANS_OPTIONS, DEFAULT_PLAN_OPTIONS, RELEASE_KINDS, planned_step_counts

# dpsc.tl's interface to the fit's plan (not in __all__)
from ._dcan_privacy import MODEL_GENES as MODEL_GENES
from ._dcan_privacy import FitPlan as FitPlan
from ._dcan_privacy import PlannedTraining as PlannedTraining
from ._dcan_privacy import TrainSettings as TrainSettings
from ._dcan_privacy import plan_fit as plan_fit
from ._dcan_reference import PRETRAIN_EPOCHS as PRETRAIN_EPOCHS
from ._dcan_reference import REFERENCE_MODEL as REFERENCE_MODEL
from ._dcan_reference import load_pretrained as load_pretrained
from ._dcan_reference import points_anndata as points_anndata
from ._dcan_reference import pretrained_state as pretrained_state
from ._dcan_reference import pretraining_key as pretraining_key
from ._dcan_reference import save_pretrained as save_pretrained
from ._dcan_start import choose_partition as choose_partition
from ._dcan_start import release_before_training as release_before_training
from ._dcan_start import start_model_from as start_model_from
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
