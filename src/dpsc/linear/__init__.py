"""Private linear regression from perturbed sufficient statistics (drug-sensitivity prediction)."""

from ._auxiliary import choose_bounds_and_split, synthetic_auxiliary
from ._bayes import fixed_precision_posterior, gamma_prior_posterior_mean, nearest_psd
from ._estimators import (
    BayesianLR,
    FunctionalMechanismLR,
    LassoLR,
    OutputPerturbationLR,
    RobustPrivateLR,
)
from ._metrics import null_pc_sd, probabilistic_c_index, spearman, wpc_index
from ._preprocess import normalise_rows, project
from ._statistics import Statistics, laplace_scales, perturb, sensitivities, sufficient_statistics

__all__ = [
    "BayesianLR",
    "FunctionalMechanismLR",
    "LassoLR",
    "OutputPerturbationLR",
    "RobustPrivateLR",
    "Statistics",
    "choose_bounds_and_split",
    "fixed_precision_posterior",
    "gamma_prior_posterior_mean",
    "laplace_scales",
    "nearest_psd",
    "normalise_rows",
    "null_pc_sd",
    "perturb",
    "probabilistic_c_index",
    "project",
    "sensitivities",
    "spearman",
    "sufficient_statistics",
    "synthetic_auxiliary",
    "wpc_index",
]
