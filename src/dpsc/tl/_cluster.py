"""``dpsc.tl.cluster``: a whole proven private clustering in one call and one budget.

Gene selection (when the plan reads fewer genes than the matrix has), PCA and k-means, each a
release of a sum over cells (:mod:`dpsc.methods.clustering`), with the asked ε split among them
so that the composed spend is the asked ε. The separate steps (``highly_variable_genes``,
:func:`dpsc.pp.pca`, :func:`dpsc.tl.kmeans`) remain for users who want them.
"""

from __future__ import annotations

import warnings
from typing import Any

import anndata as ad
import numpy as np

from dpsc._docs import doc_params

from .._api import DEFAULT_EPSILON, result_target, store_result
from .._blocks import is_dask
from .._outputs import write_cluster_markers, write_clustering
from .._validation import check_cells, check_privacy_args, check_public_counts, get_matrix, resolve_delta
from ..methods.cluster_design import MEAN_WEIGHT
from ..methods.cluster_plan import ClusterPlan, plan_clustering
from ..methods.clustering import ClusterResult, central_release_sum, run_clustering
from ..methods.public_basis import PublicBasis
from ..privacy import (
    NoiseSource,
    PrivacyRecord,
    PrivacyUnit,
    Spending,
    n_donors,
    not_covered_for,
    unit_and_weights,
    with_storage_note,
    with_unit,
)
from ._kmeans import warn_if_few_clusters
from ._reference import name_clusters, reference_basis, write_names

#: The default unit of privacy: one cell.
CELL = PrivacyUnit()

MARKER_SUMS = [
    "the cells' mean expression",
    "histograms of the cells' expression norms from it",
    "per-cluster marker statistics",
    "the same histograms and statistics over each cluster's best genes in them",
]


def marker_sums(plan: ClusterPlan) -> list[str]:
    """Return the marker sums a plan releases, in words (without noise: the mean and the statistics)."""
    return MARKER_SUMS if "marker_norms" in plan.marker_kinds else [MARKER_SUMS[0], MARKER_SUMS[2]]


def plan_for_cells(
    adata: ad.AnnData,
    n_clusters: int,
    epsilon: float | None,
    delta: float,
    random_state: int,
    markers: bool = False,
    basis: PublicBasis | None = None,
    unit: str = "cell",
) -> ClusterPlan:
    """Return the plan for these cells from their numbers of cells and genes, k and (ε, δ) (reads no cell).

    ``unit``: what one individual is (``"cell"`` or ``"donor"``); the plan states it. The number
    of cells (public) chooses the genes at either unit: the number of donors is never used.
    """
    return plan_clustering(
        epsilon,
        delta,
        n_vars=adata.n_vars,
        n_clusters=n_clusters,
        n_obs=adata.n_obs,
        unit=unit,
        random_state=random_state,
        markers=markers,
        public_basis=basis,
    )


def cluster_record(
    plan: ClusterPlan,
    n_obs: int,
    noise: NoiseSource,
    tool: str = "cluster",
    reference: dict[str, Any] | None = None,
    unit: PrivacyUnit = CELL,
) -> PrivacyRecord:
    """Proven record of the whole clustering: every release in one Opacus history.

    ``reference``: the public reference's summary (:meth:`PublicReference.summary`), stated in the
    record (``details["reference"]``) and in what the guarantee does not cover. ``unit``: what one
    individual is (a cell, or a donor with all of their cells: :class:`dpsc.privacy.PrivacyUnit`).
    """
    if reference is not None:
        return _reference_record(plan, n_obs, noise, tool, reference, unit)
    covered = (
        ("the selected genes and their noisy statistics, " if plan.select_genes else "")
        + "the loadings, the eigenvalues and the centroids, "
        + ("each cluster's marker statistics (the marker table in uns), " if plan.markers else "")
        + "and anything computed from them on other data (e.g. the labels of new cells)"
    )
    not_covered = (
        "the projections and labels written for these cells (computed from each cell); "
        + not_covered_for(unit.name)
    )
    sums = ", ".join(
        [
            *(["gene statistics"] if plan.select_genes else []),
            "cell sum",
            "second moments of the cells' residuals",
            "k-means tables",
            *(marker_sums(plan) if plan.markers else []),
        ]
    )
    mechanism = (
        f"{plan.releases_in_words} of sums over cells{unit.weighting} ({sums}; lattice-encoded), "
        "composed by the Opacus RDP accountant; the PCA reads "
        f"{plan.n_genes} of the {plan.n_vars} genes, a number chosen from the public n, ε, δ and "
        "number of genes, never from the cells"
    )
    record = plan.releases.record(
        tool,
        unit=unit.relation(n_obs),
        mechanism=mechanism,
        covered=covered,
        not_covered=not_covered,
        noise=noise,
        scope="genes, loadings, centroids",
    )
    return with_unit(record, unit)


