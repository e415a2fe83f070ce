r"""The private clustering's kinds of release, one object each, in one registry (:data:`REGISTRY`).

Every release the clustering makes is a sum over cells of per-cell contributions of L2 norm at
most Δ, released once with Gaussian noise of standard deviation σΔ (a
:class:`~dpsc.privacy.GaussianSum`). A :class:`ReleaseKind` is everything dpsc knows of one kind
of such sum, in one place:

* its share of the clustering's ε (the plan composes the shares to the asked (ε, δ));
* its steps in a plan's schedule: each draw's size d and sensitivity Δ, and the public inputs a
  request for it carries (:attr:`ReleaseKind.carries`: genes, loadings, a k-means assignment, a
  marker frame, focused columns), which a site checks before serving it;
* its :class:`~dpsc.privacy.GaussianSum` for a request, and its exact sum over rows of cells (the
  central computation and a site's, in memory, backed or on Dask chunks).

With donor weights :math:`w_i = 1/m_d` each cell's contribution is scaled by its weight inside
the sum, so a donor's contributions add to at most Δ and the same σ gives the same (ε, δ) per
donor (:class:`~dpsc.privacy.PrivacyUnit`). :class:`~.cluster_plan.ClusterPlan`, its schedule,
the request protocol (:mod:`.cluster_requests`), the run (:mod:`.clustering`), a federated site
and the federated message format iterate this registry instead of naming kinds: a new kind is one
object here and its line in :data:`REGISTRY`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..privacy import GaussianSum
from . import cluster_design as design
from . import hvg as _hvg
from . import kmeans as _kmeans
from . import markers as _markers
from . import pca as _pca
from . import type_gate as _type_gate
from .cluster_design import CLIP_NORM, MARKER_PARTS, MARKERS_SHARE, SHARES, TYPE_COUNT
from .public_basis import PublicBasis

#: A :class:`~.cluster_plan.ClusterPlan` and a :class:`~.cluster_requests.Request`: both modules
#: build on this registry, so it names their types without importing them.
ClusterPlan = Any
Request = Any
#: One scheduled draw of a kind: (size d, sensitivity Δ, assignment kind or None, rows, loadings' width).
Step = tuple[int, float, "str | None", int, int]
#: The public inputs a request may carry (the fields of :class:`~.cluster_requests.Request`).
INPUTS = ("genes", "loadings", "assignment", "frame", "columns")


@dataclass(frozen=True)
class ReleaseKind:
    """One kind of release of the clustering (module docstring): its share, steps, sum and shape.

    Attributes
    ----------
    name, words
        The key requests and plans use, and the words a record and a refusal use.
    share
        Its weight in the plan's split of (ε, δ) (:func:`~.cluster_plan.plan_clustering`).
    carries
        The public inputs a request for it carries (a subset of :data:`INPUTS`): a site checks each
        of them, and the federated messages encode exactly these.
    steps
        ``steps(plan)``: the draws it takes in ``plan``'s schedule, each a :data:`Step`.
    release
        ``release(request, n_vars, count_scale)``: the :class:`~dpsc.privacy.GaussianSum` a request's
        sum is released with (its d and Δ).
    rows_sum
        ``rows_sum(request, count_scale, rows, weights)``: the exact sum the request asks for over
        rows of cells held in memory (or backed), each row's contribution scaled by its weight.
    """

    name: str
    words: str
    share: float
    carries: frozenset[str]
    steps: Callable[[ClusterPlan], list[Step]]
    release: Callable[[Request, int, float], GaussianSum]
    rows_sum: Callable[[Request, float, Any, np.ndarray | None], np.ndarray]


def cell_points(
    matrix: Any, genes: np.ndarray, loadings: np.ndarray, basis: PublicBasis | None = None
) -> np.ndarray:
    r"""Each cell's k-means point: :math:`x_i = (w\,z_i^\top u,\ z_i^\top v_1, …) / \lVert\cdot\rVert_2`.

    The projection on the released loadings with the mean direction's coordinate weighted by
    :data:`~.cluster_design.MEAN_WEIGHT`, scaled to unit norm (cosine; a map of each cell alone).
    With a public ``basis``: its point :math:`p_i` (:mod:`.public_basis`; norm at most 1).
    """
    if basis is not None:
        return np.asarray(basis.points(matrix))
    weights = np.ones(loadings.shape[1])
    weights[0] = design.MEAN_WEIGHT  # a module attribute: the benchmarks set the design's constants
    return _kmeans.kmeans_points(_pca.project(matrix, loadings * weights, True, columns=genes), "cosine")


def _points(request: Request, rows: Any) -> np.ndarray:
    """Return the k-means points of these rows in the request's genes and loadings (or its basis)."""
    return cell_points(rows, request.genes, request.loadings, request.basis)


