r"""White-box gradient canaries for one-run audits of the DP-SGD engine (Nasr et al. 2023).

A Dirac canary :math:`j` is a would-be training example whose clipped gradient is
:math:`s_j C e_{c_j}`: norm exactly :math:`C` (clipping leaves it as it is) on one coordinate
:math:`c_j` of the private parameters, with a random sign :math:`s_j`. Each canary is included in
the run with probability ½; an included canary joins each step's Poisson sample with the run's
rate :math:`q`, like any cell. The auditor sees every noisy gradient (white box): with
:math:`x_t = s_j \tilde g_t[c_j]\, B / C` (:math:`B` the expected batch size, so a present canary
adds 1 and the noise has standard deviation σ), the score is the log-likelihood ratio of "included"
against "excluded" under Poisson sampling,
:math:`y_j = \sum_t \log\big(1 - q + q\, e^{(x_t - 1/2)/\sigma^2}\big)`, the most powerful test
for that mixture (for σ = 0, the plain sum of :math:`x_t`). For a correct engine each canary
is one example of an (ε, δ)-DP run, so the one-run analysis (:mod:`dpsc.audit._one_run`) can
never prove more than the claimed ε; a broken one (less noise than claimed, unclipped or
coupled gradients) shows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .._api import renamed_arguments


class GradientCanaries:
    """Dirac gradient canaries attached to a :class:`~dpsc.privacy.DPSGDEngine` as a probe.

    Parameters
    ----------
    parameters
        The engine's private parameters.
    n_canaries
        m (at most the number of private coordinates).
    clip_norm
        C of the run (each canary's gradient norm).
    sample_rate
        q of the run.
    noise_multiplier, expected_batch_size
        σ and B of the run, to put each noisy coordinate on the scale of one canary.
    random_state
        The auditor's seed (coordinates, signs, inclusion, per-step sampling): the auditor knows
        these, the run's own noise stays secret.
    candidates
        Flat coordinates (over ``parameters`` concatenated) to place the canaries in; ``None``:
        all. Coordinates where the cells' own gradients are small make the canaries easier to
        see; the bound is valid wherever they are placed.
    """

    @renamed_arguments("dpsc.audit.GradientCanaries", seed="random_state")
    def __init__(
        self,
        parameters: Sequence[torch.nn.Parameter],
        n_canaries: int,
        *,
        clip_norm: float,
        sample_rate: float,
        noise_multiplier: float,
        expected_batch_size: int,
        random_state: int = 0,
        candidates: np.ndarray | None = None,
    ) -> None:
        sizes = np.array([p.numel() for p in parameters])
        pool = np.arange(int(sizes.sum())) if candidates is None else np.asarray(candidates)
        if not 1 <= n_canaries <= pool.size:
            raise ValueError(f"n_canaries must be in [1, {pool.size}] (coordinates to place them in).")
        rng = np.random.default_rng(random_state)
        coords = rng.choice(pool, n_canaries, replace=False)
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        self.param_index = np.searchsorted(offsets, coords, side="right") - 1
        self.local_index = coords - offsets[self.param_index]
        self.signs = rng.choice([-1.0, 1.0], n_canaries)
        self.included = rng.random(n_canaries) < 0.5
        self.scores = np.zeros(n_canaries)
        self.clip_norm, self.sample_rate = clip_norm, sample_rate
        self.noise_multiplier, self.expected_batch_size = noise_multiplier, expected_batch_size
        self._rng = rng

    def before_noise(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        """Add the included canaries that this step's Poisson sample takes to the summed gradient."""
        present = self.included & (self._rng.random(self.included.size) < self.sample_rate)
        for j in np.flatnonzero(present):
            p = parameters[self.param_index[j]]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.view(-1)[self.local_index[j]] += self.signs[j] * self.clip_norm

    @torch.no_grad()
    def after_noise(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        """Add each canary's signed coordinate of the noisy gradient to its score."""
        for i, p in enumerate(parameters):
            mine = self.param_index == i
            if mine.any():
                values = p.grad.view(-1)[torch.as_tensor(self.local_index[mine])].cpu().numpy()
                x = self.signs[mine] * values * self.expected_batch_size / self.clip_norm
                self.scores[mine] += canary_log_likelihood_ratio(x, self.sample_rate, self.noise_multiplier)


def canary_log_likelihood_ratio(x: np.ndarray, sample_rate: float, noise_multiplier: float) -> np.ndarray:
    r"""One step's score of each canary: :math:`\log(1 - q + q\, e^{(x - 1/2)/\sigma^2})` (module docstring).

    ``x`` is the canary's signed coordinate of the noisy gradient in units of one canary; for
    σ = 0 the score is ``x`` itself, for q = 1 the Gaussian log-likelihood ratio
    :math:`(x - 1/2)/\sigma^2`.
    """
    q, sigma = sample_rate, noise_multiplier
    if sigma == 0:
        return x
    if q >= 1:
        return (x - 0.5) / sigma**2
    return np.logaddexp(np.log1p(-q), np.log(q) + (x - 0.5) / sigma**2)
