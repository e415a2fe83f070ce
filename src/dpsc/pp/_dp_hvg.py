"""``dpsc.pp.highly_variable_genes``: gene selection from one Gaussian release of gene statistics.

The mechanism (per-cell contribution, sum, noise, ranking) is :mod:`dpsc.methods.hvg`; this
module checks the arguments, books the release and writes scanpy's columns. On two synthetic
cell groups that differ in 40 of 440 genes (1200 cells, ε = 1, ``tests/test_dp_hvg.py``) the top
40 by second moment hold 36 of the 40 marker genes on average over 5 noise draws, by mean 40, by
variance 13: the variance is a difference of two noisy terms and the weakest statistic under noise.
"""

from __future__ import annotations

import anndata as ad
import numpy as np

from dpsc._docs import doc_params

from .._api import DEFAULT_EPSILON, result_target, store_result
from .._blocks import is_dask
from .._outputs import derived_key
from .._validation import check_cells, check_privacy_args, check_public_counts, get_matrix, resolve_delta
from ..methods import hvg as mechanism
from ..methods.hvg import DEFAULT_SQUARE_CLIP, FLAVORS, Flavor
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

#: The default unit of privacy: one cell.
PER_CELL = PrivacyUnit()


def hvg_record(
    sigma: float, epsilon: float, delta: float, n_obs: int, noise: NoiseSource, unit: PrivacyUnit = PER_CELL
) -> PrivacyRecord:
    """Record of the one Gaussian release (proven (ε, δ)-DP, sensitivity √3)."""
    record = gaussian_release_record(
        "pp.highly_variable_genes",
        sigma=sigma,
        target_epsilon=epsilon,
        delta=delta,
        unit=unit.relation(n_obs),
        mechanism="the discrete Gaussian mechanism on per-gene sums of unit-norm log expression, of its "
        f"clipped squares, and on the cell count{unit.weighting} (sensitivity sqrt(3), lattice-encoded)",
        covered="the selected genes, the released means and variances, and anything computed from "
        "them on other data",
        not_covered=not_covered_for(unit.name),
        noise=noise,
        scope="gene statistics",
        sensitivity=mechanism.SENSITIVITY,
    )
    return with_unit(record, unit)


def _statistic_key(key_added: str, what: str) -> str:
    """Return scanpy's ``var`` name of a statistic under the default key, else one from ``key_added``."""
    if key_added == "highly_variable":
        return {"rank": "highly_variable_rank"}.get(what, what)
    return derived_key(key_added, what)


def check_gene_selection(n_top_genes: int, n_vars: int) -> None:
    """Refuse a selection that keeps every gene: it would spend ε and select nothing."""
    if isinstance(n_top_genes, bool) or not isinstance(n_top_genes, int | np.integer) or n_top_genes < 1:
        raise ValueError(f"n_top_genes must be a positive integer, got {n_top_genes!r}.")
    if n_top_genes >= n_vars:
        raise ValueError(
            f"n_top_genes={n_top_genes} keeps all {n_vars} genes of adata: the selection would spend "
            "privacy budget and select nothing. Skip this step (or ask for fewer genes)."
        )


def _check(adata, n_top_genes, epsilon, delta, layer, log_normalize, square_clip, flavor):
    """Check the call before anything is booked; the cells only locally (finite counts; no release)."""
    matrix = get_matrix(adata, layer)
    check_privacy_args(epsilon, delta, adata.n_obs)
    check_gene_selection(n_top_genes, adata.n_vars)
    check_public_counts(adata, layer, log_normalize, "dpsc.pp.highly_variable_genes", "log_normalize=False")
    check_cells(
        adata, get_matrix(adata, layer), "dpsc.pp.highly_variable_genes", log_normalize, "log_normalize=False"
    )
    if flavor not in FLAVORS:
        raise ValueError(f"flavor must be one of {FLAVORS}, got {flavor!r}.")
    if not 0 < square_clip <= 1:
        raise ValueError(f"square_clip must be in (0, 1], got {square_clip}.")
    return matrix


