"""``dpsc.tl.cluster_federated``: the proven private clustering across sites, in Flower's simulation.

Each site (``obs[site_key]``) is one SuperNode holding only its cells, with its own settings
and ledger (:class:`~dpsc.federated.SiteSettings`); the server runs the plan of
:func:`dpsc.tl.cluster` and obtains every release as a secure sum of the sites' noisy sums
(:mod:`dpsc.federated._pipeline`). The same apps run in a real deployment with
``dpsc federate server`` and ``dpsc federate site``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import anndata as ad
import numpy as np

from dpsc._docs import doc_params

from .._api import DEFAULT_EPSILON, renamed_arguments
from .._validation import (
    check_cells,
    check_privacy_args,
    check_public_counts,
    federation_sites,
    get_matrix,
    resolve_delta,
)
from ..privacy import NoiseSource, n_donors, unit_and_weights
from ._cluster import plan_for_cells, store_clustering, warn_if_noise_dominated
from ._reference import name_clusters, reference_basis


@renamed_arguments("dpsc.tl.cluster_federated", client_key="site_key")
@doc_params
def cluster_federated(
    adata: ad.AnnData,
    site_key: str = "site",
    n_clusters: int = 8,
    *,
    epsilon: float | None = DEFAULT_EPSILON,
    delta: float | None = None,
    mode: Literal["secure", "plain"] = "secure",
    threshold: int | None = None,
    layer: str | None = None,
    key_added: str = "dp_cluster",
    markers: bool = False,
    reference: ad.AnnData | str | None = None,
    reference_key: str | None = None,
    donor_key: str | None = None,
    random_state: int = 0,
    noise_seed: int | None = None,
    n_cpus: int = 2,
    copy: bool = False,
) -> ad.AnnData | None:
    """Cluster cells held by several sites with the proven private pipeline, federated exactly.

    Every release of :func:`dpsc.tl.cluster` is a sum over cells, hence a sum over sites: each site
    computes its own sum and adds its share of the noise, and only the total is released.

    Parameters
    ----------
    adata
        All sites' cells (a simulation: in a deployment each site holds only its own).
    site_key
        ``obs`` column with each cell's site (:func:`dpsc.pp.partition`).
    n_clusters
        k (fixed in advance).
    epsilon, delta
        Each site's (ε, δ) for its cells; ε = 8 by default. ``None``: no noise (no guarantee).
        ``delta=None``: 10⁻⁵ (or 1/(10 n) for the largest site above 10⁴ cells).
    mode
        ``"secure"`` (default): Flower's SecAgg+ sums the sites' vectors and each adds 1/t of the
        noise variance, so the released sums carry the central mechanism's noise when at least
        ``threshold`` sites are honest; the result is then the central :func:`dpsc.tl.cluster`'s, up
        to round-off. ``"plain"``: each site adds the full noise to its own sums (no assumption on
        the others; more noise in the total).
    threshold
        t: SecAgg+'s reconstruction threshold and the number of honest sites the noise shares assume
        (default: every site).
    layer
        Layer with the counts.
    key_added
        ``obs`` column of the labels; the record goes to ``uns["dpsc"][key_added]``.
    markers
        Also release each cluster's marker statistics inside the same ε (the two last releases,
        the cells' expression bound and the table, summed over sites as the others), and write
        scanpy's ``uns["rank_genes_groups"]``; every site receives the marker table (as
        :func:`dpsc.tl.cluster` with ``markers=True``).
    reference, reference_key
        A public reference of the same tissue, as in :func:`dpsc.tl.cluster`: every site computes
        the genes, gene scales and components from its own copy of it (here: the same object), checks
        that its copy has the run's sha256 fingerprint, and serves only requests in that basis; the
        whole ε goes to the k-means (and markers). With ``reference_key`` the k-means starts from
        the reference types' means (every site computes them from its own copy) when a released
        count of the cells within their spreads chooses them, else from its sketch, and the clusters
        are named after the types (post-processing of the released centroids).
    donor_key
        ``obs`` column naming each cell's donor: every site's ε is then per donor with all of their
        cells, as :func:`dpsc.tl.cluster`'s with ``donor_key`` (each site weights its cells by
        1/(its donor's cells), so the summed releases are the central ones). Every donor must be at
        one site: a donor at two sites would be protected as two donors, and the call refuses it.
    random_state
        Seed of the public k-means projections and post-processing.
    noise_seed
        {doc_noise_seed}
        Each simulated site then reproduces its part of the central run's noise (a test of exactness).
    n_cpus
        CPUs for Flower's simulation engine.
    copy
        {doc_copy}

    Returns
    -------
    ``None``, or the new AnnData with ``copy=True``. Writes what :func:`dpsc.tl.cluster` writes, each
    cell labelled by its own site from the released centroids, and ``uns["dpsc"][key_added]`` with the
    sites' record, the plan and what the server saw of each release (contributors, bytes per site).

    Warns
    -----
    {doc_warns_few_clusters}
    """
    matrix = get_matrix(adata, layer)
    names, sites, _ = federation_sites(adata, site_key)
    largest = max(int((sites == n).sum()) for n in names)
    delta = resolve_delta(delta, largest)
    check_privacy_args(epsilon, delta, largest)
    check_public_counts(adata, layer, True, "dpsc.tl.cluster_federated")
    check_cells(adata, matrix, "dpsc.tl.cluster_federated")  # the caller's own cells, before any site
    threshold = _check_mode(mode, threshold, len(names), site_key)
    unit, weights = _unit_of_sites(adata, donor_key, site_key)
    public, basis = reference_basis(
        reference, reference_key, adata, "dpsc.tl.cluster_federated", bool(markers), int(n_clusters)
    )
    from ..federated import run_pipeline_simulation, site_record  # after the input checks

    k = int(n_clusters)
    plan = plan_for_cells(adata, k, epsilon, delta, random_state, bool(markers), basis, unit.name)
    if weights is not None:
        warn_if_noise_dominated(plan, n_donors(weights), unit, "dpsc.tl.cluster_federated")
    noise = NoiseSource(noise_seed)
    summary = None if public is None else public.summary(basis)
    shares = threshold if mode == "secure" else 1

    def record_of(plan) -> Any:  # every simulated site's record of this plan
        return site_record(
            plan, mode, shares, len(names), adata.n_obs, noise, simulated=True, reference=summary
        )

    record = record_of(plan)
    with plan.releases.spend(adata, record, key_added, noise) as spent:
        donors = None if donor_key is None else adata.obs[[donor_key]]
        settings = _simulated_sites(
            matrix, adata.var, sites, names, epsilon, delta, noise_seed, reference, reference_key, donors
        )
        server = _server_config(adata, plan, mode, threshold, len(names), epsilon, delta, public)
        result, run = run_pipeline_simulation(server, settings, n_cpus=n_cpus)
        if plan.gated:  # the start the count chose: that branch's releases are what was spent
            plan = plan.branch(run["start"])
            record = record_of(plan)
        extra: dict[str, Any] = {} if summary is None else {"reference": summary}
        if public is not None and public.labels is not None:
            extra["cluster_names"] = name_clusters(result.centroids, public, basis, result.centroid_noise)
        return store_clustering(
            adata,
            matrix,
            result,
            key_added,
            record,
            {
                "n_clusters": k,
                "mode": mode,
                "threshold": threshold,
                "n_sites": len(names),
                "donor_key": donor_key,
            },
            copy=copy,
            booking=spent.booking,
            plan=plan,
            sites={name: int((sites == name).sum()) for name in names},
            releases=[{k: v for k, v in row.items() if k != "failures"} for row in run["releases"]],
            wall_s=float(run["wall_s"]),
            **extra,
        )


def _check_mode(mode: str, threshold: int | None, n_sites: int, site_key: str) -> int:
    """Return the number of sites a secure sum needs (all by default), or refuse the settings."""
    if mode not in ("secure", "plain"):
        raise ValueError(f"mode must be 'secure' or 'plain', got {mode!r}.")
    if mode == "secure" and n_sites < 2:
        raise ValueError(
            f"Secure aggregation needs at least 2 sites; {site_key!r} names {n_sites}. Pass mode='plain' "
            "(the site adds its full noise) or split the cells over more sites."
        )
    threshold = n_sites if threshold is None else int(threshold)
    if mode == "secure" and not 2 <= threshold <= n_sites:
        raise ValueError(f"threshold must be in [2, {n_sites}] (the number of sites), got {threshold}.")
    return threshold


def _simulated_sites(
    matrix: Any,
    var: Any,
    sites: np.ndarray,
    names: list[str],
    epsilon: float | None,
    delta: float,
    noise_seed: int | None,
    reference: Any,
    reference_key: str | None = None,
    donors: Any = None,
) -> list[Any]:
    """Return one :class:`~dpsc.federated.SiteSettings` per site: its cells, noise and reference copy.

    ``donors``: the ``obs`` column of each cell's donor (a one-column frame), given to each site
    with its cells and named as its ``donor_key``.
    """
    from ..federated import SiteSettings

    def cells(rows: np.ndarray) -> ad.AnnData:
        obs = None if donors is None else donors.iloc[rows].copy()
        return ad.AnnData(matrix[rows], obs=obs, var=var[[]].copy())

    return [
        SiteSettings(
            data=cells(np.flatnonzero(sites == name)),
            donor_key=None if donors is None else str(donors.columns[0]),
            epsilon=epsilon,
            delta=delta,
            noise_seed=noise_seed,
            site_index=index if noise_seed is not None else None,
            # one user simulates every site: no cap on the fallback ε (the record states it)
            max_fallback_epsilon=math.inf,
            reference=reference,  # each simulated site's own copy of the public reference
            reference_key=reference_key,  # its types start the k-means
        )
        for index, name in enumerate(names)
    ]


def _server_config(
    adata: ad.AnnData,
    plan: Any,
    mode: str,
    threshold: int,
    n_sites: int,
    epsilon: float | None,
    delta: float,
    public: Any,
) -> dict[str, Any]:
    """Return the server's run config (what ``dpsc federate server`` reads from its flags)."""
    return {
        "n-sites": n_sites,
        "mode": mode,
        "threshold": threshold,
        "epsilon": -1.0 if epsilon is None else float(epsilon),
        "delta": delta,
        "n-clusters": plan.n_clusters,
        "n-vars": adata.n_vars,
        "n-obs": adata.n_obs,
        "random-state": plan.random_state,
        "markers": int(bool(plan.markers)),
        "donor-unit": int(plan.unit == "donor"),
        "reference-fingerprint": "" if public is None else public.fingerprint,
    }


def _unit_of_sites(adata: ad.AnnData, donor_key: str | None, site_key: str) -> tuple[Any, Any]:
    """Return the run's unit and donor weights; refuse donors whose cells are at two sites.

    Each site weights its cells by 1/(its donor's cells at that site), so a donor at two sites would
    count as two whole donors: the simulation, which holds every site's cells, refuses it.
    """
    unit, weights = unit_and_weights(adata, donor_key, "dpsc.tl.cluster_federated")
    if donor_key is None:
        return unit, weights
    spread = adata.obs.groupby(adata.obs[donor_key].astype(str), observed=True)[site_key].nunique()
    split = spread[spread > 1]
    if len(split):
        raise ValueError(
            f"dpsc.tl.cluster_federated: {len(split)} donors of obs[{donor_key!r}] have cells at more than "
            f"one site of obs[{site_key!r}] (e.g. {split.index[0]!r}); each site would count them as a whole "
            "donor, so they would be protected only as two donors. Give each donor one site (e.g. assign "
            "sites by donor). Nothing was spent."
        )
    return unit, weights
