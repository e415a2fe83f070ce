r"""Differentially private cluster frequencies for DEC's target distribution.

DEC's target (Xie et al. 2016, Eq. 3) divides each squared soft assignment by the cluster
frequency :math:`f_j = \sum_i q_{ij}`, which keeps large clusters from swallowing small ones.
:math:`f` is a sum over cells, so on private cells it is released like every other access:
one step of the Poisson-subsampled Gaussian mechanism with the DP-SGD (σ, q).

Each sampled cell adds its soft assignment :math:`q_i` (a point of the probability simplex,
so :math:`\lVert q_i\rVert_2 \le \lVert q_i\rVert_1 = 1`) to a :math:`K`-vector; adding or
removing one cell moves the sum by at most :math:`\Delta = 1` in L2 norm, and Gaussian noise
:math:`\mathcal N(0, \sigma^2)` on every entry makes the release one (σ, q) step that the
Opacus accountant composes with the training steps exactly. Only ratios of :math:`f` enter the
target, so the noisy sum is used as it is (floored at ``floor``), without dividing by q·n.
"""

from __future__ import annotations

import torch


def dp_cluster_frequency(
    assignments: torch.Tensor,
    *,
    noise_multiplier: float,
    generator: torch.Generator | None,
    floor: float = 1.0,
) -> torch.Tensor:
    r"""Return :math:`\max(\sum_i q_i + \mathcal N(0, \sigma^2 I_K),\ \text{floor})`.

    Parameters
    ----------
    assignments
        ``(n_sampled, K)`` soft assignments of one Poisson sample of cells (rows on the
        simplex; a row with L2 norm above 1 is rejected).
    noise_multiplier
        σ; the L2 sensitivity of the sum is 1, so the noise std is σ. 0 releases the exact sum.
    generator
        Source of the noise.
    floor
        Lower bound of the released frequencies (post-processing), which keeps the target's
        division finite when noise drives an entry to or below zero.
    """
    q = assignments.detach().double()
    if q.shape[0] and bool((q.norm(dim=1) > 1.0 + 1e-6).any()):
        raise ValueError("Soft assignments must lie on the simplex (L2 norm <= 1 per cell).")
    total = q.sum(0)
    if noise_multiplier > 0:
        total = total + noise_multiplier * torch.randn(total.shape, generator=generator, dtype=torch.float64)
    return total.clamp(min=floor)
