"""``dpsc.pp.pca``: principal components from one Gaussian release of the gene second moments.

The mechanism (per-cell contribution, sum, noise, post-processing) is
:mod:`dpsc.methods.pca`; this module checks the arguments, books the release in the ledger and
writes scanpy's keys.
"""

from __future__ import annotations

import anndata as ad
import numpy as np

from dpsc._docs import doc_params

from .._api import DEFAULT_EPSILON, result_target, store_result
from .._blocks import is_dask
from .._outputs import derived_key
from .._validation import check_cells, check_privacy_args, check_public_counts, get_matrix, resolve_delta
from ..methods import pca as mechanism
from ..privacy import (
    NoiseSource,
    PlannedRelease,
    PrivacyRecord,
    PrivacyUnit,
    ReleasePlan,
    gaussian_release_record,
    not_covered_for,
    unit_and_weights,
    with_storage_note,
    with_unit,
)

DEFAULT_PCA_GENES = mechanism.DEFAULT_GENE_BLOCK


#: The default unit of privacy: one cell.
PER_CELL = PrivacyUnit()


def pca_record(
    sigma: float, epsilon: float, delta: float, n_obs: int, noise: NoiseSource, unit: PrivacyUnit = PER_CELL
) -> PrivacyRecord:
    """Record of one Analyze-Gauss release (proven (ε, δ)-DP, Gaussian mechanism, sensitivity 1)."""
    record = gaussian_release_record(
        "pp.pca",
        sigma=sigma,
        target_epsilon=epsilon,
        delta=delta,
        unit=unit.relation(n_obs),
        mechanism="the discrete Gaussian mechanism on the gene second-moment matrix of unit-norm cells"
        f"{unit.weighting} (sensitivity 1, lattice-encoded)",
        covered="the loadings, the selected genes and the eigenvalues, and anything computed "
        "from them on other data",
        not_covered="the projections written to obsm for these cells (computed from each cell); "
        + not_covered_for(unit.name),
        noise=noise,
        scope="loadings",
        sensitivity=1.0,
    )
    return with_unit(record, unit)


def _check(adata: ad.AnnData, n_comps, n_genes, epsilon, delta, layer, log_normalize, drop_mean_component):
    """Check the call before anything is booked; the cells only locally (finite counts; no release)."""
    matrix = get_matrix(adata, layer)
    check_privacy_args(epsilon, delta, adata.n_obs)
    check_public_counts(adata, layer, log_normalize, "dpsc.pp.pca", "log_normalize=False")
    check_cells(adata, get_matrix(adata, layer), "dpsc.pp.pca", log_normalize, "log_normalize=False")
    if adata.n_vars > mechanism.MAX_GENES:
        raise ValueError(
            f"dpsc.pp.pca releases a dense genes × genes matrix; {adata.n_vars} genes is more than "
            f"{mechanism.MAX_GENES}. Select genes first: dpsc.pp.highly_variable_genes(adata, 2000, "
            "subset=True) (inside the ε), or dpsc.tl.cluster, which does it for you."
        )
    n_eig = n_comps + int(drop_mean_component)  # eigenvectors the kept block must have
    if not 1 <= n_comps <= adata.n_vars - int(drop_mean_component):
        raise ValueError(
            f"n_comps must be in [1, {adata.n_vars - int(drop_mean_component)}] for {adata.n_vars} genes"
            f"{' (the mean component is dropped)' if drop_mean_component else ''}, got {n_comps}."
        )
    if n_genes is not None and n_genes < n_eig:
        raise ValueError(
            f"n_genes must be at least {n_eig} for n_comps={n_comps}"
            f"{' plus the dropped mean component' if drop_mean_component else ''} "
            f"(or None for all genes), got {n_genes}."
        )
    return matrix


