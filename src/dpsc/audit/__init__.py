"""Membership-inference audits of trained models (what the shared encoder leaks in practice)."""

from ._features import encoder_features, reconstruction_loss
from ._metrics import attack_metrics, best_thresholds, clopper_pearson, epsilon_lower_bound

__all__ = [
    "attack_metrics",
    "best_thresholds",
    "clopper_pearson",
    "encoder_features",
    "epsilon_lower_bound",
    "reconstruction_loss",
]
