"""The private clustering's public design: its constants, its releases in order, its gene rule.

Everything here reads the number of cells, of genes and of clusters and the asked (ε, δ) at most:
no cell and no label (:mod:`dpsc.methods.clustering` states the releases and the argument).
"""

from __future__ import annotations

from typing import Any

from . import kmeans as _kmeans

MAX_GENES = 2000  # genes the PCA reads without noise (scanpy's usual number of variable genes)
MIN_GENES = 250  # the fewest genes the rule of :func:`genes_for` keeps
#: The residual PCA recovers a component when its eigenvalue exceeds the noise's threshold
#: :math:`\sigma\sqrt{G}` (the BBP transition of a spiked Wigner matrix; the noise's spectrum ends
#: at :math:`2\sigma\sqrt G`). The released matrix has trace n (n unit residuals), so a component
#: holding a share s of the cells' squared norm has eigenvalue s·n, and the plan keeps the G genes
#: that let components of share :data:`EDGE_SHARE` through: :math:`G = (0.02\,n/\sigma)^2`.
EDGE_SHARE = 0.02
N_COMPS = 16  # loadings the cells are projected on: the mean direction and 15 residual components
#: ε shares of the releases: gene selection (when it runs), cell sum, residual PCA, k-means
#: (composed to the total). The cell sum's share keeps the mean direction's error small against the
#: PCA noise: a direction off by an angle θ leaves :math:`\approx n\lVert\bar z\rVert^2\theta^2` of
#: the mean in the residuals, θ ≈ σ_sum √G / (n‖z̄‖); at 0.1 (σ_sum ≈ 3.6 σ_pca) that leak stays below
#: the noise edge 2σ_pca√G for n ≥ 2,000 at ε ≥ 1. 0.05 and 0.1 were compared on all five labelled
#: files and are mostly within one sd of each other (docs, Benchmarks: "``tl.cluster``'s residual PCA").
SHARES = {"genes": 0.2, "sum": 0.1, "pca": 0.38, "kmeans": 0.32}
KINDS = ("genes", "sum", "pca", "kmeans")  # the releases, in order
#: On a public reference with types: the count that chooses the k-means start (:mod:`.type_gate`)
TYPE_COUNT = "type_count"
BRANCHES = ("types", "sketch")  # the starts a gated plan can follow (:meth:`ClusterPlan.branch`)
#: ε share of the marker releases when a plan also releases each cluster's markers
#: (:mod:`.markers`): after the centroids, the cells' mean expression, the histograms of the
#: cells' norms from it and every gene's per-cluster statistics, then the histograms and the
#: statistics again over the union of each cluster's best genes (shares of this one:
#: :data:`~.markers.FOCUSED_SHARES`).
MARKERS_SHARE = 0.25
#: The marker releases, in order (:data:`~.markers.FOCUSED_SHARES` names them by part).
MARKER_KINDS = ("marker_center", "marker_norms", "markers", "marker_focus_norms", "marker_focus")
MARKER_PARTS = dict(
    zip(MARKER_KINDS, ("center", "norms", "table", "focus_norms", "focus_table"), strict=True)
)
#: Weight of the mean direction's coordinate in the k-means points. Every cell lies near the mean
#: direction (median :math:`z_i^\top u` 0.50–0.84 on the labelled files), so with weight 1 the
#: unit-norm points crowd in a cap around it and the clusters' spread is small against the DP k-means noise
#: (calibrated to the whole unit sphere); 0.5 widens the cap and keeps the coordinate that tells
#: cells near the mean from cells far from it (weight 0 loses that, without noise too). Chosen
#: between 1 and 0.5 with the Paul 2015 and PBMC 4k labels; the other three
#: labelled files confirm it at ε = 1 and 4 and are level at ε = 8
#: (docs, Benchmarks: "``tl.cluster``'s residual PCA").
MEAN_WEIGHT = 0.5
#: DP k-means plan: one sketch release (2^10 buckets), two Lloyd releases with 4k centroids reduced
#: to k, the count column weighted 0.3·R; points on the unit sphere (R = 1). Chosen with PBMC 4k
#: labels together with the cosine metric; the mouse bladder files confirm it except bladder
#: top-2000 at ε = 4 (docs, Benchmarks: "Private clustering: DP pipeline vs the quick DP
#: baseline"). The reduction to k takes the best of 100 starts of the weighted k-means
#: (post-processing): with 20, some runs on PBMC 4k without noise ended in a worse optimum of that
#: objective (docs, Benchmarks: "The proven private clustering in one call").
KMEANS_PLAN = {
    "n_sketch_steps": 1,
    "n_lloyd_rounds": 2,
    "steps_per_round": 1,
    "n_bits": 10,
    "oversampling": 4,
    "count_scale": 0.3,
    "reduction_starts": 100,
}
#: Lloyd releases of the k reduced centroids that end the clustering's DP k-means (each one more
#: release in the plan): each final centroid becomes the noisy mean of the cells nearest to it, a
#: sum over about n/k cells, where the reduction of the 4k noisy centroids alone leaves each
#: centroid a weighted mean of noisy means. Chosen by leave one file out against none, on every
#: fold (docs, Benchmarks: "``tl.cluster`` by leave-one-file-out").
REFINE_ROUNDS = 1
#: Lloyd releases of a DP k-means that starts from public centroids (a reference's type means,
#: :func:`dpsc._public_reference.type_start`): no sketch and no oversampled rounds, only this many
#: rounds of the k centroids, so each release gets the whole k-means budget. From a start at the
#: public types' means one round moves each centroid to the noisy mean of the cells nearest to it
#: (weighed with its start, :data:`~.kmeans.START_PRIOR`);
#: each further round splits the same ε. Chosen by leave one reference / private pair out among 1
#: and 2 (docs, Benchmarks: "``tl.cluster(reference=...)`` on reference / private pairs").
PUBLIC_START_ROUNDS = 1
#: How the gene selection ranks the released gene statistics (:func:`~.hvg.rank_genes`).
GENE_RANKING = "second_moment"
CLIP_NORM = 1.0


