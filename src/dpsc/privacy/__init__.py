"""Privacy: the DP-SGD engine, secret noise, accounting, records and the per-AnnData ledger."""

from ._accounting import (
    ACCOUNTANTS,
    calibrate_noise_multiplier,
    epsilon_curve,
    make_accountant,
    spent_epsilon,
    split_budget,
)
from ._distributed import broadcast_from_rank_zero, is_distributed, sum_over_ranks, world
from ._engine import DPSGDEngine, DPSGDSettings
from ._frequency import dp_cluster_frequency
from ._kmeans import dp_kmeans_centroids, kmeans_release_steps
from ._ledger import (
    BudgetExceededError,
    check_budget,
    get_record,
    ledger_frame,
    set_budget,
    spent,
    write_result,
)
from ._noise import NoiseSource, secure_seed
from ._record import (
    COMMON_NOT_COVERED,
    PrivacyRecord,
    build_statement,
    estimator_record,
    gaussian_release_record,
    no_guarantee_record,
    planned_pure_record,
)

__all__ = [
    "ACCOUNTANTS",
    "COMMON_NOT_COVERED",
    "BudgetExceededError",
    "DPSGDEngine",
    "DPSGDSettings",
    "NoiseSource",
    "PrivacyRecord",
    "broadcast_from_rank_zero",
    "build_statement",
    "calibrate_noise_multiplier",
    "check_budget",
    "dp_cluster_frequency",
    "dp_kmeans_centroids",
    "epsilon_curve",
    "estimator_record",
    "gaussian_release_record",
    "get_record",
    "is_distributed",
    "kmeans_release_steps",
    "ledger_frame",
    "make_accountant",
    "no_guarantee_record",
    "planned_pure_record",
    "secure_seed",
    "set_budget",
    "spent",
    "spent_epsilon",
    "split_budget",
    "sum_over_ranks",
    "world",
    "write_result",
]
