r"""DP gene statistics for highly-variable-gene selection, as a release of a sum over cells.

**Per-cell contribution.** Each cell is represented from itself alone, as for DP PCA:
:math:`z_i = r_i / \lVert r_i\rVert_2` with :math:`r_i = \log(1 + 10^4 x_i / \sum_g x_{ig})`.
Its squared entries :math:`w_i = z_i \odot z_i` are scaled down to L2 norm at most :math:`c`
(``square_clip``; :math:`\lVert w_i\rVert_2 \le \max_g z_{ig} \le 1` always). One cell
contributes

.. math:: u_i = \bigl(z_i,\; w_i / c,\; 1\bigr), \qquad \lVert u_i\rVert_2 \le \sqrt 3 = \Delta .

**Sum and noise.** :math:`T = \sum_i u_i = (S_1, S_2, n)` (:func:`gene_sums`) is released by the
:class:`~dpsc.privacy.GaussianSum` of :func:`gene_statistics_release` (:math:`2G + 1`
coordinates, sensitivity √3).

**Post-processing** (:func:`rank_genes`): per-gene mean and variance of the unit-norm log
expression, :math:`\hat\mu_g = \tilde S_{1g}/\tilde n`, :math:`\hat v_g = c\tilde S_{2g}/\tilde n -
\hat\mu_g^2`; a gene is *eligible* when its noisy mean exceeds ``min_mean_sd`` standard
deviations of the mean's noise; the eligible genes are ranked by the score ``flavor`` (the second
moment :math:`\hat v_g + \hat\mu_g^2` by default, the statistic DP PCA selects by; the
normalised dispersion of :func:`dispersion_scores` is one of :data:`RANKINGS` too), then the
others. A gene no cell expresses is kept in the release like any other: it is simply never
eligible, so no refusal depends on the cells.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from .. import _blocks
from ..privacy import GaussianSum
from .pca import unit_rows

Flavor = Literal["second_moment", "variance", "mean"]
FLAVORS = ("second_moment", "variance", "mean")  # what dpsc.pp.highly_variable_genes offers
#: Every ranking :func:`rank_genes` knows: the flavours, and the normalised dispersion a
#: leave-one-file-out candidate of ``tl.cluster``'s gene selection ranks by (not adopted).
RANKINGS = (*FLAVORS, "dispersion")
DISPERSION_BINS = 20  # bins of the mean the dispersions are normalised in (scanpy's seurat flavour)
SENSITIVITY = float(np.sqrt(3.0))  # ||(z, w / c, 1)||_2 <= sqrt(1 + 1 + 1)
DEFAULT_SQUARE_CLIP = 0.2


def per_cell_contributions(matrix: Any, log_normalize: bool, square_clip: float):
    """Return the rows :math:`z_i` and :math:`w_i / c` of the module docstring (norms at most 1)."""
    Z = unit_rows(matrix, log_normalize)
    W = Z.multiply(Z).tocsr() if sp.issparse(Z) else Z**2
    norms = np.sqrt(np.asarray(W.multiply(W).sum(1) if sp.issparse(W) else (W**2).sum(1)).ravel())
    scale = 1.0 / np.maximum(norms, square_clip)  # w / max(||w||, c) = (w scaled to norm <= c) / c
    W = sp.diags(scale) @ W if sp.issparse(W) else W * scale[:, None]
    return Z, W


@_blocks.sum_over_cells("weights")
def gene_sums(
    matrix: Any, log_normalize: bool, square_clip: float, weights: np.ndarray | None = None
) -> np.ndarray:
    """:math:`(S_1, S_2, n)`: the sum of the contributions over the cells, read in row blocks.

    ``weights``: each cell's weight in every sum (the donor unit's :math:`1/m_d`; ``None``: 1).
    """
    n_genes = matrix.shape[1]
    total = np.zeros(2 * n_genes + 1)
    start = 0
    for block in _blocks.row_blocks(matrix):
        Z, W = per_cell_contributions(block, log_normalize, square_clip)
        w = _blocks.rows_of(weights, start, block.shape[0])
        start += block.shape[0]
        total[:n_genes] += _blocks.weighted_rows(Z, w)
        total[n_genes:-1] += _blocks.weighted_rows(W, w)
        total[-1] += block.shape[0] if w is None else w.sum()
    return total


def gene_statistics_release(n_genes: int, noise_multiplier: float) -> GaussianSum:
    """Return the Gaussian release of :math:`(S_1, S_2, n)` (sensitivity √3)."""
    return GaussianSum("gene statistics", 2 * n_genes + 1, SENSITIVITY, noise_multiplier)


def dispersion_scores(means: np.ndarray, variances: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    r"""Normalised dispersion of each eligible gene; the others score :math:`-\infty` (post-processing).

    :math:`d_g = \log(\hat v_g / \hat\mu_g)`, z-scored among the eligible genes of the same bin
    of :math:`\log\hat\mu_g` (:data:`DISPERSION_BINS` bins of equal counts): the seurat flavour of
    scanpy's ``highly_variable_genes`` (Satija et al. 2015), computed from released means and
    variances (a variance that the noise makes non-positive counts as the smallest positive one).
    """
    scores = np.full(len(means), -np.inf)
    if not eligible.any():
        return scores
    mean = means[eligible]
    positive = variances[eligible][variances[eligible] > 0]
    variance = np.maximum(variances[eligible], positive.min() if positive.size else 1e-12)
    dispersion = np.log(variance / mean)
    log_mean = np.log(mean)
    edges = np.quantile(log_mean, np.linspace(0.0, 1.0, DISPERSION_BINS + 1))
    bins = np.clip(np.searchsorted(edges, log_mean, side="right") - 1, 0, DISPERSION_BINS - 1)
    normalised = np.zeros_like(dispersion)
    for b in np.unique(bins):
        members = bins == b
        spread = dispersion[members].std()
        if spread > 0:
            normalised[members] = (dispersion[members] - dispersion[members].mean()) / spread
    scores[eligible] = normalised
    return scores


def rank_genes(
    released: np.ndarray,
    release: GaussianSum,
    square_clip: float,
    min_mean_sd: float,
    flavor: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Post-processing: noisy means, variances, eligibility and the gene order (eligible first).

    ``flavor`` is one of :data:`RANKINGS`.
    """
    n_genes = (released.size - 1) // 2
    s1, s2, n = released[:n_genes], released[n_genes:-1], max(float(released[-1]), 1.0)
    means = s1 / n
    second_moments = square_clip * s2 / n
    variances = second_moments - means**2
    eligible = means > min_mean_sd * release.noise_std / n
    scores = {"second_moment": second_moments, "variance": variances, "mean": means}
    score = dispersion_scores(means, variances, eligible) if flavor == "dispersion" else scores[flavor]
    order = np.lexsort((-score, ~eligible))  # eligible first, then by score, descending
    return means, variances, eligible, order