@doc_params
def highly_variable_genes(
    adata: ad.AnnData,
    n_top_genes: int = 2000,
    *,
    epsilon: float = DEFAULT_EPSILON,
    delta: float | None = None,
    layer: str | None = None,
    log_normalize: bool = True,
    square_clip: float = DEFAULT_SQUARE_CLIP,
    flavor: Flavor = "second_moment",
    min_mean_sd: float = 3.0,
    subset: bool = False,
    key_added: str = "highly_variable",
    donor_key: str | None = None,
    noise_seed: int | None = None,
    copy: bool = False,
) -> ad.AnnData | None:
    """Select highly variable genes from a differentially private release of gene statistics.

    One Gaussian release of the per-gene sums of each cell's unit-norm log expression and of its
    clipped squares (:mod:`dpsc.methods.hvg` states the argument); genes are ranked by a released
    statistic (``flavor``). Proven (ε, δ)-DP for the selection and the released statistics with
    respect to adding or removing one cell; the ε goes into the AnnData's ledger
    (:func:`dpsc.privacy.spent`), where it composes with what follows (e.g.
    :func:`dpsc.pp.pca`). The only check that reads the cells is local (finite counts, refused
    before anything is booked; nothing is released); a gene no cell expresses is simply never
    selected.

    Parameters
    ----------
    adata
        Cells × genes, raw counts (or non-negative values with ``log_normalize=False``).
    n_top_genes
        Number of genes to select (fewer than ``n_vars``).
    epsilon, delta
        The release's (ε, δ); ε = 8 by default, as every dpsc call (one release of 2 × genes sums
        is cheap to make precise: :func:`dpsc.tl.cluster` gives it a small share of its budget).
        ``delta=None``: 10⁻⁵, or 1/(10 n) above 10⁴ cells.
    layer
        Layer with the counts; ``None`` for ``X``.
    log_normalize
        Represent each cell as log1p(CP10k) before scaling it to unit norm.
    square_clip
        Bound :math:`c` on the L2 norm of a cell's squared unit-norm expression. It only sets the
        noise on the second moments (σ√3·c); a cell above it is scaled down.
    flavor
        Ranking statistic of the unit-norm log expression: ``"second_moment"`` (default; the
        statistic :func:`dpsc.pp.pca` selects by), ``"variance"`` or ``"mean"``.
    min_mean_sd
        A gene is eligible when its noisy mean exceeds this many noise standard deviations.
    subset
        Keep only the selected genes (in place, or in the copy).
    key_added
        ``var`` column of the selection; the record goes to ``uns["dpsc"][key_added]``.
    donor_key
        {doc_donor_key}
    noise_seed
        {doc_noise_seed}
    copy
        {doc_copy}

    Returns
    -------
    ``None``, or the new AnnData with ``copy=True``. Writes, as :func:`scanpy.pp.highly_variable_genes`
    does, ``var[key_added]`` (bool), ``var["means"]``, ``var["variances"]`` (the *noisy*
    statistics of the unit-norm log expression) and ``var["highly_variable_rank"]`` (NaN for
    genes not selected), plus the record in ``uns["dpsc"][key_added]``. Under another
    ``key_added`` the statistics are named from it (``var[f"{key_added}_means"]``,
    ``..._variances``, ``..._rank``), so a scanpy selection already in ``var`` stays untouched.
    """
    delta = resolve_delta(delta, adata.n_obs)
    matrix = _check(adata, n_top_genes, epsilon, delta, layer, log_normalize, square_clip, flavor)
    unit, weights = unit_and_weights(adata, donor_key, "dpsc.pp.highly_variable_genes")
    plan = ReleasePlan.of(PlannedRelease("pp.highly_variable_genes")).calibrate(epsilon, delta)
    sigma = plan.sigma("pp.highly_variable_genes")
    noise = NoiseSource(noise_seed)
    record = with_storage_note(hvg_record(sigma, epsilon, delta, adata.n_obs, noise, unit), is_dask(matrix))
    with plan.spend(adata, record, key_added, noise) as releases:
        release = mechanism.gene_statistics_release(adata.n_vars, sigma)
        exact = mechanism.gene_sums(matrix, log_normalize, square_clip, weights)
        released = release.release(exact, releases.stream("pp.highly_variable_genes"))
        means, variances, eligible, order = mechanism.rank_genes(
            released, release, square_clip, min_mean_sd, flavor
        )
        rank = np.full(adata.n_vars, np.nan)
        rank[order[:n_top_genes]] = np.arange(n_top_genes, dtype=float)

        target = result_target(adata, copy)
        target.var[key_added] = ~np.isnan(rank)
        for what, values in (("means", means), ("variances", variances), ("rank", rank)):
            target.var[_statistic_key(key_added, what)] = values
        params = {
            "n_top_genes": n_top_genes,
            "layer": layer,
            "log_normalize": log_normalize,
            "square_clip": square_clip,
            "flavor": flavor,
            "min_mean_sd": min_mean_sd,
            "eligible_genes": int(eligible.sum()),
        }
        result = store_result(adata, target, key_added, record, params, copy=copy, booking=releases.booking)
    if subset:
        target._inplace_subset_var(np.asarray(target.var[key_added]))
    return result


__all__ = ["highly_variable_genes"]
