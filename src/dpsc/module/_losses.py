r"""Per-cell loss terms of DCAN.

Every function here returns one value per cell, and the value for cell *i* depends only on
cell *i*'s data (and on parameters). That is what makes DP-SGD's per-sample clipping bound
true: the sensitivity analysis assumes the loss decomposes as :math:`\sum_i L_i(\theta; x_i)`.
``tests/test_per_cell_independence.py`` checks it for every term.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from scvi.distributions import ZeroInflatedNegativeBinomial


def zinb_nll_per_cell(
    x: torch.Tensor, mu: torch.Tensor, theta: torch.Tensor, zi_logits: torch.Tensor
) -> torch.Tensor:
    r"""Zero-inflated negative binomial negative log-likelihood, averaged over genes.

    :math:`L^{\mathrm{ZINB}}_i = -\frac{1}{G}\sum_g \log \mathrm{ZINB}(x_{ig} \mid \mu_{ig},
    \theta_{ig}, \pi_{ig})` with the likelihood of
    :class:`scvi.distributions.ZeroInflatedNegativeBinomial` (DCA, Eraslan et al. 2019, Eq. 2).

    Parameters
    ----------
    x
        Raw counts, ``(n_cells, n_genes)``.
    mu, theta, zi_logits
        Mean, inverse dispersion and dropout logits, same shape as ``x``.
    """
    dist = ZeroInflatedNegativeBinomial(mu=mu, theta=theta, zi_logits=zi_logits)
    return -dist.log_prob(x).mean(-1)


def gaussian_nll_per_cell(x: torch.Tensor, x_hat: torch.Tensor) -> torch.Tensor:
    r"""Squared error for non-count inputs (log-normalised data).

    :math:`\frac{1}{2G}\lVert x_i - \hat x_i \rVert^2`, a unit-variance Gaussian negative
    log-likelihood up to a constant.
    """
    return 0.5 * (x - x_hat).pow(2).mean(-1)


def instance_loss_per_cell(z_views: torch.Tensor) -> torch.Tensor:
    r"""Symmetric negative cosine similarity between two views of the *same* cell.

    :math:`L^{\mathrm{ins}}_i = -\tfrac12\left[\cos(z_i^{(1)}, \mathrm{sg}(z_i^{(2)})) +
    \cos(z_i^{(2)}, \mathrm{sg}(z_i^{(1)}))\right]` (SimSiam, Chen & He 2021, Eq. 2, without
    the predictor; sg = stop-gradient). The cosine is taken along the latent dimension of each
    cell separately, never across the batch.

    Parameters
    ----------
    z_views
        Latents of the two masked views, ``(n_cells, 2, n_latent)``.
    """
    z1, z2 = z_views[:, 0], z_views[:, 1]
    return -0.5 * (
        F.cosine_similarity(z1, z2.detach(), dim=-1) + F.cosine_similarity(z2, z1.detach(), dim=-1)
    )


def student_t_assignment(sq_dist: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    r"""Soft assignment of DEC (Xie et al. 2016, Eq. 1).

    :math:`q_{ij} = \frac{(1 + D_{ij}/\alpha)^{-(\alpha+1)/2}}{\sum_{j'} (1 + D_{ij'}/
    \alpha)^{-(\alpha+1)/2}}`, normalised over clusters *j* for each cell.
    """
    logits = -(alpha + 1.0) / 2.0 * torch.log1p(sq_dist / alpha)
    return torch.softmax(logits, dim=-1)


def per_cell_target(
    q: torch.Tensor, power: float = 2.0, frequency: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Sharpened target distribution computed from one cell's own assignment.

    DEC's target (Xie et al. 2016, Eq. 3) is :math:`p_{ij} \propto q_{ij}^2 / f_j` with cluster
    frequency :math:`f_j = \sum_i q_{ij}` taken over the batch or the data set, which couples
    all cells: one cell moves every other cell's target, and per-sample clipping no longer
    bounds its influence. dpsc computes
    :math:`p_{ij} = (q_{ij}^{\,\kappa} / f_j) / \sum_{j'} (q_{ij'}^{\,\kappa} / f_{j'})` with
    :math:`\kappa` = ``power``, normalised over clusters of the same cell, where ``frequency``
    is a *constant* :math:`f` released beforehand (:func:`~dpsc.privacy.dp_cluster_frequency`),
    so cell *i*'s target depends on cell *i* only; ``frequency=None`` takes :math:`f_j = 1`
    (uniform cluster sizes). The target is detached (treated as a constant, as in DEC).
    """
    p = q.detach().pow(power)
    if frequency is not None:
        p = p / frequency.to(p)
    return p / p.sum(-1, keepdim=True)


def dec_kl_per_cell(q: torch.Tensor, p: torch.Tensor, eps: float = 1e-10) -> torch.Tensor:
    r"""Per-cell clustering loss of DEC (Eq. 2, without the sum over cells).

    :math:`\mathrm{KL}(p_i \Vert q_i) = \sum_j p_{ij} \log(p_{ij}/q_{ij})`.
    """
    return (p * (torch.log(p + eps) - torch.log(q + eps))).sum(-1)


def separation_loss(centroids: torch.Tensor) -> torch.Tensor:
    r"""Cluster-separation loss: mean pairwise cosine similarity of distinct centroids.

    :math:`L^{\mathrm{sep}} = \frac{1}{K(K-1)} \sum_{j \ne k} \cos(\mu_j, \mu_k)`. It depends on
    the centroids only, not on any cell.
    """
    k = centroids.shape[0]
    unit = F.normalize(centroids, dim=-1)
    cos = unit @ unit.T
    off_diagonal = cos.sum() - cos.diagonal().sum()
    return off_diagonal / (k * (k - 1))
