"""The robust private fit on noisy sufficient statistics (estimators and auxiliary search)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..privacy import SecureRandom
from ._bayes import fixed_precision_posterior, gamma_prior_posterior_mean
from ._preprocess import project
from ._statistics import empty_statistics, laplace_scales, perturb, sensitivities, sufficient_statistics

STATISTICS = ("xx", "xy", "yy")


def _used_split(split: tuple[float, float, float], prior: str) -> dict[str, float]:
    """Return the budget fractions actually spent: ``yy`` is only released for the Gamma prior."""
    split = tuple(float(p) for p in split)
    if len(split) != 3 or any(p <= 0 for p in split) or not np.isclose(sum(split), 1.0):
        raise ValueError(f"budget_split must be three positive fractions summing to 1, got {split}.")
    if prior == "gamma":
        return dict(zip(STATISTICS, split, strict=True))
    total = split[0] + split[1]
    return {"xx": split[0] / total, "xy": split[1] / total}


def _fit_private_mean(
    X_priv: np.ndarray,
    y_priv: np.ndarray,
    X_pub: np.ndarray,
    y_pub: np.ndarray,
    *,
    epsilon: float,
    bound_x: float,
    bound_y: float,
    split: tuple[float, float, float],
    row_norm: float,
    prior: str,
    rng: SecureRandom,
    prior_precision: float = 1.0,
    noise_precision: float = 1.0,
    details: dict[str, Any] | None = None,
) -> np.ndarray:
    """Project, release noisy statistics of the private part, add exact public ones, solve."""
    d = X_priv.shape[1]
    used = _used_split(split, prior)
    sens = sensitivities(d, bound_x, bound_y, row_norm)
    scales = laplace_scales(sens, epsilon, used)
    private = sufficient_statistics(project(X_priv, bound_x), project(y_priv, bound_y))
    noisy = perturb(private, scales, rng)
    public = sufficient_statistics(X_pub, y_pub) if X_pub.shape[0] else empty_statistics(d)
    combined = noisy + public
    if details is not None:
        details.update(sensitivities=sens, laplace_scales=scales, budget_split=used)
    if prior == "fixed":
        return fixed_precision_posterior(combined.xx, combined.xy, prior_precision, noise_precision)[0]
    return gamma_prior_posterior_mean(
        combined.xx, combined.xy, combined.yy, combined.n, random_state=rng.seed()
    )
