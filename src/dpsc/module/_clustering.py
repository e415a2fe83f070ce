"""Student-t clustering layer with Opacus per-sample gradient support."""

from __future__ import annotations

import torch
from opacus.grad_sample.utils import register_grad_sampler, register_norm_sampler
from torch import nn


class CentroidDistance(nn.Module):
    r"""Squared Euclidean distances from latent points to trainable centroids.

    Computes :math:`D_{ij} = \lVert z_i - \mu_j \rVert_2^2` (DEC, Xie et al. 2016, Eq. 1
    before the Student-t kernel). The kernel and the losses are applied outside the layer so
    that Opacus sees one parameter whose per-sample gradient has a closed form.

    Parameters
    ----------
    n_clusters
        Number of centroids :math:`K`.
    n_latent
        Latent dimension :math:`d`.
    """

    def __init__(self, n_clusters: int, n_latent: int):
        super().__init__()
        self.centroids = nn.Parameter(torch.zeros(n_clusters, n_latent))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Return ``(n_cells, n_clusters)`` squared distances."""
        diff = z.unsqueeze(-2) - self.centroids
        return (diff * diff).sum(-1)


def _per_sample_centroid_grad(
    layer: CentroidDistance, activations: list[torch.Tensor], backprops: torch.Tensor
) -> torch.Tensor:
    r"""Per-sample gradient of the centroids.

    With :math:`g_{ij} = \partial L_i / \partial D_{ij}` (the backprops) and
    :math:`\partial D_{ij} / \partial \mu_j = 2(\mu_j - z_i)`, the gradient of cell *i*'s
    loss is :math:`G_{i,j,:} = 2\, g_{ij}\, (\mu_j - z_i)`; shape ``(n, K, d)``.
    """
    z = activations[0]
    if z.dim() != 2:
        raise ValueError("CentroidDistance expects (n_cells, n_latent) inputs under DP training.")
    return 2.0 * backprops.unsqueeze(-1) * (layer.centroids.unsqueeze(0) - z.unsqueeze(1))


@register_grad_sampler(CentroidDistance)
def _centroid_grad_sampler(
    layer: CentroidDistance, activations: list[torch.Tensor], backprops: torch.Tensor
) -> dict[nn.Parameter, torch.Tensor]:
    return {layer.centroids: _per_sample_centroid_grad(layer, activations, backprops)}


@register_norm_sampler(CentroidDistance)
def _centroid_norm_sampler(
    layer: CentroidDistance, activations: list[torch.Tensor], backprops: torch.Tensor
) -> dict[nn.Parameter, torch.Tensor]:
    grad = _per_sample_centroid_grad(layer, activations, backprops)
    return {layer.centroids: grad.flatten(1).norm(dim=1)}
