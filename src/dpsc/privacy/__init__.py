"""Privacy: calibration, accounting, DP k-means, and what a guarantee covers."""

from ._accounting import (
    ACCOUNTANTS,
    calibrate_noise_multiplier,
    epsilon_curve,
    make_accountant,
    spent_epsilon,
)
from ._frequency import dp_cluster_frequency
from ._kmeans import dp_kmeans_centroids, kmeans_release_steps
from ._statement import PrivacyRecord, estimator_statement, privacy_statement

__all__ = [
    "ACCOUNTANTS",
    "PrivacyRecord",
    "calibrate_noise_multiplier",
    "dp_cluster_frequency",
    "dp_kmeans_centroids",
    "epsilon_curve",
    "estimator_statement",
    "kmeans_release_steps",
    "make_accountant",
    "privacy_statement",
    "spent_epsilon",
]
