r"""Differentially private cluster frequencies for DEC's target distribution.

DEC's target (Xie et al. 2016, Eq. 3) divides each squared soft assignment by the cluster
frequency :math:`f_j = \sum_i q_{ij}`, which keeps large clusters from swallowing small ones.
:math:`f` is a sum over cells of the per-cell contribution :math:`q_i` (a point of the
probability simplex, so :math:`\lVert q_i\rVert_2 \le \lVert q_i\rVert_1 = 1`: sensitivity 1),
read from one Poisson sample at the DP-SGD rate q, and released by a sampled
:class:`~dpsc.privacy.GaussianSum` with the DP-SGD σ: one (σ, q) step that the Opacus accountant
composes with the training steps exactly. Only ratios of :math:`f` enter the target, so the
noisy sum is used as it is (floored at ``floor``), without dividing by q·n.
"""

from __future__ import annotations

import torch

from ._random import SecureRandom
from ._release import GaussianSum


def frequency_release(n_clusters: int, noise_multiplier: float, sample_rate: float) -> GaussianSum:
    """Return the release of the summed soft assignments of one Poisson sample (sensitivity 1)."""
    return GaussianSum("cluster frequencies", n_clusters, 1.0, noise_multiplier, sample_rate)


def dp_cluster_frequency(
    assignments: torch.Tensor,
    *,
    noise_multiplier: float,
    rng: SecureRandom | None,
    sample_rate: float = 0.5,
    floor: float = 1.0,
) -> torch.Tensor:
    r"""Return :math:`\max(\sum_i q_i + \text{noise},\ \text{floor})` (float64).

    Parameters
    ----------
    assignments
        ``(n_sampled, K)`` soft assignments of one Poisson sample of cells (rows on the
        simplex; a row with L2 norm above 1 is rejected).
    noise_multiplier
        σ; the L2 sensitivity of the sum is 1, so the noise std is σ. 0 releases the exact sum.
    rng
        The release's secure stream (``None`` only with ``noise_multiplier=0``).
    sample_rate
        q of the Poisson sample (recorded with the release; below 1 the noise is continuous).
    floor
        Lower bound of the released frequencies (post-processing).
    """
    q = assignments.detach().double().cpu()
    if q.shape[0] and bool((q.norm(dim=1) > 1.0 + 1e-6).any()):
        raise ValueError("Soft assignments must lie on the simplex (L2 norm <= 1 per cell).")
    spec = frequency_release(q.shape[1], noise_multiplier, sample_rate)
    noisy = spec.release(q.sum(0).numpy(), rng) if noise_multiplier > 0 else q.sum(0).numpy()
    return torch.as_tensor(noisy).clamp(min=floor)
