"""Private linear regression estimators with scikit-learn's interface.

All estimators share one preprocessing (Honkela et al. 2018, "Methods"): genes are centred with
the mean of the *public* samples (no centring without public samples), every sample is scaled
to unit L2 norm, and the target is standardised with a centre and scale taken from the public
samples or given by the user. None of these constants is computed from private samples.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin

from ..privacy import NoiseSource, SecureRandom, derive_key, estimator_record
from ._auxiliary import choose_bounds_and_split, synthetic_auxiliary
from ._bayes import fixed_precision_posterior
from ._preprocess import normalise_rows, project
from ._private_fit import _fit_private_mean, _used_split
from ._statistics import sufficient_statistics


def _check_epsilon(epsilon: float) -> float:
    epsilon = float(epsilon)
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0 (np.inf for no noise), got {epsilon}.")
    return epsilon


def _check_xy(X: Any, y: Any, name: str = "X") -> tuple[np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float).ravel()
    if X.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (samples × features), got shape {X.shape}.")
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"{name} has {X.shape[0]} samples but its target has {y.shape[0]}.")
    if not (np.all(np.isfinite(X)) and np.all(np.isfinite(y))):
        raise ValueError(f"{name} or its target contains NaN or infinite values; remove those samples first.")
    return X, y


class _NormalisedLinearModel(RegressorMixin, BaseEstimator):
    """Shared preprocessing and prediction; subclasses implement ``_fit_normalised``."""

    #: How the noise is added, for the privacy statement ("" for the non-private estimators).
    _mechanism = ""

    def _preprocess_fit(
        self, X: Any, y: Any, X_public: Any, y_public: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        X, y = _check_xy(X, y)
        if X.shape[0] < 2:
            raise ValueError(f"Need at least 2 private samples, got {X.shape[0]}.")
        if X_public is None:
            X_public, y_public = np.zeros((0, X.shape[1])), np.zeros(0)
        X_public, y_public = _check_xy(X_public, y_public, "X_public")
        if X_public.shape[1] != X.shape[1]:
            raise ValueError(f"X_public has {X_public.shape[1]} features, X has {X.shape[1]}.")
        n_pub = X_public.shape[0]
        self.x_center_ = X_public.mean(0) if n_pub else None
        y_center, y_scale = getattr(self, "y_center", None), getattr(self, "y_scale", None)
        if y_center is None:
            if n_pub < 1:
                raise ValueError(
                    "Without public samples the target centre cannot be estimated without spending "
                    "privacy budget; pass y_center= (a data-independent value) or public samples."
                )
            y_center = float(y_public.mean())
        if y_scale is None:
            if n_pub < 2 or y_public.std() == 0:
                raise ValueError(
                    "Without at least 2 public samples with distinct targets the target scale is unknown; "
                    "pass y_scale= (a data-independent value) or more public samples."
                )
            y_scale = float(y_public.std())
        self.y_center_, self.y_scale_ = float(y_center), float(y_scale)
        self.n_features_in_ = X.shape[1]
        Xn = normalise_rows(X, self.x_center_)
        Xp = normalise_rows(X_public, self.x_center_)
        return Xn, (y - self.y_center_) / self.y_scale_, Xp, (y_public - self.y_center_) / self.y_scale_

    def fit(self, X: Any, y: Any, X_public: Any = None, y_public: Any = None) -> _NormalisedLinearModel:
        """Fit on private ``(X, y)`` and, optionally, exact public ``(X_public, y_public)``."""
        Xn, yn, Xp, yp = self._preprocess_fit(X, y, X_public, y_public)
        self.n_private_, self.n_public_ = int(Xn.shape[0]), int(Xp.shape[0])
        self.coef_ = np.asarray(self._fit_normalised(Xn, yn, Xp, yp), dtype=float)
        return self

    def privacy_record(self) -> dict[str, Any]:
        """ε spent by the last ``fit`` and a plain statement of what it covers (pure ε-DP, δ = 0)."""
        if not hasattr(self, "coef_"):
            raise RuntimeError(f"This {type(self).__name__} is not fitted yet; call fit first.")
        epsilon = float(self.spent_epsilon_)
        public = f"the {self.n_public_} public rows (used exactly)" if self.n_public_ else ""
        return estimator_record(
            tool=type(self).__name__,
            epsilon=epsilon if self._mechanism else None,
            delta=0.0,
            n_rows=self.n_private_,
            mechanism=self._mechanism,
            covered="the coefficients",
            noise_seed=getattr(self, "noise_seed", None),
            extra_not_covered=public,
            details={
                "mechanism": self._mechanism or "none",
                "n_private": self.n_private_,
                "n_public": self.n_public_,
            },
        ).to_dict()

    def predict(self, X: Any) -> np.ndarray:
        r"""Predict the target in its original units: :math:`\hat y = s_y\, \tilde x^\top \beta + c_y`."""
        if not hasattr(self, "coef_"):
            raise RuntimeError(f"This {type(self).__name__} is not fitted yet; call fit first.")
        X = np.asarray(X, dtype=float)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise ValueError(f"X must have shape (n, {self.n_features_in_}), got {X.shape}.")
        return normalise_rows(X, self.x_center_) @ self.coef_ * self.y_scale_ + self.y_center_

    def _fit_normalised(self, X: np.ndarray, y: np.ndarray, Xp: np.ndarray, yp: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class RobustPrivateLR(_NormalisedLinearModel):
    r"""Robust private linear regression (Honkela et al. 2018): projection + Laplace sufficient statistics.

    1. Preprocess (see the module docstring); rows have :math:`\lVert x\rVert_2 \le 1`.
    2. Project :math:`x_{ij} \leftarrow \max(-B_x, \min(x_{ij}, B_x))`, :math:`y_i \leftarrow
       \max(-B_y, \min(y_i, B_y))` with :math:`B_x = \omega_x/\sqrt d`, :math:`B_y = \omega_y`.
    3. Release :math:`X^\top X`, :math:`X^\top y` (and :math:`y^\top y` for the Gamma prior) of the
       private samples with Laplace noise of scale :math:`\Delta_k/(p_k\varepsilon)`
       (sensitivities in :func:`dpsc.linear.sensitivities`); ε-DP by sequential composition.
       With ``prior="fixed"`` :math:`y^\top y` is not needed, so its share is given to the other two.
    4. Add the exact statistics of the public samples and solve Bayesian linear regression
       (fixed precisions, or Gamma(2, 2) priors fitted by variational inference).

    Parameters
    ----------
    epsilon
        Total budget ε (pure ε-DP; ``np.inf`` disables the noise, not the projection).
    budget_split
        ``(p1, p2, p3)`` for :math:`(X^\top X, X^\top y, y^\top y)`, or ``"auto"`` to choose it
        together with the bounds on synthetic auxiliary data.
    bounds
        ``"auto"`` (chosen on synthetic auxiliary data of the same n, d) or ``(B_x, B_y)`` in the
        normalised units (unit-norm samples, standardised target).
    prior
        ``"fixed"`` (precisions ``prior_precision``, ``noise_precision``) or ``"gamma"``.
    y_center, y_scale
        Target centre/scale; default from the public samples.
    """

    _mechanism = "Laplace noise on the projected sufficient statistics (Honkela et al. 2018)"

    def __init__(
        self,
        epsilon: float = 2.0,
        *,
        budget_split: str | tuple[float, float, float] = (0.35, 0.60, 0.05),
        bounds: str | tuple[float, float] = "auto",
        prior: str = "fixed",
        prior_precision: float = 1.0,
        noise_precision: float = 1.0,
        y_center: float | None = None,
        y_scale: float | None = None,
        random_state: int = 0,
        noise_seed: int | None = None,
    ) -> None:
        self.epsilon = epsilon
        self.budget_split = budget_split
        self.bounds = bounds
        self.prior = prior
        self.prior_precision = prior_precision
        self.noise_precision = noise_precision
        self.y_center = y_center
        self.y_scale = y_scale
        self.random_state = random_state
        self.noise_seed = noise_seed

    def _fit_normalised(self, X: np.ndarray, y: np.ndarray, Xp: np.ndarray, yp: np.ndarray) -> np.ndarray:
        epsilon = _check_epsilon(self.epsilon)
        if self.prior not in ("fixed", "gamma"):
            raise ValueError(f"prior must be 'fixed' or 'gamma', got {self.prior!r}.")
        n, d = X.shape
        if isinstance(self.budget_split, str) and self.budget_split != "auto":
            raise ValueError(f"budget_split must be 'auto' or a tuple, got {self.budget_split!r}.")
        if isinstance(self.bounds, str) and self.bounds != "auto":
            raise ValueError(f"bounds must be 'auto' or (B_x, B_y), got {self.bounds!r}.")
        split = None if isinstance(self.budget_split, str) else tuple(self.budget_split)
        if split is not None:
            _used_split(split, self.prior)  # validate before the search
        if isinstance(self.bounds, str) or split is None:
            eps_aux = epsilon if np.isfinite(epsilon) else 1e6
            (wx, wy), best_split, score = choose_bounds_and_split(
                n, d, eps_aux, n_public=Xp.shape[0], splits=None if split is None else (split,)
            )
            self.auxiliary_score_ = score
            split = best_split
            bx, by = (wx / np.sqrt(d), wy) if isinstance(self.bounds, str) else self.bounds
        else:
            bx, by = self.bounds
        self.bounds_ = (float(bx), float(by))
        details: dict[str, Any] = {}
        rng = NoiseSource(self.noise_seed).stream("linear")
        coef = _fit_private_mean(
            X,
            y,
            Xp,
            yp,
            epsilon=epsilon,
            bound_x=bx,
            bound_y=by,
            split=split,
            row_norm=1.0,
            prior=self.prior,
            rng=rng,
            prior_precision=self.prior_precision,
            noise_precision=self.noise_precision,
            details=details,
        )
        self.budget_split_ = details["budget_split"]
        self.sensitivities_ = details["sensitivities"]
        self.laplace_scales_ = details["laplace_scales"]
        self.spent_epsilon_ = float(sum(self.budget_split_.values()) * epsilon)
        return coef


class OutputPerturbationLR(_NormalisedLinearModel):
    r"""Ridge regression released by output perturbation (Chaudhuri et al. 2011, Alg. 1).

    Minimises :math:`J(\beta) = \frac1N\sum_i \tfrac12 (y_i - \beta^\top x_i)^2 + \tfrac\Lambda2
    \lVert\beta\rVert^2` over projected private and public samples. Because
    :math:`J(\beta^*) \le J(0) \le B_y^2/2`, :math:`\lVert\beta^*\rVert \le B_y/\sqrt\Lambda`, so
    every per-sample loss is :math:`L`-Lipschitz on the feasible set with
    :math:`L = (B_y/\sqrt\Lambda + B_y)\, r`, :math:`r = \min(1, \sqrt d B_x)`, and the minimiser
    has L2 sensitivity :math:`\Delta_2 = 2L/(N\Lambda)` (Chaudhuri et al. Cor. 8). The released
    :math:`\beta^* + b` with density :math:`\propto \exp(-\varepsilon\lVert b\rVert/\Delta_2)`
    (norm :math:`\sim \mathrm{Gamma}(d, \Delta_2/\varepsilon)`, uniform direction) is ε-DP.
    ``regularization="auto"`` chooses :math:`\Lambda` on synthetic auxiliary data.
    """

    _mechanism = "output perturbation of the ridge minimiser (Chaudhuri et al. 2011, Alg. 1)"

    def __init__(
        self,
        epsilon: float = 2.0,
        *,
        bounds: tuple[float, float] = (1.0, 2.0),
        regularization: float | str = "auto",
        y_center: float | None = None,
        y_scale: float | None = None,
        random_state: int = 0,
        noise_seed: int | None = None,
    ) -> None:
        self.epsilon = epsilon
        self.bounds = bounds
        self.regularization = regularization
        self.y_center = y_center
        self.y_scale = y_scale
        self.random_state = random_state
        self.noise_seed = noise_seed

    @staticmethod
    def _release(X, y, epsilon, bx, by, reg, rng) -> np.ndarray:
        n, d = X.shape
        Xc, yc = project(X, bx), project(y, by)
        beta = np.linalg.solve(Xc.T @ Xc + n * reg * np.eye(d), Xc.T @ yc)
        if not np.isfinite(epsilon):
            return beta
        lipschitz = (by / np.sqrt(reg) + by) * min(1.0, np.sqrt(d) * bx)
        delta2 = 2 * lipschitz / (n * reg)
        direction = rng.standard_normal(d)
        direction /= np.linalg.norm(direction)
        return beta + direction * rng.gamma(d, delta2 / epsilon)

    def _fit_normalised(self, X: np.ndarray, y: np.ndarray, Xp: np.ndarray, yp: np.ndarray) -> np.ndarray:
        epsilon = _check_epsilon(self.epsilon)
        bx, by = self.bounds
        Xall, yall = np.vstack([X, Xp]), np.concatenate([y, yp])
        reg = self.regularization
        if reg == "auto":
            reg = _choose_regularization(Xall.shape[0], X.shape[1], epsilon, float(bx), float(by))
        self.regularization_ = float(reg)
        self.spent_epsilon_ = epsilon
        rng = NoiseSource(self.noise_seed).stream("linear")
        return self._release(Xall, yall, epsilon, bx, by, float(reg), rng)


@lru_cache(maxsize=256)
def _choose_regularization(n: int, d: int, epsilon: float, bx: float, by: float) -> float:
    """Pick Λ from a grid by mean synthetic Spearman (public quantities only, so cached)."""
    from scipy.stats import spearmanr

    rng = np.random.default_rng(0)
    draws = [synthetic_auxiliary(n + 500, d, rng) for _ in range(10)]
    best, best_reg = -np.inf, 1.0
    for reg in (0.01, 0.03, 0.1, 0.3, 1.0, 3.0):
        scores = []
        for i, (X, y) in enumerate(draws):
            beta = OutputPerturbationLR._release(
                X[:n], y[:n], epsilon, bx, by, reg, SecureRandom(derive_key(i))
            )
            rho = spearmanr(X[n:] @ beta, y[n:]).statistic
            scores.append(0.0 if np.isnan(rho) else rho)
        if np.mean(scores) > best:
            best, best_reg = float(np.mean(scores)), reg
    return best_reg


class FunctionalMechanismLR(_NormalisedLinearModel):
    """Functional-mechanism linear regression (Zhang et al. 2012) via diffprivlib's ``LinearRegression``.

    The samples are projected onto ``bounds`` first so that diffprivlib's data bounds hold; no
    intercept is fitted (data are centred with public constants). Needs ``pip install "dpsc[baselines]"``.
    """

    _mechanism = "the functional mechanism (Laplace noise on the objective's coefficients, diffprivlib)"

    def __init__(
        self,
        epsilon: float = 2.0,
        *,
        bounds: tuple[float, float] = (1.0, 2.0),
        y_center: float | None = None,
        y_scale: float | None = None,
        random_state: int = 0,
        noise_seed: int | None = None,
    ) -> None:
        self.epsilon = epsilon
        self.bounds = bounds
        self.y_center = y_center
        self.y_scale = y_scale
        self.random_state = random_state
        self.noise_seed = noise_seed

    def _fit_normalised(self, X: np.ndarray, y: np.ndarray, Xp: np.ndarray, yp: np.ndarray) -> np.ndarray:
        try:
            from diffprivlib.models import LinearRegression
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError(
                "FunctionalMechanismLR needs diffprivlib (and scikit-learn < 1.9, which diffprivlib 0.6.6 "
                f"still imports from): pip install 'dpsc[baselines]'. Original error: {err}"
            ) from err
        epsilon = _check_epsilon(self.epsilon)
        bx, by = self.bounds
        Xall = project(np.vstack([X, Xp]), bx)
        yall = project(np.concatenate([y, yp]), by)
        model = LinearRegression(
            epsilon=epsilon,
            bounds_X=(-bx, bx),
            bounds_y=(-by, by),
            fit_intercept=False,
            random_state=self.noise_seed,  # None: diffprivlib draws from a secure source
        )
        model.fit(Xall, yall)
        self.spent_epsilon_ = epsilon
        return np.asarray(model.coef_).ravel()


class BayesianLR(_NormalisedLinearModel):
    """Non-private Bayesian linear regression (fixed precisions) on the same preprocessing."""

    def __init__(
        self,
        *,
        prior_precision: float = 1.0,
        noise_precision: float = 1.0,
        y_center: float | None = None,
        y_scale: float | None = None,
    ) -> None:
        self.prior_precision = prior_precision
        self.noise_precision = noise_precision
        self.y_center = y_center
        self.y_scale = y_scale

    def _fit_normalised(self, X: np.ndarray, y: np.ndarray, Xp: np.ndarray, yp: np.ndarray) -> np.ndarray:
        stats = sufficient_statistics(np.vstack([X, Xp]), np.concatenate([y, yp]))
        self.spent_epsilon_ = float("inf")
        return fixed_precision_posterior(stats.xx, stats.xy, self.prior_precision, self.noise_precision)[0]


class LassoLR(_NormalisedLinearModel):
    """Non-private lasso (scikit-learn ``LassoCV``, 5-fold) on the same preprocessing."""

    def __init__(self, *, y_center: float | None = None, y_scale: float | None = None, random_state: int = 0):
        self.y_center = y_center
        self.y_scale = y_scale
        self.random_state = random_state

    def _fit_normalised(self, X: np.ndarray, y: np.ndarray, Xp: np.ndarray, yp: np.ndarray) -> np.ndarray:
        from sklearn.linear_model import LassoCV

        Xall, yall = np.vstack([X, Xp]), np.concatenate([y, yp])
        model = LassoCV(cv=min(5, Xall.shape[0]), fit_intercept=False, random_state=self.random_state)
        model.fit(Xall, yall)
        self.spent_epsilon_ = float("inf")
        return model.coef_
