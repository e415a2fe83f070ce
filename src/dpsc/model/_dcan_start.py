r"""The releases a default DP-DCAN fit makes outside DP-SGD: before training, and the choice after it.

A fit reads the cells through DP-SGD (:class:`dpsc.privacy.DPSGDEngine`) and through these releases,
each planned and calibrated in its :class:`~dpsc.model._dcan_privacy.FitPlan` and told to the
fit's accountant as it is made:

- **before training**, either the private clustering the fit starts from (:func:`release_start`:
  the releases of :func:`dpsc.tl.cluster` at the σ of the fit's split, its genes, loadings and
  centroids), or, for a model that reads genes, the DP gene selection (:func:`select_genes`: one
  release of gene statistics, :mod:`dpsc.methods.hvg`);
- **after training**, the choice between the clustering's partition and the trained model's
  (:func:`choose_partition`: one release of both partitions' tables, sensitivity 2,
  :mod:`dpsc.methods.selection`).

Everything else here is post-processing of released values. Matrices in, arrays out: nothing
here reads or writes an AnnData.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..methods import hvg as _hvg
from ..methods import selection as _selection
from ..methods.cluster_design import MEAN_WEIGHT
from ..methods.clustering import ClusterResult, cell_points, central_release_sum, run_clustering
from ..methods.public_basis import PublicBasis
from ._dcan_privacy import MODEL_GENES, FitPlan

if TYPE_CHECKING:
    from ._dpdcan import DPDCAN


def release_before_training(
    matrix: Any,
    likelihood: str,
    plan: FitPlan,
    basis: PublicBasis | None = None,
    weights: np.ndarray | None = None,
) -> tuple[ClusterResult | None, np.ndarray | None]:
    """Make the releases before training: the clustering the fit starts from, or the gene selection.

    Returns the clustering (``None`` for a fit that does not start from it) and the mask of the
    genes the model reads (``None``: all of them). ``basis``: the public reference's, for a plan
    whose clustering reads each cell's point in it. ``weights``: each cell's donor weight (the
    donor unit; only a fit that starts from the clustering takes it).
    """
    n_vars = matrix.shape[1]
    if plan.start is not None:
        start = release_start(matrix, plan, basis, weights)
        if not plan.start.select_genes and basis is None:
            return start, None
        genes = np.zeros(n_vars, dtype=bool)
        genes[start.genes] = True
        return start, genes
    if plan.sigma("genes") is not None:
        return None, select_genes(matrix, likelihood, plan)
    return None, None


def release_start(
    matrix: Any, plan: FitPlan, basis: PublicBasis | None = None, weights: np.ndarray | None = None
) -> ClusterResult:
    """Run the clustering the fit starts from (its releases, with the fit's noise) and account it.

    The releases of :func:`dpsc.tl.cluster` at the σ of the fit's split
    (:func:`~dpsc.model._dcan_privacy.start_parts`; with a public ``basis`` only its k-means, after
    the count that chooses its start when it has the reference's types,
    :func:`~dpsc.model._dcan_privacy.start_parts_on_basis`), each told to the fit's accountant.
    At the donor unit (``weights``) every sum weights a cell by :math:`1/m_d`, and DP-SGD's
    noisy mean then divides by q times the released number of donors (the k-means' last released
    count: post-processing), never by the true one.
    """
    release_sum = central_release_sum(matrix, plan.noise, prefix="tl.fit.start", weights=weights)
    start = run_clustering(plan.start, release_sum, basis)
    for sigma, _, steps in start.plan.history():  # the branch that ran, when the start is gated
        plan.step_full_release(sigma, steps)
    if weights is not None and plan.settings is not None:
        plan.settings.expected_batch_size = max(1, round(plan.sample_rate * start.released_total))
    return start


def select_genes(matrix: Any, likelihood: str, plan: FitPlan) -> np.ndarray:
    """Select :data:`MODEL_GENES` genes by one release of gene statistics (σ_G of the plan); account it."""
    sigma = plan.releases.sigma("genes")
    release = _hvg.gene_statistics_release(matrix.shape[1], sigma)
    clip = _hvg.DEFAULT_SQUARE_CLIP
    sums = _hvg.gene_sums(matrix, likelihood == "zinb", clip)
    released = release.release(sums, plan.noise.stream("fit.gene-selection")) if sigma else sums
    _, _, _, order = _hvg.rank_genes(released, release, clip, 3.0, "second_moment")
    plan.step_full_release(sigma)
    selected = np.zeros(matrix.shape[1], dtype=bool)
    selected[order[:MODEL_GENES]] = True
    return selected


def start_model_from(model: DPDCAN, start: ClusterResult) -> None:
    """Make the encoder read the clustering's projections and start the centroids from its centroids.

    The loadings carry the clustering's weight of the mean coordinate, so each cell's projection
    at norm 1 is its k-means point (:meth:`~dpsc.module.DCANModule.clustering_points`); a plain
    encoder reads that point, a residual one the projection itself, and writes its latent back
    without the weight (untrained: the cell's ``X_dp_cluster`` point, scaled). A model on a
    public reference's points (``start.basis``) already reads them.
    """
    if start.basis is not None:
        model.start_from_partition(start.centroids)
        return
    weights = np.ones(start.loadings.shape[1])
    weights[0] = MEAN_WEIGHT  # the clustering's k-means points, once at norm 1
    model.module.set_input_loadings(torch.as_tensor(start.loadings), torch.as_tensor(weights))
    model.start_from_partition(start.centroids)


def choose_partition(
    matrix: Any, start: ClusterResult, model: DPDCAN, plan: FitPlan, weights: np.ndarray | None = None
) -> _selection.Selection:
    """Release both partitions' tables in the clustering's points and keep the better one.

    :mod:`dpsc.methods.selection` states the release (sensitivity 2, per donor with ``weights``)
    and the score.
    """
    points = cell_points(matrix, start.genes, start.loadings, start.basis)
    labels = (start.labels(matrix), model.latent_and_labels()[1])
    k, d = model.n_clusters, points.shape[1]
    exact = _selection.partition_tables(points, labels, k, weights)
    sigma = plan.releases.sigma("selection")
    if not sigma:
        return _selection.select_partition(exact, k, d, 0.0)
    release = _selection.selection_release(k, d, sigma)
    noisy = release.release(exact, plan.noise.stream("tl.fit.choice"))
    plan.step_full_release(sigma)
    return _selection.select_partition(noisy, k, d, release.noise_std)