#: The largest absolute value a public array the server sends may hold (the sketch's projections
#: and the Lloyd centroids are of order 1; the loadings are orthonormal).
MAX_PUBLIC_VALUE = 1e6
#: How far from orthonormal released loadings may be (float64 round-off of an eigendecomposition
#: and of a normalisation is about 1e-13).
ORTHONORMAL_TOL = 1e-6


def marker_kinds(markers: bool, private: bool, public_center: bool = False) -> tuple[str, ...]:
    """Return the marker releases a clustering makes (none without markers; some with noise only).

    Without noise there is neither a histogram of the norms nor a focused table. ``public_center``:
    the centre is a public reference's (:attr:`~.public_basis.PublicBasis.marker_center`), so it
    is not released.
    """
    if not markers:
        return ()
    kinds = MARKER_KINDS if private else ("marker_center", "markers")
    return tuple(kind for kind in kinds if not (public_center and kind == "marker_center"))


def release_kinds(
    select_genes: bool, markers: bool, private: bool, public_basis: bool = False, gated: bool = False
) -> tuple[str, ...]:
    """Return the kinds of release a clustering makes, in order (the gene selection when it selects).

    With a public basis the genes and loadings are public: the k-means (and markers) only, after
    the count that chooses the k-means start when the plan is ``gated`` (:mod:`.type_gate`).
    """
    if public_basis:
        return (
            *((TYPE_COUNT,) if gated else ()),
            "kmeans",
            *marker_kinds(markers, private, public_center=True),
        )
    return (*(KINDS if select_genes else KINDS[1:]), *marker_kinds(markers, private))


def kmeans_plan(public_start: bool = False) -> dict[str, Any]:
    """Return the DP k-means settings of a private clustering (public constants; reads no cell).

    :data:`KMEANS_PLAN`'s sketch and Lloyd rounds of 4k centroids, then :data:`REFINE_ROUNDS`
    Lloyd rounds of the k reduced centroids (:func:`~.kmeans.dp_kmeans_centroids`). With a
    ``public_start`` (k public starting centroids): :data:`PUBLIC_START_ROUNDS` Lloyd rounds of
    those k centroids only.
    """
    plan = dict(KMEANS_PLAN)
    if public_start:
        rounds = PUBLIC_START_ROUNDS
        plan.update(n_sketch_steps=0, n_lloyd_rounds=rounds, refine_rounds=rounds, oversampling=1)
        return plan
    plan.update(n_lloyd_rounds=int(plan["n_lloyd_rounds"]) + REFINE_ROUNDS, refine_rounds=REFINE_ROUNDS)
    return plan


def kmeans_steps(kmeans: dict[str, Any]) -> int:
    """Releases of a DP k-means with these settings (sketch steps, then every Lloyd round's steps)."""
    return _kmeans.kmeans_release_steps(
        kmeans["n_sketch_steps"], kmeans["n_lloyd_rounds"], kmeans["steps_per_round"]
    )


def genes_for(n_obs: int, sigma_pca: float, n_vars: int) -> int:
    r"""Genes the residual PCA reads: :math:`\min(n_{vars}, \mathrm{clip}((s n/\sigma)^2, G_{min}, G_{max}))`.

    :math:`(s n / \sigma)^2` is the number of genes G at which the noise threshold
    :math:`\sigma\sqrt G` equals the eigenvalue s·n of a component holding the share
    s = :data:`EDGE_SHARE` of the released matrix's trace; :math:`G_{min}` = :data:`MIN_GENES`,
    :math:`G_{max}` = :data:`MAX_GENES`. Fewer genes lower the threshold and concentrate each
    cell's unit norm on the genes of largest second moment; without noise (σ = 0) the plan reads
    :math:`G_{max}`. Reads n, σ and the number of genes only.
    """
    wanted = MAX_GENES if sigma_pca <= 0 else int((EDGE_SHARE * n_obs / sigma_pca) ** 2)
    return min(n_vars, max(MIN_GENES, min(MAX_GENES, wanted)))
