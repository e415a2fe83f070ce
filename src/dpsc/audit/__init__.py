"""Audits: one-run canary audits of the DP-SGD engine, and membership inference on trained models."""

from ._canaries import GradientCanaries, canary_log_likelihood_ratio
from ._features import encoder_features, reconstruction_loss
from ._gradient_audit import audit_schedule as audit_schedule  # for dpsc.tl (not in __all__)
from ._gradient_audit import gradient_canary_run
from ._input_audit import CANARY_DONOR_CELLS as CANARY_DONOR_CELLS  # for dpsc.tl (not in __all__)
from ._input_audit import input_canary_run, make_canary_donors, make_input_canaries
from ._metrics import attack_metrics, best_thresholds, clopper_pearson, epsilon_lower_bound
from ._one_run import one_run_bound
from ._shadow import ATTACKS as ATTACKS  # for dpsc.tl (not in __all__)
from ._shadow import shadow_audit as shadow_audit

__all__ = [
    "GradientCanaries",
    "attack_metrics",
    "best_thresholds",
    "canary_log_likelihood_ratio",
    "clopper_pearson",
    "encoder_features",
    "epsilon_lower_bound",
    "gradient_canary_run",
    "input_canary_run",
    "make_canary_donors",
    "make_input_canaries",
    "one_run_bound",
    "reconstruction_loss",
]
