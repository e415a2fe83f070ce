r"""FedSC's divergence-aware EMA update of a site's model (Mo et al., Eq. 4; FedEMA).

After the server averages, site :math:`k` does not simply take the global weights
:math:`W_g`: it moves its own weights :math:`W_k` towards them,

.. math:: W_k \leftarrow \mu_k W_k + (1-\mu_k) W_g, \qquad
          \mu_k = \min(\lambda_k \lVert W_g - W_k\rVert_2, 1),

so a site whose model has drifted far from the consensus keeps more of its own. Our reading of
how λ is "chosen from α": λ_k is fixed the first time site k has a local model to compare,
:math:`\lambda_k = \alpha / \lVert W_g - W_k\rVert_2` (so :math:`\mu_k = \alpha = 0.7` then),
and kept for later rounds, where μ grows or shrinks with the divergence. The norm is over all
shared parameters (online encoder and predictor) concatenated.
"""

from __future__ import annotations

import torch


def divergence(global_state: dict[str, torch.Tensor], local_state: dict[str, torch.Tensor]) -> float:
    r""":math:`\lVert W_g - W_k\rVert_2` over the shared parameters."""
    sq = sum(float(((global_state[k] - local_state[k]) ** 2).sum()) for k in global_state)
    return sq**0.5


def calibrate_lambda(alpha: float, div: float) -> float:
    r""":math:`\lambda = \alpha / \lVert W_g - W_k\rVert` (∞ when the models coincide)."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}.")
    return float("inf") if div == 0 else alpha / div


def ema_weight(lam: float, div: float) -> float:
    r""":math:`\mu = \min(\lambda \lVert W_g - W_k\rVert, 1)`, in [0, 1]."""
    if div == 0:
        return 0.0
    return float(min(lam * div, 1.0))


def divergence_aware_update(
    local_state: dict[str, torch.Tensor], global_state: dict[str, torch.Tensor], mu: float
) -> dict[str, torch.Tensor]:
    r""":math:`W_k \leftarrow \mu W_k + (1-\mu) W_g` for every shared tensor."""
    return {k: mu * local_state[k] + (1 - mu) * global_state[k] for k in global_state}
