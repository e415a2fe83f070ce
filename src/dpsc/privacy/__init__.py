"""Privacy: secure noise, the one release shape and its mechanisms, DP-SGD, accounting, records, ledger.

Every proven release is a :class:`GaussianSum` (per-cell contributions with a stated bound, a sum
over cells or over sites, lattice-encoded discrete Gaussian noise); the mechanisms below state
their contribution maps and post-processing: DP PCA (:mod:`._pca`), DP gene statistics
(:mod:`._hvg`), DP k-means (:mod:`._kmeans`), DEC cluster frequencies (:mod:`._frequency`).
DP-SGD steps go through :class:`DPSGDEngine`. Every call that reads cells books its record in the
cells' ledger through :func:`spending`.
"""

from ._accounting import (
    ACCOUNTANTS,
    calibrate_noise_multiplier,
    epsilon_curve,
    history_epsilon,
    make_accountant,
    spent_epsilon,
    split_budget,
)
from ._distributed import broadcast_from_rank_zero, is_distributed, sum_over_ranks, world
from ._engine import DPSGDEngine, DPSGDSettings, poisson_steps
from ._frequency import dp_cluster_frequency, frequency_release
from ._kmeans import (
    Assignment,
    central_table_release,
    dp_kmeans_centroids,
    kmeans_release_steps,
    kmeans_table,
    split_table,
    table_release,
)
from ._ledger import (
    BudgetExceededError,
    FileLedger,
    Spending,
    Spent,
    attach_ledger,
    book,
    check_budget,
    concat,
    get_record,
    ledger_frame,
    set_budget,
    spending,
    spent,
    write_record,
    write_result,
)
from ._noise import NoiseSource
from ._random import SecureRandom, secure_key
from ._record import (
    ADD_REMOVE,
    COMMON_NOT_COVERED,
    N_PUBLIC,
    REPLACE_ONE,
    PrivacyRecord,
    build_statement,
    estimator_record,
    gaussian_release_record,
    no_guarantee_record,
    planned_pure_record,
)
from ._release import GaussianSum, LaplaceSum, distributed_slack, laplace_release

__all__ = [
    "ACCOUNTANTS",
    "ADD_REMOVE",
    "COMMON_NOT_COVERED",
    "N_PUBLIC",
    "REPLACE_ONE",
    "Assignment",
    "BudgetExceededError",
    "DPSGDEngine",
    "DPSGDSettings",
    "FileLedger",
    "GaussianSum",
    "LaplaceSum",
    "NoiseSource",
    "PrivacyRecord",
    "SecureRandom",
    "Spending",
    "Spent",
    "attach_ledger",
    "book",
    "broadcast_from_rank_zero",
    "build_statement",
    "calibrate_noise_multiplier",
    "central_table_release",
    "check_budget",
    "concat",
    "distributed_slack",
    "dp_cluster_frequency",
    "dp_kmeans_centroids",
    "epsilon_curve",
    "estimator_record",
    "frequency_release",
    "gaussian_release_record",
    "get_record",
    "history_epsilon",
    "is_distributed",
    "kmeans_release_steps",
    "kmeans_table",
    "laplace_release",
    "ledger_frame",
    "make_accountant",
    "no_guarantee_record",
    "planned_pure_record",
    "poisson_steps",
    "secure_key",
    "set_budget",
    "spending",
    "spent",
    "spent_epsilon",
    "split_budget",
    "split_table",
    "sum_over_ranks",
    "table_release",
    "world",
    "write_record",
    "write_result",
]