def _labels(request: Request, rows: Any) -> np.ndarray:
    """Return each cell's cluster in a marker table: its nearest released centroid (the cell alone)."""
    return _kmeans.nearest_centroid(_points(request, rows), request.assignment.matrix, "euclidean")


def _kmeans_steps(plan: ClusterPlan) -> list[Step]:
    """Return the sketch, the Lloyd rounds of m = oversampling·k centroids, then the refine rounds of k."""
    k, d = plan.kmeans, plan.n_comps
    sensitivity = _kmeans.table_sensitivity(CLIP_NORM, k["count_scale"])
    refine = int(k.get("refine_rounds", 0))
    tables = (
        ("sketch", 2**plan.sketch_bits, k["n_sketch_steps"]),
        ("nearest", plan.coreset_size, (k["n_lloyd_rounds"] - refine) * k["steps_per_round"]),
        ("nearest", plan.n_clusters, refine * k["steps_per_round"]),
    )
    return [(rows * (d + 1), sensitivity, kind, rows, d) for kind, rows, n in tables for _ in range(n)]


def _focus_width(plan: ClusterPlan) -> int:
    """Return the columns of the focused marker table: at most FOCUS_GENES genes per cluster."""
    return 3 * min(plan.n_vars, plan.n_clusters * _markers.FOCUS_GENES) + 1


def _marker_share(kind: str) -> float:
    """Return a marker release's share: :data:`~.cluster_design.MARKERS_SHARE` split by its part."""
    parts = _markers.FOCUSED_SHARES
    return MARKERS_SHARE * parts[MARKER_PARTS[kind]] / sum(parts.values())


_NORMS = _markers.norm_release(0.0)
_TABLE = frozenset({"genes", "loadings", "assignment"})

