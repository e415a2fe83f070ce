"""What a party holding the shared model can compute about a cell: encoder outputs only."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from .._api import renamed_arguments
from .._blocks import dense_blocks
from ..module import DCANModule, clean_input, mask_views


@renamed_arguments("dpsc.audit.encoder_features", seed="random_state")
@torch.no_grad()
def encoder_features(
    module: DCANModule,
    X: np.ndarray | sp.spmatrix,
    *,
    n_views: int = 4,
    mask_rate: float = 0.2,
    random_state: int = 0,
    batch_size: int = 512,
) -> tuple[np.ndarray, np.ndarray]:
    r"""Membership features of each cell from the encoder and centroids (never the decoder).

    Per cell: the soft assignments :math:`q` sorted in decreasing order (cluster ids are
    arbitrary, so only the sorted profile transfers between shadow and target models), the
    smallest latent distance to a centroid, and the *view agreement* — the mean cosine between
    the latents of ``n_views`` randomly masked views of the cell, the quantity the instance stage
    trains up on member cells. Returns ``(features, agreement)``. ``random_state`` seeds the masks.
    """
    module.eval()
    gen = torch.Generator().manual_seed(random_state)
    feats, scores = [], []
    for block in dense_blocks(X, batch_size):
        rep = module.represent(clean_input(torch.as_tensor(block), module.likelihood))
        z = module.encode(rep)
        q = module.soft_assignment(z)
        centroids = module.clustering.centroids
        dist = torch.cdist(z, centroids).min(1).values
        views = F.normalize(module.encode(mask_views(rep, n_views, mask_rate, gen)), dim=-1)
        sim = views @ views.transpose(1, 2)
        off = ~torch.eye(n_views, dtype=torch.bool)
        agreement = sim[:, off].mean(1)
        q_sorted = torch.sort(q, dim=1, descending=True).values
        feats.append(torch.cat([q_sorted, dist[:, None], agreement[:, None]], 1).numpy())
        scores.append(agreement.numpy())
    return np.concatenate(feats), np.concatenate(scores)


@torch.no_grad()
def reconstruction_loss(module: DCANModule, X: np.ndarray | sp.spmatrix, batch_size: int = 512) -> np.ndarray:
    """Per-cell reconstruction loss through the *decoder* (ZINB or Gaussian NLL of the clean cell).

    Only a party holding the decoder can compute it: with ``scope="paper"`` the decoder is
    never shared, so this signal is for audits of ``scope="full"`` or ``"encoder"`` models (whose
    decoder is covered, or never reads a cell) or for measuring what a ``"paper"`` decoder would
    leak if it were released.
    """
    module.eval()
    out = []
    for block in dense_blocks(X, batch_size):
        x = clean_input(torch.as_tensor(block), module.likelihood)
        rep = module.represent(x)
        out.append(module.reconstruction_per_cell(x, rep, module.encode(rep)).numpy())
    return np.concatenate(out)
