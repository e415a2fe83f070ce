r"""``dpsc.tl.kmeans``: k-means whose centroids are released with Gaussian noise.

The cells' rows of ``obsm[use_rep]`` (e.g. the projections of :func:`dpsc.pp.pca`, each a
function of its own cell and of already-released loadings) are read only through the tables of
:mod:`dpsc.methods.kmeans`: every read is one release of all cells (q = 1) of per-row sums of
clipped points and weighted counts, sensitivity :math:`\Delta = R\sqrt{1+\kappa^2}`,
lattice-encoded discrete Gaussian noise of scale :math:`\sigma\Delta`. With ``metric="cosine"`` (the
default) each
cell's point is first scaled to unit norm (a function of that cell alone), so the clipping
radius 1 clips nothing and every cell weighs the same; the label is the centroid nearest to
the scaled point (the centroids are noisy means of unit vectors, inside the sphere). The
default plan is one release of a fine sketch (:math:`2^{10}` random-hyperplane buckets;
weighted k-means of its noisy bucket means gives :math:`4k` seeds) and two noisy Lloyd rounds
of one release each with the :math:`4k` centroids, reduced to :math:`k` by weighted k-means
(post-processing). σ is calibrated so that the :math:`1 + 2` Gaussian releases spend the asked
(ε, δ) in the Opacus RDP accountant. Each cell's label is its nearest released centroid
(computed from the cell: not a release).
"""

from __future__ import annotations

import warnings

import anndata as ad
import numpy as np

from dpsc._docs import doc_params

from .._api import DEFAULT_EPSILON, result_target, store_result
from .._outputs import cluster_labels
from .._validation import check_privacy_args, resolve_delta
from ..methods import central_table_release, dp_kmeans_centroids, kmeans_release_steps
from ..methods.cluster_design import KMEANS_PLAN
from ..methods.kmeans import Metric, kmeans_points, nearest_point
from ..privacy import (
    NoiseSource,
    PlannedRelease,
    PrivacyUnit,
    ReleasePlan,
    gaussian_release_record,
    not_covered_for,
    unit_and_weights,
    with_unit,
)

#: Release plan and sketch of :func:`kmeans`: the private pipeline's (:data:`KMEANS_PLAN`).
KMEANS_DEFAULTS = KMEANS_PLAN

#: The default unit of privacy: one cell.
PER_CELL = PrivacyUnit()


def kmeans_record(
    sigma: float,
    steps: int,
    epsilon: float,
    delta: float,
    n_obs: int,
    noise: NoiseSource,
    unit: PrivacyUnit = PER_CELL,
):
    """Record of the k-means releases (proven (ε, δ)-DP, ``steps`` Gaussian releases at q = 1).

    ``unit``: what one individual is (a cell, or a donor with all of their cells).
    """
    record = gaussian_release_record(
        "tl.kmeans",
        sigma=sigma,
        steps=steps,
        target_epsilon=epsilon,
        delta=delta,
        unit=unit.relation(n_obs),
        mechanism=f"{steps} Gaussian releases of clipped per-cluster sums and counts (DP k-means)"
        + unit.weighting,
        covered="the centroids and anything computed from them on other data (e.g. labels of new cells)",
        not_covered="the labels written for these cells (each is computed from its own cell); the "
        "representation in obsm, unless it was itself released privately (see its own record); "
        + not_covered_for(unit.name),
        noise=noise,
        scope="centroids",
    )
    return with_unit(record, unit)


