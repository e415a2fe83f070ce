r"""The proven private clustering as one plan: DP gene selection, DP PCA and DP k-means, all sums.

Every step reads the cells only through a release of a sum over cells (:class:`dpsc.privacy.GaussianSum`):

1. when the plan reads fewer genes than the matrix has (:func:`genes_for`), the gene statistics
   of :mod:`.hvg` (one release), and the genes with the largest noisy second moments are kept;
2. the sum of the unit-norm cells :math:`s = \sum_i z_i` on the kept genes (one release,
   sensitivity 1), whose direction :math:`u = \tilde s / \lVert\tilde s\rVert` is the first
   loading;
3. the second-moment matrix of each cell's unit residual :math:`r_i = P z_i / \lVert P z_i\rVert`,
   :math:`P = I - u u^\top` (one release, sensitivity 1; :func:`~.pca.residual_rows`), whose top
   :data:`N_COMPS` − 1 eigenvectors are the other loadings (:func:`~.pca.residual_loadings`);
4. DP k-means (:mod:`.kmeans`) on each cell's projection, the mean direction's coordinate
   weighted :data:`MEAN_WEIGHT`, scaled to unit norm (cosine; :func:`cell_points`): one sketch
   release, :data:`KMEANS_PLAN` Lloyd releases of 4k centroids reduced to k, then
   :data:`REFINE_ROUNDS` Lloyd releases of the k centroids (:func:`kmeans_plan`).

Why the residual (step 3) rather than one release of :math:`\sum_i z_i z_i^\top`: the mean
direction holds a large share of the cells' squared norm (24–70 % on the labelled files), and a
release of sensitivity 1 pays for that share although it carries no cluster signal. The unit
residuals spend the whole unit norm on what separates the cells, so the signal eigenvalues that
k-means needs grow by about :math:`1 / (1 - \lVert\bar z\rVert^2)` (1.3–3.3× on these files)
against the same noise (spectral norm :math:`\approx 2\sigma\sqrt G`, the semicircle edge) — as
if the PCA had a larger ε. Without noise the loadings span the mean direction and the top
components of the residuals (close to scanpy's centred PCA, plus the mean direction).

:func:`plan_clustering` splits the asked (ε, δ) over the releases (:func:`~dpsc.privacy.split_budget`,
shares :data:`SHARES`) and calibrates each σ once. :func:`run_clustering` is the post-processing
between the releases: it never reads a cell. It asks ``release_sum(request)`` for each noisy sum,
where a :class:`Request` says which sum (and carries what was released before: the kept genes, the
loadings, the k-means assignment). :func:`contribution` computes that sum over a set of cells. On
one machine ``release_sum`` adds the noise to :func:`contribution` over all cells; in a
federation each site computes :func:`contribution` over its own cells and secure aggregation adds
them with the sites' noise shares, so the federated clustering runs this very code.

The design (genes kept, components, shares, k-means plan) reads only the number of cells, the
number of genes, the number of clusters and the asked (ε, δ): no cell and no label.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import _blocks
from . import cluster_design as design
from . import hvg as _hvg
from . import kmeans as _kmeans
from . import markers as _markers
from . import pca as _pca
from . import type_gate as _type_gate
from .cluster_design import CLIP_NORM, KMEANS_PLAN, TYPE_COUNT
from .cluster_plan import ClusterPlan
from .cluster_requests import ReleaseStep, Request
from .public_basis import PublicBasis
from .release_kinds import cell_points, kind_of


def contribution(
    request: Request,
    matrix: Any,
    count_scale: float = KMEANS_PLAN["count_scale"],
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """Return the exact sum over the cells of ``matrix`` that ``request`` asks for (read in row blocks).

    On a Dask array the same sum is computed per chunk where the chunk lives and the partial sums
    added there (:func:`dpsc._blocks.blockwise_sum`): one implementation for every storage.
    ``weights``: each cell's contribution weighted (the donor unit: :math:`1/m_d`, a donor's weights
    add up to 1, so the release's per-cell bound Δ holds per donor), row by row inside each kind's
    sum: one pass over the cells whatever the donors.
    """
    rows_sum = functools.partial(_rows_contribution, request, count_scale)
    if _blocks.is_dask(matrix):
        return _blocks.blockwise_sum(matrix, rows_sum, *(() if weights is None else (np.asarray(weights),)))
    return rows_sum(matrix, weights)


def _rows_contribution(
    request: Request, count_scale: float, matrix: Any, weights: np.ndarray | None = None
) -> np.ndarray:
    """:func:`contribution` over rows held in memory (or backed): the request's kind's sum."""
    return kind_of(request.kind).rows_sum(request, count_scale, matrix, weights)


@dataclass
class ClusterResult:
    """What a private clustering released (and post-processed): genes, loadings, centroids."""

    genes: np.ndarray  # indices of the genes the PCA read
    loadings: np.ndarray  # len(genes) × n_comps: the mean direction, then the residual components
    eigenvalues: np.ndarray  # noisy eigenvalues of the residual components
    centroids: np.ndarray  # n_clusters × n_comps
    gene_means: np.ndarray | None = None  # noisy statistics of the gene selection (all genes)
    gene_variances: np.ndarray | None = None
    releases: int = 0
    clusters_in_use: int | None = None  # centroids above the noise of their released counts
    marker_table: np.ndarray | None = None  # the released per-cluster marker statistics (:mod:`.markers`)
    marker_frame: _markers.MarkerFrame | None = None  # the released centre and bounds of that table
    marker_focus_genes: np.ndarray | None = None  # the focused table's genes (post-processing)
    marker_focus_table: np.ndarray | None = None  # the released statistics over them
    marker_focus_frame: _markers.MarkerFrame | None = None  # that table's centre and released bounds
    basis: PublicBasis | None = None  # the public reference's map of a cell to its point, when used
    #: each centroid's noise sd per coordinate (:func:`~.kmeans.dp_kmeans_centroids`; post-processing)
    centroid_noise: np.ndarray | None = None
    #: the last k-means release's total count: the noisy number of individuals (cells or donors)
    released_total: float = float("nan")

    def labels(self, matrix: Any) -> np.ndarray:
        """Each cell's nearest released centroid (post-processing; computed from each cell)."""
        if _blocks.is_dask(matrix):  # computed where the chunks are; only the labels come back
            lazy = _blocks.map_row_blocks(matrix, lambda b: self.labels(b)[:, None], 1, np.int64)
            return np.asarray(_blocks.compute(lazy)).ravel()
        points = cell_points(matrix, self.genes, self.loadings, self.basis)  # already the k-means points
        return _kmeans.nearest_centroid(points, self.centroids, "euclidean")

    def projections(self, matrix: Any) -> Any:
        """Each cell's projection on the loadings (float32; a lazy Dask array for a Dask matrix)."""
        if _blocks.is_dask(matrix):
            return _blocks.map_row_blocks(matrix, self.projections, self.loadings.shape[1])
        if self.basis is not None:  # the cell's point before its unit norm
            return np.asarray(self.basis.scaled(matrix) @ self.loadings, dtype=np.float32)
        return _pca.project(matrix, self.loadings, True, columns=self.genes)