@doc_params
def pca(
    adata: ad.AnnData,
    n_comps: int = 16,
    *,
    epsilon: float = DEFAULT_EPSILON,
    delta: float | None = None,
    n_genes: int | None = DEFAULT_PCA_GENES,
    layer: str | None = None,
    log_normalize: bool = True,
    drop_mean_component: bool = True,
    key_added: str | None = None,
    donor_key: str | None = None,
    noise_seed: int | None = None,
    copy: bool = False,
) -> ad.AnnData | None:
    """Differentially private PCA of the cells (Analyze Gauss, Dwork et al. 2014).

    One Gaussian release of the genes × genes second-moment matrix of unit-norm cells; the
    loadings are its top eigenvectors (:mod:`dpsc.methods.pca` states the argument). Proven
    (ε, δ)-DP for the loadings with respect to adding or removing one cell (with ``donor_key``: one
    donor with all of their cells); the ε goes into the AnnData's ledger
    (:func:`dpsc.privacy.spent`). Only the local refusal of values that are not finite counts
    reads the cells, before anything is booked: a cell without counts is a zero row.

    Parameters
    ----------
    adata
        Cells × genes, raw counts (or non-negative values with ``log_normalize=False``).
    n_comps
        Number of components. Components past the first few carry mostly noise at small ε.
    epsilon, delta
        The release's (ε, δ); ε = 8 by default, as every dpsc call. To split one budget over
        gene selection, PCA and k-means, use :func:`dpsc.tl.cluster` or
        :func:`dpsc.privacy.split_budget`. ``delta=None``: 10⁻⁵, or 1/(10 n) above 10⁴ cells.
    n_genes
        Keep the genes with the largest *noisy* second moments before the eigendecomposition
        (post-processing; ``None``, or more than ``n_vars``, keeps all). The noise's spectral norm
        grows as σ√d, so a smaller block keeps more signal.
    layer
        Layer with the counts; ``None`` for ``X``.
    log_normalize
        Represent each cell as log1p(CP10k) before scaling it to unit norm (refused when
        ``adata.uns`` says scanpy's ``log1p`` already ran on ``X``).
    drop_mean_component
        Skip the top eigenvector (the direction of the mean cell) and keep the next ``n_comps``:
        the counterpart of scanpy's ``zero_center=True``. Post-processing, no privacy cost.
    key_added
        scanpy's rule: ``None`` writes ``obsm["X_pca"]`` and ``varm["PCs"]``; a name writes
        ``obsm[key_added]`` and ``varm[key_added]``. The record goes to
        ``uns["dpsc"][key_added or "X_pca"]``.
    donor_key
        {doc_donor_key}
    noise_seed
        {doc_noise_seed}
    copy
        {doc_copy}

    Returns
    -------
    ``None``, or the new AnnData with ``copy=True``. Writes the projections (cells × ``n_comps``)
    to ``obsm``, the loadings (genes × ``n_comps``, zero rows for the genes not kept) to ``varm``,
    ``var["dp_pca_gene"]`` (the kept block; ``var[f"{key_added}_gene"]`` under a named key), and the
    record and noisy eigenvalues to ``uns["dpsc"]``.
    A scanpy ``uns["pca"]`` (variance ratios of an earlier, non-private PCA) is removed when the
    default keys are overwritten, so no stale statistics stay beside the new components.
    """
    delta = resolve_delta(delta, adata.n_obs)
    matrix = _check(adata, n_comps, n_genes, epsilon, delta, layer, log_normalize, drop_mean_component)
    obsm_key, varm_key = (key_added, key_added) if key_added else ("X_pca", "PCs")
    record_key = key_added or "X_pca"
    unit, weights = unit_and_weights(adata, donor_key, "dpsc.pp.pca")
    plan = ReleasePlan.of(PlannedRelease("pp.pca")).calibrate(epsilon, delta)
    sigma = plan.sigma("pp.pca")
    noise = NoiseSource(noise_seed)
    record = with_storage_note(pca_record(sigma, epsilon, delta, adata.n_obs, noise, unit), is_dask(matrix))
    with plan.spend(adata, record, record_key, noise) as releases:
        stream = releases.stream("pp.pca")
        pcs, keep, eigval = mechanism.released_loadings(
            matrix, sigma, stream, n_comps, n_genes, drop_mean_component, log_normalize, weights
        )
        target = result_target(adata, copy)
        target.obsm[obsm_key] = mechanism.project(matrix, pcs, log_normalize)
        target.varm[varm_key] = pcs
        target.var["dp_pca_gene" if key_added is None else derived_key(key_added, "gene")] = np.isin(
            np.arange(adata.n_vars), keep
        )
        if key_added is None:
            target.uns.pop("pca", None)
        params = {
            "n_comps": n_comps,
            "n_genes": n_genes,
            "layer": layer,
            "log_normalize": log_normalize,
            "drop_mean_component": drop_mean_component,
            "donor_key": donor_key,
            "obsm_key": obsm_key,
            "varm_key": varm_key,
        }
        return store_result(
            adata, target, record_key, record, params, copy=copy, booking=releases.booking, eigenvalues=eigval
        )
