"""Private softmax layer: functional mechanism on the second-order Taylor expansion of cross-entropy."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..privacy import NoiseSource, SecureRandom, laplace_release


def softmax_sensitivity() -> float:
    """L1 sensitivity of ``(A, H) = (Σ_t y_t a_tᵀ, Σ_t a_t a_tᵀ)`` for ``‖a_t‖_1 ≤ 1``, one-hot ``y_t``.

    One sample contributes ``‖y aᵀ‖_1 = ‖a‖_1 ≤ 1`` and ``‖a aᵀ‖_1 = ‖a‖_1² ≤ 1``; replacing it
    moves the pair by at most ``Δ = 2(1 + 1) = 4``. (``s = Σ_t a_t = Aᵀ1`` needs no extra budget.)
    """
    return 4.0


class PrivateSoftmax:
    r"""Multinomial logistic regression with ε-DP coefficients (Zhang et al. 2012; Phan et al. 2016).

    With scores ``S = W a`` (``K`` classes), the per-sample cross-entropy
    ``−yᵀS + log Σ_k e^{S_k}`` is expanded to second order at ``S = 0``:

    .. math:: \log Σ_k e^{S_k} ≈ \log K + \bar S + \tfrac{1}{2K} ‖J S‖²,
              \qquad J = I − \tfrac1K 11ᵀ,

    so the objective over the data is
    ``−⟨W, A⟩ + (1/K) 1ᵀ W s + (1/2K) tr(J W H Wᵀ) + (λ/2)‖W‖²``, with ``A``, ``s``, ``H`` as in
    :func:`softmax_sensitivity`. ``A`` and ``H`` are released once with ``Lap(Δ/ε)`` noise; ``H̃`` is
    symmetrised and projected onto the PSD cone (post-processing), and the minimiser with ``1ᵀW = 0``
    is closed-form: ``W = (Ã − 1 s̃ᵀ/K)(H̃/K + λI)^{-1}``.

    ``λ`` defaults to the typical spectral norm of the noise in ``H̃/K``, ``√2 b √m / K`` with ``b`` the
    Laplace scale and ``m`` the feature dimension: a function of public quantities only.
    """

    def __init__(
        self,
        *,
        epsilon: float = 0.5,
        regularization: float | None = None,
        random_state: int = 0,
        noise_seed: int | None = None,
    ) -> None:
        self.epsilon = epsilon
        self.regularization = regularization
        self.random_state = random_state
        self.noise_seed = noise_seed

    def fit(
        self, features: np.ndarray, labels: np.ndarray, n_classes: int, rng: SecureRandom | None = None
    ) -> PrivateSoftmax:
        """``features`` ``(n, m)`` with ``‖a_t‖_1 ≤ 1``; ``labels`` integers in ``[0, n_classes)``."""
        a = np.asarray(features, dtype=float)
        if np.abs(a).sum(1).max(initial=0.0) > 1.0 + 1e-9:
            raise ValueError("Softmax features violate ‖a‖_1 ≤ 1, the bound the sensitivity assumes.")
        if not self.epsilon > 0:
            raise ValueError(f"epsilon must be > 0, got {self.epsilon}.")
        rng = rng if rng is not None else NoiseSource(self.noise_seed).stream("fm.softmax")
        onehot = np.eye(n_classes)[np.asarray(labels, dtype=int)]
        self.laplace_scale_ = softmax_sensitivity() / self.epsilon
        exact_a, exact_h = onehot.T @ a, a.T @ a
        noisy = laplace_release(np.concatenate([exact_a.ravel(), exact_h.ravel()]), self.laplace_scale_, rng)
        A, H = noisy[: exact_a.size].reshape(exact_a.shape), noisy[exact_a.size :].reshape(exact_h.shape)
        H = (H + H.T) / 2
        eigval, eigvec = np.linalg.eigh(H)
        H = (eigvec * np.clip(eigval, 0.0, None)) @ eigvec.T
        m = a.shape[1]
        lam = self.regularization
        if lam is None:
            lam = np.sqrt(2.0) * self.laplace_scale_ * np.sqrt(m) / n_classes
        self.regularization_ = float(lam)
        s = A.sum(0)
        self.coef_ = (A - np.outer(np.ones(n_classes), s) / n_classes) @ np.linalg.inv(
            H / n_classes + lam * np.eye(m)
        )
        self.n_classes_ = n_classes
        self.spent_epsilon_ = float(self.epsilon)
        return self

    def predict_proba(self, features: np.ndarray) -> np.ndarray:
        scores = np.asarray(features, dtype=float) @ self.coef_.T
        scores -= scores.max(1, keepdims=True)
        prob = np.exp(scores)
        return prob / prob.sum(1, keepdims=True)

    def privacy_record(self) -> dict[str, Any]:
        return {
            "epsilon": self.spent_epsilon_,
            "mechanism": "Laplace on (Σ y aᵀ, Σ a aᵀ) of the 2nd-order Taylor cross-entropy",
            "sensitivity": softmax_sensitivity(),
            "laplace_scale": self.laplace_scale_,
            "regularization": self.regularization_,
        }
