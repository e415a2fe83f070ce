"""A private Gaussian–Bernoulli RBM hidden layer trained on a Laplace-perturbed polynomial energy."""

from __future__ import annotations

from math import comb
from typing import Any

import numpy as np
import torch

from ..privacy import NoiseSource, SecureRandom
from ._approx import approximate_softplus, chebyshev_error_bound
from ._moments import check_patch_bound, moment_sensitivity, moment_tensors, release_moments


def contract_powers(moment: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``⟨w_j^{⊗k}, M⟩`` for every row ``w_j`` of ``weights`` (shape ``(m, d)``); ``M`` is ``(d,)*k``."""
    m, d = weights.shape
    out = weights @ moment.reshape(d, -1)  # (m, d^{k-1})
    while out.shape[1] > 1:
        out = torch.einsum("jd,jdr->jr", weights, out.reshape(m, d, -1))
    return out[:, 0]


class PrivateRBM:
    """One private hidden layer (dense, or convolutional as a patch RBM with shared weights).

    Model: Gaussian visible units with unit variance and no visible bias, Bernoulli hidden units,
    ``P(h_j = 1 | x) = σ(z_j)``, ``z_j = w_j·x + b_j``, free energy
    ``F(x) = ½‖x‖² − Σ_j softplus(z_j)``. A convolutional layer is the same energy summed over the
    patches ``x_p`` of an image with weights shared across positions (a patch RBM: the visible term
    counts overlapping pixels once per patch).

    Training minimises the negative log-likelihood ``mean_t F(x_t) + log Z``, whose gradient is the
    data term ``−mean_{t,p} ∂ Σ_j softplus(z_{tpj})`` (the expectation of the energy under
    ``P(h = 1 | x)``, not Gibbs samples of ``h``) plus the model term
    ``E_model[∂ Σ_j softplus(z_j)]``. Privacy (our reading of Phan, Wu & Dou 2017, Alg. 1):

    1. inputs are patches ``u_{tp}`` with ``‖u_{tp}‖_1 ≤ 1/P`` and ``x = κ u`` with the public
       constant ``κ = P·d``;
    2. softplus is replaced by a degree-``L`` polynomial ``Σ_l β_l z^l`` on ``[−R, R]``
       (:func:`dpsc.fm.approximate_softplus`), so the data term depends on the data only through
       ``M_1, …, M_L`` (:mod:`dpsc.fm._moments`);
    3. these are released once with Laplace noise of sensitivity ``Δ = 2 Σ_k P^{1−k}``
       (:func:`dpsc.fm.moment_sensitivity`) → ε-DP;
    4. the model term is evaluated on persistent Gibbs chains started from ``N(0, I)``: they depend
       on the parameters only, never on the data (contrastive divergence started at the data would
       leak and is not used);
    5. weights are projected to ``‖w_j‖_∞ ≤ R/(2d)`` and ``|b_j| ≤ R/2`` after each step, so that
       ``|z| ≤ R`` (where the polynomial is accurate) for every admissible patch.

    Every step after (3) is post-processing: the privacy cost is the same for 1 or 1000 epochs.
    One epoch is one gradient step on the full (already aggregated) objective.
    """

    def __init__(
        self,
        n_hidden: int = 16,
        *,
        epsilon: float = 0.5,
        degree: int = 7,
        radius: float = 4.0,
        approximation: str = "chebyshev",
        epochs: int = 200,
        lr: float = 0.01,
        n_chains: int = 256,
        gibbs_steps: int = 1,
        random_state: int = 0,
        noise_seed: int | None = None,
    ) -> None:
        self.n_hidden = n_hidden
        self.epsilon = epsilon
        self.degree = degree
        self.radius = radius
        self.approximation = approximation
        self.epochs = epochs
        self.lr = lr
        self.n_chains = n_chains
        self.gibbs_steps = gibbs_steps
        self.random_state = random_state
        self.noise_seed = noise_seed

    # -- fitting -------------------------------------------------------------------------------
    def fit(self, patches: np.ndarray, rng: SecureRandom | None = None) -> PrivateRBM:
        """Release the noisy moments of ``patches`` (``(n, P, d)``) and train on them."""
        patches = np.asarray(patches, dtype=float)
        check_patch_bound(patches)
        self.approx_ = approximate_softplus(self.approximation, self.degree, self.radius)
        if not self.approx_.is_polynomial:
            raise ValueError(
                "approximation='piecewise' is not a polynomial in the weights, so the functional "
                "mechanism cannot perturb it; use 'chebyshev' or 'taylor'."
            )
        rng = rng if rng is not None else NoiseSource(self.noise_seed).stream("fm.rbm")
        n, n_patches, d = patches.shape
        self.n_patches_, self.n_inputs_ = n_patches, d
        self.visible_scale_ = float(n_patches * d)
        exact = moment_tensors(patches, self.degree)
        noisy, self.laplace_scale_ = release_moments(exact, self.epsilon, rng, n_patches)
        self.sensitivity_ = moment_sensitivity(self.degree, n_patches)
        self.spent_epsilon_ = float(self.epsilon)
        self._train(noisy, float(n * n_patches))
        return self

    def _train(self, noisy: list[np.ndarray], n_rows: float) -> None:
        gen = torch.Generator().manual_seed(self.random_state)
        m, d, kappa = self.n_hidden, self.n_inputs_, self.visible_scale_
        w_max, b_max = self.radius / (2 * d), self.radius / 2
        weights = (torch.randn(m, d, generator=gen, dtype=torch.float64) * 0.1 * w_max).requires_grad_()
        bias = torch.zeros(m, dtype=torch.float64, requires_grad=True)
        moments = [torch.as_tensor(t) for t in noisy]
        beta = torch.as_tensor(self.approx_.coef, dtype=torch.float64)
        chains = torch.randn(self.n_chains, d, generator=gen, dtype=torch.float64)
        optimizer = torch.optim.Adam([weights, bias], lr=self.lr)
        self.history_ = []
        for _ in range(self.epochs):
            with torch.no_grad():
                for _ in range(self.gibbs_steps):
                    hidden = torch.bernoulli(torch.sigmoid(chains @ weights.T + bias), generator=gen)
                    chains = hidden @ weights + torch.randn(chains.shape, generator=gen, dtype=torch.float64)
            contractions = [torch.full((m,), n_rows, dtype=torch.float64)]
            contractions += [
                kappa**k * contract_powers(moments[k - 1], weights) for k in range(1, self.degree + 1)
            ]
            data_term = torch.zeros(m, dtype=torch.float64)
            for power in range(self.degree + 1):
                for k in range(power + 1):
                    data_term = (
                        data_term + beta[power] * comb(power, k) * bias ** (power - k) * contractions[k]
                    )
            model_term = torch.nn.functional.softplus(chains @ weights.T + bias).sum(1).mean()
            loss = -data_term.sum() / n_rows + model_term
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                weights.clamp_(-w_max, w_max)
                bias.clamp_(-b_max, b_max)
            self.history_.append(float(loss.detach()))
        self.weights_ = weights.detach().numpy()
        self.bias_ = bias.detach().numpy()

    # -- use -----------------------------------------------------------------------------------
    def transform(self, patches: np.ndarray) -> np.ndarray:
        """``P(h = 1 | x)`` for every patch: shape ``(n, P, n_hidden)``."""
        z = self.visible_scale_ * np.asarray(patches, dtype=float) @ self.weights_.T + self.bias_
        return 1.0 / (1.0 + np.exp(-z))

    def privacy_record(self) -> dict[str, Any]:
        """Describe what this layer released and what it cost."""
        record = {
            "epsilon": self.spent_epsilon_,
            "mechanism": "Laplace on the moment tensors M_1..M_L (functional mechanism)",
            "sensitivity": self.sensitivity_,
            "laplace_scale": self.laplace_scale_,
            "approximation": self.approximation,
            "degree": self.degree,
            "radius": self.radius,
            "approximation_max_error": self.approx_.max_error(),
            "epochs": self.epochs,
            "n_hidden": self.n_hidden,
        }
        if self.approximation == "chebyshev":
            record["approximation_error_bound"] = chebyshev_error_bound(self.degree, self.radius)
        return record