ReleaseSum = Callable[[Request], np.ndarray]


def run_clustering(
    plan: ClusterPlan, release_sum: ReleaseSum, basis: PublicBasis | None = None
) -> ClusterResult:
    """Run the plan: ask ``release_sum`` for each noisy sum, post-process between them (no cell read).

    Every request is checked against the plan's schedule (:meth:`ClusterPlan.schedule`) before it
    is passed on, so the releases made here are the ones a federated site agrees to serve. A plan
    on a public basis takes its genes and loadings from ``basis`` and starts with the k-means; a
    gated one first releases the count that chooses its start (:func:`_choose_start`), and the
    result's ``plan`` is the branch that ran.
    """
    if plan.public_basis != (basis is not None):
        raise ValueError("A plan on a public basis runs with that basis (and only such a plan does).")
    ask, running = release_sum, {"plan": plan, "branch": ""}

    def release_sum(request: Request) -> np.ndarray:
        schedule = running["plan"].schedule()
        if request.index >= len(schedule):
            raise RuntimeError(f"Release {request.index} is past the plan's {len(schedule)} releases.")
        request = replace(request, branch=running["branch"])
        schedule[request.index].check(request, plan.n_vars, plan.n_genes)
        return ask(request)

    index = 0
    if plan.gated:
        running["branch"] = _choose_start(plan, release_sum, basis)
        plan = running["plan"] = plan.branch(running["branch"])
        basis = basis if running["branch"] == "types" else basis.with_start(None)
        index = 1
    genes = np.arange(plan.n_vars)
    means = variances = None
    if basis is not None:
        genes, loadings, eigenvalues = basis.genes, basis.loadings, np.zeros(0)
    elif plan.select_genes:
        request = Request("genes", index, plan.sigmas["genes"])
        released = release_sum(request)
        spec = request.release(plan.n_vars)
        means, variances, _, order = _hvg.rank_genes(
            released, spec, _hvg.DEFAULT_SQUARE_CLIP, 3.0, design.GENE_RANKING
        )
        genes = np.sort(order[: plan.n_genes])
        index += 1
    if basis is None:
        loadings, eigenvalues = _release_loadings(plan, release_sum, genes, index)
        index += 2

    def release_table(assignment: _kmeans.Assignment) -> tuple:
        nonlocal index
        sigma = plan.sigmas["kmeans"]
        table_request = Request("kmeans", index, sigma, genes, loadings, assignment, basis=basis)
        noisy = release_sum(table_request)
        index += 1
        sums, counts = _kmeans.split_table(
            noisy, assignment.n_rows, plan.n_comps, CLIP_NORM, plan.kmeans["count_scale"]
        )
        released_total[0] = float(counts.sum())
        return sums, counts

    released_total = [float("nan")]

    centroids, in_use, centroid_noise = _kmeans.dp_kmeans_centroids(
        release_table,
        plan.n_clusters,
        plan.n_comps,
        noise_multiplier=plan.sigmas["kmeans"],
        clip_norm=CLIP_NORM,
        random_state=plan.random_state,
        return_in_use=True,
        return_noise=True,
        start=None if basis is None else basis.start,
        **plan.kmeans,
    )
    marker_table = marker_frame = focus = None
    if plan.markers:

        def release_center() -> np.ndarray:
            nonlocal index
            index += 1
            return release_sum(Request("marker_center", index - 1, plan.sigmas["marker_center"]))

        def release_norms(frame: _markers.MarkerFrame) -> np.ndarray:
            nonlocal index
            index += 1
            return release_sum(Request("marker_norms", index - 1, plan.sigmas["marker_norms"], frame=frame))

        norms = release_norms if "marker_norms" in plan.marker_kinds else None
        if basis is None:
            sigma = plan.sigmas["marker_center"]
            marker_frame = _markers.release_frame(plan.n_vars, sigma, release_center, norms)
        else:  # measured from the public reference's centre: nothing released for it
            marker_frame = _markers.frame_from_center(basis.marker_center_for(plan.n_vars), norms)
        nearest = _kmeans.Assignment("nearest", np.asarray(centroids, dtype=np.float64))
        marker_table = release_sum(
            Request(
                "markers", index, plan.sigmas["markers"], genes, loadings, nearest, marker_frame, basis=basis
            )
        )
        index += 1
        if "marker_focus" in plan.marker_kinds:
            focus = _release_focused_markers(
                plan, index, marker_table, marker_frame, release_sum, genes, loadings, nearest, basis
            )
            index += 2
    if index != plan.n_releases:
        raise RuntimeError(
            f"The clustering made {index} releases, its plan {plan.n_releases}; nothing is released."
        )
    result = ClusterResult(
        genes, loadings, eigenvalues, centroids, means, variances, index, in_use, marker_table, marker_frame
    )
    result.basis, result.centroid_noise, result.plan = basis, centroid_noise, plan
    result.released_total = released_total[0]
    if focus is not None:
        result.marker_focus_genes, result.marker_focus_table, result.marker_focus_frame = focus
    return result