def _reference_record(
    plan: ClusterPlan,
    n_obs: int,
    noise: NoiseSource,
    tool: str,
    reference: dict[str, Any],
    unit: PrivacyUnit = CELL,
) -> PrivacyRecord:
    """Record of a clustering on a public reference's genes and components: k-means (and markers).

    A gated plan's record (:mod:`dpsc.methods.type_gate`) names its first release, the count that
    chose the k-means start; ``plan`` is the branch that ran, so its σ and steps are what was spent.
    """
    count = [f"cells within the reference's types, which chose the start ({_start_words(plan)})"]
    sums = ", ".join(
        [*(count if plan.gated else []), "k-means tables", *(marker_sums(plan) if plan.markers else [])]
    )
    mechanism = (
        f"{plan.releases_in_words} of sums over cells{unit.weighting} ({sums}; lattice-encoded), "
        "composed by the Opacus RDP accountant, of each cell's point in the public reference's "
        f"basis ({plan.n_genes} genes, their scales and {plan.n_comps} components, computed from the "
        "reference alone)"
    )
    covered = (
        "the centroids, "
        + ("each cluster's marker statistics (the marker table in uns), " if plan.markers else "")
        + "the cluster names and anything computed from them on other data (e.g. the labels of new cells)"
    )
    not_covered = (
        f"the public reference {reference['name']!r} (sha256 {reference['fingerprint'][:16]}…, "
        f"{reference['n_obs']} cells): it is assumed public and must not contain these cells, and no "
        "epsilon is spent on it; the projections and labels written for these cells (computed from "
        "each cell); " + not_covered_for(unit.name)
    )
    record = plan.releases.record(
        tool,
        unit=unit.relation(n_obs),
        mechanism=mechanism,
        covered=covered,
        not_covered=not_covered,
        noise=noise,
        scope="centroids",
        details={"noise_multipliers": plan.releases.sigmas, "reference": reference},
    )
    return with_unit(record, unit)


def warn_if_noise_dominated(plan: ClusterPlan, n_individuals: int, unit: PrivacyUnit, tool: str) -> None:
    """Warn, before anything is booked, when the plan's k-means would be dominated by its noise.

    Donor level only: from the plan and the local number of donors (a local figure, not a
    release), when each k-means row would hold less than twice its count's noise sd
    (``kmeans_signal``). Names the levers.
    """
    if unit.donor_key is None or plan.epsilon is None:
        return
    rows, per_row, noise_sd = plan.kmeans_signal(n_individuals)
    if per_row >= 2 * noise_sd:
        return
    typed = plan.public_basis and plan.start == "types"
    outcome = (
        "its released centroids would stay near the reference types' means"
        if typed
        else "most of its centroids would be noise"
    )
    reference = (
        "a reference of these cells' types (already given)"
        if typed
        else "a public reference that covers the cohort (reference= and reference_key=: its types' means "
        "start the k-means, which then makes one release of k rows)"
    )
    warnings.warn(
        f"{tool}: with {n_individuals} donors this clustering would be dominated by noise: each of "
        f"the k-means' {rows} rows holds about {per_row:.3g} donors, below twice its count's noise sd "
        f"({2 * noise_sd:.3g}) at epsilon={plan.epsilon:g}, so {outcome}. "
        f"Levers: {reference}; more donors (more sites); a larger epsilon; fewer releases "
        "(markers=False, fewer clusters).",
        UserWarning,
        stacklevel=3,
    )


def _start_words(plan: ClusterPlan) -> str:
    """How a gated plan's k-means started, in words (the branch that ran)."""
    if plan.start == "types":
        return "the types' mean points"
    return "the k-means' own sketch, the cells being mostly outside the reference's types"


def store_clustering(
    adata: ad.AnnData,
    matrix,
    result: ClusterResult,
    key_added: str,
    record: PrivacyRecord,
    params: dict[str, Any],
    *,
    copy: bool,
    booking: Spending,
    plan: ClusterPlan | None = None,
    **extra: Any,
) -> ad.AnnData | None:
    """Write a released clustering into ``adata`` (or its copy), record it, settle the booking."""
    target = result_target(adata, copy)
    params = {**params, "mean_weight": MEAN_WEIGHT}  # how the k-means points weight the first loading
    write_clustering(target, matrix, result, key_added, params["n_clusters"])
    if result.clusters_in_use is not None:
        warn_if_few_clusters(result.clusters_in_use, params["n_clusters"], stacklevel=4)
        extra["clusters_in_use"] = result.clusters_in_use
    if result.marker_table is not None:
        extra["markers"] = write_cluster_markers(target, result, plan, key_added)
    if "cluster_names" in extra:  # post-processing of the centroids and the public reference
        points = result.basis.points(matrix)  # each cell's point where its centroid was named
        extra["cluster_names"] = write_names(target, key_added, extra["cluster_names"], points)
    return store_result(
        adata,
        target,
        key_added,
        record,
        params,
        copy=copy,
        booking=booking,
        centroids=result.centroids,
        eigenvalues=result.eigenvalues,
        **extra,
    )