GENES = ReleaseKind(
    "genes",
    "gene statistics",
    SHARES["genes"],
    frozenset(),
    lambda plan: [(2 * plan.n_vars + 1, _hvg.SENSITIVITY, None, 0, 0)],
    lambda request, n_vars, _: _hvg.gene_statistics_release(n_vars, request.sigma),
    lambda request, _, rows, w: _hvg.gene_sums(rows, True, _hvg.DEFAULT_SQUARE_CLIP, w),
)
CELL_SUM = ReleaseKind(
    "sum",
    "cell sum",
    SHARES["sum"],
    frozenset({"genes"}),
    lambda plan: [(plan.n_genes, 1.0, None, 0, 0)],
    lambda request, _, __: _pca.cell_sum_release(len(request.genes), request.sigma),
    lambda request, _, rows, w: _pca.cell_sum(rows, True, columns=request.genes, weights=w),
)
SECOND_MOMENT = ReleaseKind(
    "pca",
    "second moment",
    SHARES["pca"],
    frozenset({"genes", "loadings"}),
    lambda plan: [(plan.n_genes * (plan.n_genes + 1) // 2, 1.0, None, 0, 1)],
    lambda request, _, __: _pca.second_moment_release(len(request.genes), request.sigma),
    lambda request, _, rows, w: _pca.upper(
        _pca.second_moment(rows, True, request.genes, request.loadings, w)
    ),
)
KMEANS_TABLE = ReleaseKind(
    "kmeans",
    "k-means table",
    SHARES["kmeans"],
    _TABLE,
    _kmeans_steps,
    lambda request, _, scale: _kmeans.table_release(
        request.assignment.n_rows, request.loadings.shape[1], CLIP_NORM, scale, request.sigma
    ),
    lambda request, scale, rows, w: _kmeans.kmeans_table(
        cell_points(rows, request.genes, request.loadings, request.basis),
        request.assignment,
        CLIP_NORM,
        scale,
        weights=w,
    ),
)
TYPE_GATE_COUNT = ReleaseKind(  # each cell's point against the public start and its types' radii
    TYPE_COUNT,
    "cells within a reference type",
    _type_gate.COUNT_SHARE * SHARES["kmeans"],
    frozenset(),
    lambda plan: [(2, _type_gate.SENSITIVITY, None, 0, 0)],
    lambda request, _, __: GaussianSum(
        "cells within a reference type", 2, _type_gate.SENSITIVITY, request.sigma
    ),
    lambda request, _, rows, w: _type_gate.inside_counts(
        cell_points(rows, None, None, request.basis), request.basis.start, request.basis.start_radii, w
    ),
)
MARKER_CENTER = ReleaseKind(
    "marker_center",
    "marker centre",
    _marker_share("marker_center"),
    frozenset(),
    lambda plan: [(plan.n_vars + 1, 1.0, None, 0, 0)],
    lambda request, n_vars, _: _markers.center_release(n_vars, request.sigma),
    lambda request, _, rows, w: _markers.center_sum(rows, w),
)
MARKER_NORMS = ReleaseKind(
    "marker_norms",
    "marker norms",
    _marker_share("marker_norms"),
    frozenset({"frame"}),
    lambda plan: [(_NORMS.size, _NORMS.sensitivity, None, 0, 0)],
    lambda request, _, __: _markers.norm_release(request.sigma),
    lambda request, _, rows, w: _markers.norm_histograms(rows, request.frame.center, request.columns, w),
)
MARKER_TABLE = ReleaseKind(
    "markers",
    "marker statistics",
    _marker_share("markers"),
    _TABLE | {"frame"},
    lambda plan: [
        (
            plan.n_clusters * _markers.MarkerTable(plan.n_clusters, plan.n_vars).width,
            _markers.SENSITIVITY,
            "nearest",
            plan.n_clusters,
            plan.n_comps,
        )
    ],
    lambda request, n_vars, _: _markers.marker_release(request.marker_table(n_vars), request.sigma),
    lambda request, _, rows, w: _markers.group_table(
        rows, _labels(request, rows), request.marker_table(rows.shape[1]), w
    ),
)
FOCUSED_NORMS = ReleaseKind(
    "marker_focus_norms",
    "focused marker norms",
    _marker_share("marker_focus_norms"),
    frozenset({"frame", "columns"}),
    lambda plan: [(_NORMS.size, _NORMS.sensitivity, None, plan.n_clusters, 0)],
    MARKER_NORMS.release,
    MARKER_NORMS.rows_sum,
)
FOCUSED_TABLE = ReleaseKind(
    "marker_focus",
    "focused marker statistics",
    _marker_share("marker_focus"),
    _TABLE | {"frame", "columns"},
    lambda plan: [
        (plan.n_clusters * _focus_width(plan), _markers.SENSITIVITY, "nearest", plan.n_clusters, plan.n_comps)
    ],
    MARKER_TABLE.release,
    MARKER_TABLE.rows_sum,
)

#: Every kind of release of the clustering, by name.
REGISTRY: dict[str, ReleaseKind] = {
    kind.name: kind
    for kind in (
        GENES,
        CELL_SUM,
        SECOND_MOMENT,
        KMEANS_TABLE,
        MARKER_CENTER,
        MARKER_NORMS,
        MARKER_TABLE,
        FOCUSED_NORMS,
        FOCUSED_TABLE,
        TYPE_GATE_COUNT,
    )
}


def kind_of(name: str) -> ReleaseKind:
    """Return the registered kind ``name``; a :class:`ValueError` names the registered ones."""
    if name not in REGISTRY:
        raise ValueError(f"Unknown release {name!r}; the clustering has {tuple(REGISTRY)}.")
    return REGISTRY[name]