def _choose_start(plan: ClusterPlan, release_sum: ReleaseSum, basis: PublicBasis) -> str:
    """Release the count of cells inside the reference's types; return the start it chooses (a branch).

    :mod:`.type_gate`: one release of sensitivity 1; the choice is post-processing of it.
    """
    sigma = plan.sigmas[TYPE_COUNT]
    released = release_sum(Request(TYPE_COUNT, 0, sigma, basis=basis))
    return "types" if _type_gate.starts_from_types(released, sigma) else "sketch"


def _release_loadings(
    plan: ClusterPlan, release_sum: ReleaseSum, genes: np.ndarray, index: int
) -> tuple[np.ndarray, np.ndarray]:
    """Release the cell sum and the residuals' second moment; return the loadings and eigenvalues."""
    direction = _pca.mean_direction(release_sum(Request("sum", index, plan.sigmas["sum"], genes=genes)))
    request = Request("pca", index + 1, plan.sigmas["pca"], genes=genes, loadings=direction[:, None])
    S = _pca.from_upper(release_sum(request), len(genes))
    return _pca.residual_loadings(S, direction, plan.n_comps)


def scheduled(plan: ClusterPlan, kind: str) -> ReleaseStep:
    """Return the plan's (first) scheduled release of ``kind``."""
    return next(release for release in plan.schedule() if release.kind == kind)