@doc_params
def cluster(
    adata: ad.AnnData,
    n_clusters: int = 8,
    *,
    epsilon: float | None = DEFAULT_EPSILON,
    delta: float | None = None,
    layer: str | None = None,
    key_added: str = "dp_cluster",
    markers: bool = False,
    reference: ad.AnnData | str | None = None,
    reference_key: str | None = None,
    donor_key: str | None = None,
    random_state: int = 0,
    noise_seed: int | None = None,
    copy: bool = False,
) -> ad.AnnData | None:
    """Cluster cells with the proven private pipeline (gene selection, PCA, k-means) in one budget.

    The PCA is two releases: the sum of the unit-norm cells (its direction is the first loading),
    then the second moment of each cell's unit residual orthogonal to it (the other loadings).

    Every step reads the cells only through a Gaussian release of a sum over cells
    (:mod:`dpsc.methods.clustering` states the plan and the argument); the asked (ε, δ) is split
    among the releases and composed by the Opacus RDP accountant, so that
    :func:`dpsc.privacy.spent` grows by the asked ε. Proven (ε, δ)-DP with respect to adding or
    removing one cell (with ``donor_key``: one donor with all of their cells) for the selected
    genes, the loadings and the centroids.

    Parameters
    ----------
    adata
        Cells × genes, raw counts, all genes as they come: the PCA reads
        clip((0.02 n / σ)², 250, 2000) of them (n cells, σ the PCA's noise multiplier), chosen
        by the DP gene selection inside ε when the matrix has more. The input checks (finite
        counts) read the cells here, before anything is booked; they release nothing.
    n_clusters
        k (fixed in advance from prior knowledge; estimating it would spend privacy).
    epsilon, delta
        The whole clustering's (ε, δ); ε = 8 by default, as every dpsc call. ``None``: the same
        pipeline without noise (no guarantee). ``delta=None``: 10⁻⁵, or 1/(10 n) above 10⁴ cells.
    layer
        Layer with the counts; ``None`` for ``X``.
    key_added
        ``obs`` column of the labels; every other output is named from it (Returns), the record
        goes to ``uns["dpsc"][key_added]``.
    markers
        Also release each cluster's marker statistics, inside the same ε (the last releases, a
        quarter share: the cells' mean expression, the bounds, the table, then the bounds and the
        table over each cluster's best genes; ``rank_genes_groups`` states the
        mechanism), and write them in scanpy's format to ``uns[f"{key_added}_markers"]``.
    reference
        A public reference of the same tissue (another donor, study or condition): an AnnData of
        raw counts, or an ``.h5ad`` path. Its genes (scanpy's 2,000 highly variable genes among
        those shared with ``adata``), gene means and scales and 16 principal components are computed
        from it alone (scanpy's recipe; :mod:`dpsc.methods.public_basis`), so they cost no ε, and
        the whole ε goes to the DP k-means of the cells' points in that basis (and to the markers).
        It must not contain the cells of ``adata``; its name, sha256 fingerprint and size go into
        the record.
    reference_key
        ``reference.obs`` column of cell types. One release counts the cells within the types'
        spreads (:mod:`dpsc.methods.type_gate`); unless it says clearly that most cells lie
        outside them, the DP k-means starts from the types' mean points (public) and makes one
        Lloyd release of those k centroids, else from its own sketch; each released centroid is
        named after the type whose own spread, widened by the centroid's noise, holds it, or
        ``"unmatched"`` (``name_clusters``; post-processing); a cell outside its cluster's named
        type is itself named ``"unmatched"`` (a map of the cell, as its label).
    donor_key
        ``obs`` column naming each cell's donor (patient, mouse): the guarantee is then per donor,
        with respect to adding or removing one donor with all of their cells. Each cell's
        contribution to every release is weighted by 1/(its donor's number of cells), so a donor's
        whole contribution keeps each release's per-cell bound (:class:`dpsc.privacy.PrivacyUnit`); σ and
        ε are those of the same call per cell. The sums then hold about as many individuals as
        there are donors: before spending, a call whose k-means would be dominated by noise warns
        and names the levers (a public reference, more donors, a larger ε, fewer releases).
        ``None``: per cell (a note says once when ``obs`` has a column that looks like a donor's).
    random_state
        Seed of the k-means projections and post-processing (public; never of the noise).
    noise_seed
        {doc_noise_seed}
    copy
        {doc_copy}

    Returns
    -------
    ``None``, or the new AnnData with ``copy=True``. Every output is named from ``key_added``
    (``"dp_cluster"`` below), so a scanpy PCA, gene selection or marker table already in ``adata``
    stays untouched: ``obs["dp_cluster"]`` (categorical: each cell's nearest released centroid),
    ``obsm["X_dp_cluster"]`` (cells × 16; ``sc.pp.neighbors(adata, use_rep="X_dp_cluster")``),
    ``varm["dp_cluster_loadings"]`` (zero rows for the genes the PCA did not read; the first column
    is the released mean direction, the others the top components of the cells' residuals),
    ``var["dp_cluster_gene"]`` (the genes the PCA read: all, or the selected ones), with gene
    selection also ``var["dp_cluster_means"]`` and ``var["dp_cluster_variances"]`` (noisy), with
    ``markers=True`` ``uns["dp_cluster_markers"]`` (scanpy's format:
    ``sc.pl.rank_genes_groups_dotplot(adata, key="dp_cluster_markers")``), and
    ``uns["dpsc"]["dp_cluster"]`` with the record, the parameters (``mean_weight``: the weight of
    the first loading's coordinate in the k-means points), the ``centroids``, the noisy
    ``eigenvalues`` and ``clusters_in_use`` (as :func:`dpsc.tl.kmeans`).

    With ``reference``, ``varm``/``var`` describe the reference's genes and components, there is
    no ``eigenvalues`` and no gene statistics, the record's ``details["reference"]`` names the
    reference, and with ``reference_key`` ``obs[f"{{key_added}}_names"]`` holds each cell's
    cluster name (``"unmatched"`` for a cell outside that type) and
    ``uns["dpsc"][key_added]["cluster_names"]`` each cluster's name, nearest reference type, the
    share of its nearest reference cells of that type and its ``distance`` (at most 1 when named).

    Warns
    -----
    {doc_warns_few_clusters}
    """
    matrix = get_matrix(adata, layer)
    delta = resolve_delta(delta, adata.n_obs)
    check_privacy_args(epsilon, delta, adata.n_obs)
    check_public_counts(adata, layer, True, "dpsc.tl.cluster")
    check_cells(adata, get_matrix(adata, layer), "dpsc.tl.cluster")
    if (
        isinstance(n_clusters, bool)
        or not isinstance(n_clusters, int | np.integer)
        or not 2 <= n_clusters <= adata.n_obs
    ):
        raise ValueError(f"n_clusters must be an integer in [2, n_obs={adata.n_obs}], got {n_clusters!r}.")
    unit, weights = unit_and_weights(adata, donor_key, "dpsc.tl.cluster")
    n_individuals = adata.n_obs if weights is None else n_donors(weights)
    public, basis = reference_basis(
        reference, reference_key, adata, "dpsc.tl.cluster", bool(markers), int(n_clusters)
    )
    plan = plan_for_cells(
        adata, int(n_clusters), epsilon, delta, random_state, bool(markers), basis, unit.name
    )
    warn_if_noise_dominated(plan, n_individuals, unit, "dpsc.tl.cluster")
    noise = NoiseSource(noise_seed)
    summary = None if public is None else public.summary(basis)

    def record_of(plan: ClusterPlan) -> PrivacyRecord:
        record = cluster_record(plan, adata.n_obs, noise, reference=summary, unit=unit)
        return with_storage_note(record, is_dask(matrix))

    record = record_of(plan)
    with plan.releases.spend(adata, record, key_added, noise) as spent:
        result = run_clustering(plan, central_release_sum(matrix, noise, weights=weights), basis)
        if result.plan is not plan:  # a gated plan's other branch ran: its record is what was spent
            plan = result.plan
            record = record_of(plan)
        extra: dict[str, Any] = {} if summary is None else {"reference": summary}
        if public is not None and public.labels is not None:
            extra["cluster_names"] = name_clusters(result.centroids, public, basis, result.centroid_noise)
        params = {
            "n_clusters": plan.n_clusters,
            "layer": layer,
            "donor_key": donor_key,
            "genes_selected": int(plan.select_genes) * len(result.genes),
            "n_comps": plan.n_comps,
            "random_state": random_state,
        }
        return store_clustering(
            adata,
            matrix,
            result,
            key_added,
            record,
            params,
            copy=copy,
            booking=spent.booking,
            plan=plan,
            **extra,
        )
