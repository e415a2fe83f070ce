r"""Choosing the projection bounds and the budget split on synthetic auxiliary data.

Honkela et al. (2018) choose :math:`(\omega_x, \omega_y)` and :math:`(p_1, p_2, p_3)` on
synthetic data of the same size as the private data, never on the private data. The only
things read from the real problem are :math:`n`, :math:`d`, the number of public samples and
:math:`\varepsilon`, all of which are public.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import product

import numpy as np
from scipy.stats import spearmanr

from .._api import renamed_arguments
from ..privacy import SecureRandom, derive_key
from ._private_fit import _fit_private_mean

DEFAULT_OMEGAS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
DEFAULT_SPLITS = (
    (0.35, 0.60, 0.05),
    (0.20, 0.75, 0.05),
    (0.50, 0.45, 0.05),
    (0.65, 0.30, 0.05),
)


def synthetic_auxiliary(
    n: int, d: int, rng: np.random.Generator, prior_precision: float = 1.0, noise_precision: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    r"""Draw synthetic regression data of the paper's generative model.

    :math:`x \sim N(0, I_d)`, :math:`\beta \sim N(0, I/\lambda_0)`,
    :math:`y \mid x \sim N(x^\top\beta, 1/\lambda)`.

    Rows of ``X`` are returned unit-normalised and ``y`` standardised, the same preprocessing
    the real data goes through.
    """
    X = rng.standard_normal((n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    # With unit-norm rows E[x_j^2] = 1/d, so Var(x^T beta) = 1/lambda_0 as before normalising.
    beta = rng.normal(0.0, 1.0 / np.sqrt(prior_precision), size=d)
    y = X @ beta + rng.normal(0.0, 1.0 / np.sqrt(noise_precision), size=n)
    y = (y - y.mean()) / y.std()
    return X, y


@renamed_arguments("dpsc.linear.choose_bounds_and_split", seed="random_state")
@lru_cache(maxsize=256)
def choose_bounds_and_split(
    n_private: int,
    d: int,
    epsilon: float,
    *,
    n_public: int = 0,
    splits: tuple[tuple[float, float, float], ...] | None = None,
    omegas: tuple[float, ...] = DEFAULT_OMEGAS,
    n_repeats: int = 10,
    n_test: int = 500,
    random_state: int = 0,
) -> tuple[tuple[float, float], tuple[float, float, float], float]:
    r"""Grid-search :math:`(\omega_x, \omega_y)` (and the split) for the best synthetic Spearman.

    Candidate bounds are :math:`B_x = \omega_x/\sqrt d` (the standard deviation of an entry of a
    unit-norm sample is :math:`1/\sqrt d`) and :math:`B_y = \omega_y` (standardised target).
    Each candidate is scored by the mean Spearman correlation of the fixed-precision posterior
    mean over ``n_repeats`` synthetic data sets. The random draws are shared by all candidates.
    The result is a deterministic function of public quantities, so it is cached.

    Returns ``((omega_x, omega_y), split, score)``.
    """
    split_grid = [tuple(s) for s in (splits if splits is not None else DEFAULT_SPLITS)]
    rng = np.random.default_rng(random_state)
    draws = []
    for _ in range(n_repeats):
        X, y = synthetic_auxiliary(n_private + n_public + n_test, d, rng)
        noise_seed = int(rng.integers(2**31))
        draws.append((X, y, noise_seed))
    best: tuple[float, tuple[float, float], tuple[float, float, float]] = (-np.inf, (1.0, 1.0), split_grid[0])
    for (wx, wy), split in product(product(omegas, omegas), split_grid):
        scores = []
        for X, y, noise_seed in draws:
            pub = slice(0, n_public)
            priv = slice(n_public, n_public + n_private)
            test = slice(n_public + n_private, None)
            beta = _fit_private_mean(
                X[priv],
                y[priv],
                X[pub],
                y[pub],
                epsilon=epsilon,
                bound_x=wx / np.sqrt(d),
                bound_y=wy,
                split=split,
                row_norm=1.0,
                prior="fixed",
                rng=SecureRandom(derive_key("auxiliary", noise_seed)),
            )
            rho = spearmanr(X[test] @ beta, y[test]).statistic
            scores.append(0.0 if np.isnan(rho) else rho)
        score = float(np.mean(scores))
        if score > best[0]:
            best = (score, (wx, wy), split)
    return best[1], best[2], best[0]
