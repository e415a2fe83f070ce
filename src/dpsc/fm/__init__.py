"""Functional mechanism: objective perturbation for private deep belief networks (pCDBN).

Instead of noising gradients at every step, the data enter the training objective only through
a few coefficients that are released once with Laplace noise; training on the perturbed
objective is post-processing, so the privacy cost does not grow with the number of epochs.
"""

from ._approx import (
    APPROXIMATIONS,
    PolynomialApproximation,
    approximate_softplus,
    chebyshev_error_bound,
    sigmoid_derivative_polynomials,
    softplus,
)
from ._dbn import PrivateDBN, image_patches, max_pool, softmax_features
from ._dpsgd import DPSGDClassifier
from ._moments import check_patch_bound, moment_sensitivity, moment_tensors, release_moments, scale_patches
from ._rbm import PrivateRBM, contract_powers
from ._softmax import PrivateSoftmax, softmax_sensitivity

__all__ = [
    "APPROXIMATIONS",
    "DPSGDClassifier",
    "PolynomialApproximation",
    "PrivateDBN",
    "PrivateRBM",
    "PrivateSoftmax",
    "approximate_softplus",
    "chebyshev_error_bound",
    "check_patch_bound",
    "contract_powers",
    "image_patches",
    "max_pool",
    "moment_sensitivity",
    "moment_tensors",
    "release_moments",
    "scale_patches",
    "sigmoid_derivative_polynomials",
    "softmax_features",
    "softmax_sensitivity",
    "softplus",
]