def first_marker_ranking(
    plan: ClusterPlan, released: np.ndarray, frame: _markers.MarkerFrame
) -> _markers.MarkerResult:
    """Return the t-test ranking of the released marker table over every gene (post-processing)."""
    table = _markers.MarkerTable(plan.n_clusters, plan.n_vars, frame)
    release = scheduled(plan, "markers").release()
    return _markers.rank_markers(_markers.group_statistics(released, table, release))


def _release_focused_markers(
    plan: ClusterPlan,
    index: int,
    marker_table: np.ndarray,
    marker_frame: _markers.MarkerFrame,
    release_sum: ReleaseSum,
    genes: np.ndarray,
    loadings: np.ndarray,
    nearest: _kmeans.Assignment,
    basis: PublicBasis | None = None,
) -> tuple[np.ndarray, np.ndarray, _markers.MarkerFrame]:
    """Release the histograms and the marker table over U, the union of each cluster's best genes.

    U is post-processing of the first marker table (:func:`~.markers.focus_genes` of its ranking),
    its centre the first frame's restricted to U. Returns U, the released table and its frame.
    """
    columns = _markers.focus_genes(first_marker_ranking(plan, marker_table, marker_frame))
    center = np.asarray(marker_frame.center)[columns]
    norms = release_sum(
        Request(
            "marker_focus_norms",
            index,
            plan.sigmas["marker_focus_norms"],
            frame=_markers.MarkerFrame(center),
            columns=columns,
        )
    )
    frame = _markers.focused_frame(norms, marker_frame, columns)
    table = release_sum(
        Request(
            "marker_focus",
            index + 1,
            plan.sigmas["marker_focus"],
            genes,
            loadings,
            nearest,
            frame,
            columns,
            basis,
        )
    )
    return columns, table, frame


def central_release_sum(
    matrix: Any, noise, prefix: str = "tl.cluster", weights: np.ndarray | None = None
) -> ReleaseSum:
    """``release_sum`` over cells held in one place: the exact sum, plus the release's noise.

    ``weights``: each cell's weight in every sum (the donor unit, :func:`contribution`).
    """
    n_vars = matrix.shape[1]

    def release(request: Request) -> np.ndarray:
        spec = request.release(n_vars)
        return spec.release(
            contribution(request, matrix, weights=weights),
            noise.stream(f"{prefix}.{request.kind}", request.index),
        )

    return release