@doc_params
def kmeans(
    adata: ad.AnnData,
    n_clusters: int = 8,
    *,
    epsilon: float = DEFAULT_EPSILON,
    delta: float | None = None,
    use_rep: str = "X_pca",
    metric: Metric = "cosine",
    clip_norm: float = 1.0,
    key_added: str = "dp_cluster",
    random_state: int = 0,
    noise_seed: int | None = None,
    donor_key: str | None = None,
    copy: bool = False,
) -> ad.AnnData | None:
    """Cluster cells by differentially private k-means on ``obsm[use_rep]``.

    Proven (ε, δ)-DP for the centroids with respect to adding or removing one cell (module
    docstring); the ε goes into the AnnData's ledger, where it composes with the release that
    made ``use_rep`` (e.g. :func:`dpsc.pp.pca`).

    Parameters
    ----------
    adata
        Cells with a representation in ``obsm[use_rep]``.
    n_clusters
        k (fixed in advance; estimating it from the cells would spend privacy).
    epsilon, delta
        (ε, δ) of the centroid releases; ε = 8 by default, as every dpsc call (a whole clustering
        in one budget: :func:`dpsc.tl.cluster`). ``delta=None``: 10⁻⁵, or 1/(10 n) above 10⁴
        cells.
    use_rep
        ``obsm`` key of the representation; rows are clipped to L2 norm ``clip_norm`` (the
        projections of :func:`dpsc.pp.pca` have norm at most 1, so the default clips nothing).
    metric
        ``"cosine"``: each row is scaled to unit norm first (k-means on the sphere, a cell goes
        to the centroid nearest its unit-norm point); ``"euclidean"``: rows as they are. Cosine
        spends the whole clipping radius on every cell, where the projections of
        :func:`dpsc.pp.pca` have a median norm of about 0.27 (PBMC 4k), a quarter of it.
    clip_norm
        R, the clipping radius (sets the sensitivity).
    key_added
        ``obs`` column of the labels (categorical); the record and the centroids go to
        ``uns["dpsc"][key_added]``.
    random_state
        Seed of the post-processing k-means runs (not of the noise).
    noise_seed
        {doc_noise_seed}
    donor_key
        {doc_donor_key}
        Each cell's row of every table is weighted by 1/(its donor's cells). ``use_rep`` must then be
        itself released per donor (``dpsc.pp.pca(donor_key=...)``), or public.
    copy
        {doc_copy}

    Returns
    -------
    ``None``, or the new AnnData with ``copy=True``. Writes ``obs[key_added]`` (categorical: the
    nearest released centroid of each cell, categories among ``"0"`` … ``str(n_clusters - 1)``:
    the centroids some cell is nearest, as scanpy's clusterings), and ``uns["dpsc"][key_added]``
    with the record, the parameters, the released ``centroids`` (``n_clusters × d``) and
    ``clusters_in_use`` (the centroids whose released count in the last Lloyd round is above twice
    its noise).

    Warns
    -----
    {doc_warns_few_clusters}
    """
    delta = resolve_delta(delta, adata.n_obs)
    check_privacy_args(epsilon, delta, adata.n_obs)
    unit, weights = unit_and_weights(adata, donor_key, "dpsc.tl.kmeans")
    points = _points(adata, use_rep, n_clusters, clip_norm, metric)
    steps = kmeans_release_steps(
        *(KMEANS_DEFAULTS[k] for k in ("n_sketch_steps", "n_lloyd_rounds", "steps_per_round"))
    )
    plan = ReleasePlan.of(PlannedRelease("tl.kmeans", steps=steps)).calibrate(epsilon, delta)
    sigma = plan.sigma("tl.kmeans")
    noise = NoiseSource(noise_seed)
    record = kmeans_record(sigma, steps, epsilon, delta, adata.n_obs, noise, unit)
    with plan.spend(adata, record, key_added, noise) as releases:
        released = []
        centroids, in_use = dp_kmeans_centroids(
            central_table_release(
                points,
                clip_norm=clip_norm,
                count_scale=KMEANS_DEFAULTS["count_scale"],
                noise_multiplier=sigma,
                draw_stream=lambda: releases.stream("tl.kmeans"),
                on_release=lambda: released.append(1),
                weights=weights,
            ),
            n_clusters,
            points.shape[1],
            noise_multiplier=sigma,
            clip_norm=clip_norm,
            random_state=random_state,
            return_in_use=True,
            **KMEANS_DEFAULTS,
        )
        if len(released) != steps:
            raise RuntimeError("The release plan and the accounted releases disagree; nothing is written.")
        labels = nearest_point(points, centroids)
        warn_if_few_clusters(in_use, n_clusters)
        target = result_target(adata, copy)
        target.obs[key_added] = cluster_labels(labels, n_clusters)
        params = {
            "n_clusters": n_clusters,
            "use_rep": use_rep,
            "metric": metric,
            "clip_norm": clip_norm,
            "donor_key": donor_key,
            **KMEANS_DEFAULTS,
        }
        released_values = {"centroids": centroids, "clusters_in_use": in_use}
        return store_result(
            adata, target, key_added, record, params, copy=copy, booking=releases.booking, **released_values
        )


def _points(adata: ad.AnnData, use_rep: str, n_clusters: int, clip_norm: float, metric: str) -> np.ndarray:
    """Return the points the k-means reads from ``obsm[use_rep]``, or refuse the settings."""
    if use_rep not in adata.obsm:
        raise ValueError(
            f"adata.obsm has no {use_rep!r}; compute a representation first, "
            "e.g. dpsc.pp.pca(adata, epsilon=4)."
        )
    if not 2 <= n_clusters <= adata.n_obs:
        raise ValueError(f"n_clusters must be in [2, n_obs={adata.n_obs}], got {n_clusters}.")
    if not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}.")
    if metric not in ("cosine", "euclidean"):
        raise ValueError(f"metric must be 'cosine' or 'euclidean', got {metric!r}.")
    rows = np.asarray(adata.obsm[use_rep], dtype=np.float64)
    if not np.isfinite(rows).all():
        raise ValueError(f"obsm[{use_rep!r}] has NaN or infinite values.")
    return kmeans_points(rows, metric)


def few_clusters_message(in_use: int, n_clusters: int) -> str:
    """Say that few released centroids are in use, the likely causes and what helps."""
    return (
        f"Only {in_use} of the {n_clusters} released centroids hold a share of the cells above the "
        "noise of the released counts. Likely causes: noise too large for the number of cells per "
        "cluster at this epsilon, or rows that share one dominant direction (a representation whose "
        "first component is the mean cell), which k-means on the sphere cannot split. What helps: a "
        "larger epsilon, more cells, fewer clusters, or components with the mean direction dropped "
        "(dpsc.pp.pca(drop_mean_component=True), the default). This note reads only released "
        "values, so it costs no privacy."
    )


def warn_if_few_clusters(in_use: int, n_clusters: int, stacklevel: int = 3) -> None:
    """Warn (:func:`few_clusters_message`) when fewer than half of the ``n_clusters`` centroids are in use.

    ``in_use`` counts the centroids whose released count in the last Lloyd round is above twice
    its noise (:func:`dpsc.methods.dp_kmeans_centroids` with ``return_in_use=True``): a statement
    about released values, so the note costs no privacy. ``stacklevel`` points the warning at the
    user's call.
    """
    if in_use < n_clusters / 2:
        warnings.warn(few_clusters_message(in_use, n_clusters), UserWarning, stacklevel=stacklevel)
