r"""The proven private clustering as one plan: DP gene selection, DP PCA and DP k-means, all sums.

Every step reads the cells only through a release of a sum over cells (:mod:`dpsc.privacy._release`):

1. when the plan reads fewer genes than the matrix has (:func:`genes_for`), the gene statistics
   of :mod:`._hvg` (one release), and the genes with the largest noisy second moments are kept;
2. the sum of the unit-norm cells :math:`s = \sum_i z_i` on the kept genes (one release,
   sensitivity 1), whose direction :math:`u = \tilde s / \lVert\tilde s\rVert` is the first
   loading;
3. the second-moment matrix of each cell's unit residual :math:`r_i = P z_i / \lVert P z_i\rVert`,
   :math:`P = I - u u^\top` (one release, sensitivity 1; :func:`~._pca.residual_rows`), whose top
   :data:`N_COMPS` − 1 eigenvectors are the other loadings (:func:`~._pca.residual_loadings`);
4. DP k-means (:mod:`._kmeans`) on each cell's projection, the mean direction's coordinate
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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import _blocks
from ..privacy import GaussianSum, PlannedRelease, PlanSettings, ReleasePlan
from . import _hvg, _kmeans, _markers, _pca, _type_gate
from ._public_basis import MIN_SCALE, PublicBasis

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
#: On a public reference with types: the count that chooses the k-means start (:mod:`._type_gate`)
TYPE_COUNT = "type_count"
BRANCHES = ("types", "sketch")  # the starts a gated plan can follow (:meth:`ClusterPlan.branch`)
#: ε share of the marker releases when a plan also releases each cluster's markers
#: (:mod:`._markers`): after the centroids, the cells' mean expression, the histograms of the
#: cells' norms from it and every gene's per-cluster statistics, then the histograms and the
#: statistics again over the union of each cluster's best genes (shares of this one:
#: :data:`~._markers.FOCUSED_SHARES`).
MARKERS_SHARE = 0.25
#: The marker releases, in order (:data:`~._markers.FOCUSED_SHARES` names them by part).
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
#: (weighed with its start, :data:`~._kmeans.START_PRIOR`);
#: each further round splits the same ε. Chosen by leave one reference / private pair out among 1
#: and 2 (docs, Benchmarks: "``tl.cluster(reference=...)`` on reference / private pairs").
PUBLIC_START_ROUNDS = 1
#: How the gene selection ranks the released gene statistics (:func:`~._hvg.rank_genes`).
GENE_RANKING = "second_moment"
CLIP_NORM = 1.0


#: The largest absolute value a public array the server sends may hold (the sketch's projections
#: and the Lloyd centroids are of order 1; the loadings are orthonormal).
MAX_PUBLIC_VALUE = 1e6
#: How far from orthonormal released loadings may be (float64 round-off of an eigendecomposition
#: and of a normalisation is about 1e-13).
ORTHONORMAL_TOL = 1e-6


RELEASE_NAMES = {
    "genes": "gene statistics",
    "sum": "cell sum",
    "pca": "second moment",
    "kmeans": "k-means table",
    "marker_center": "marker centre",
    "marker_norms": "marker norms",
    "markers": "marker statistics",
    "marker_focus_norms": "focused marker norms",
    "marker_focus": "focused marker statistics",
    "type_count": "cells within a reference type",
}


class ScheduleError(ValueError):
    """A request that is not the plan's scheduled release (or whose public inputs break its bounds)."""


@dataclass(frozen=True)
class ReleaseStep:
    """One step of a plan's schedule (:meth:`ClusterPlan.schedule`), fixed before any cell is read.

    A planned release of ``steps`` draws (:class:`~dpsc.privacy.PlannedRelease`: its name, σ, q
    and step count, the one holder of them) is served as that many steps; a step adds what one
    draw's sum is, so that a request can be checked against it.

    Attributes
    ----------
    index, planned
        Position in the schedule and the planned release this step is one draw of (its ``name``
        is the step's :attr:`kind`, its σ the step's :attr:`sigma`).
    size, sensitivity
        d and Δ of its :class:`~dpsc.privacy.GaussianSum`.
    assignment, rows
        For a k-means table: the assignment kind (``"sketch"`` or ``"nearest"``) and the table's rows.
    width
        Columns of the loadings the request carries (1 for the residual PCA: the mean direction;
        ``n_comps`` for a k-means table; 0 when it carries none).
    """

    index: int
    planned: PlannedRelease
    size: int
    sensitivity: float
    assignment: str | None = None
    rows: int = 0
    width: int = 0
    public_basis: bool = False

    @property
    def kind(self) -> str:
        """What is summed (one of :data:`KINDS`): the planned release's name."""
        return self.planned.name

    @property
    def sigma(self) -> float:
        """The planned release's noise multiplier."""
        return float(self.planned.sigma)

    def release(self, columns: np.ndarray | None = None) -> GaussianSum:
        """Return the :class:`GaussianSum` of this release (sizes from the plan, not from a request).

        The focused marker table's size is :attr:`size` at most: the plan bounds the number of its
        genes, the (checked) request names them (``columns``).
        """
        size = self.size
        if self.kind == "marker_focus" and columns is not None:
            size = self.rows * (3 * len(columns) + 1)
        return GaussianSum(RELEASE_NAMES[self.kind], size, self.sensitivity, self.sigma)

    def check(self, request: Request, n_vars: int, n_genes: int) -> None:
        r"""Raise :class:`ScheduleError` unless ``request`` is this release with public inputs in bounds.

        Checks the index, kind and σ; the gene list (``n_genes`` distinct indices below ``n_vars``);
        loadings of shape (``n_genes``, :attr:`width`), finite, with orthonormal columns
        (:math:`\max|L^\top L - I| \le` :data:`ORTHONORMAL_TOL`: then every projection of a unit
        cell has norm at most 1 and every unit residual is finite); the assignment's kind and shape,
        finite, every value at most :data:`MAX_PUBLIC_VALUE`. Reads the request only, never a cell.
        """
        if request.index != self.index or request.kind != self.kind:
            raise ScheduleError(
                f"release {request.index} asks for {request.kind!r}; the plan's release {self.index} is "
                f"{self.kind!r}"
            )
        if not (isinstance(request.sigma, float | int) and request.sigma == self.sigma):
            raise ScheduleError(
                f"release {self.index} ({self.kind}) asks for noise multiplier {request.sigma!r}; the plan's "
                f"is {self.sigma!r}"
            )
        if self.kind in ("genes", "marker_center", TYPE_COUNT):  # a site counts in its own basis
            return
        n_columns = n_vars
        if self.kind in ("marker_focus_norms", "marker_focus"):
            n_columns = _check_focus_genes(request.columns, n_vars, self.rows * _markers.FOCUS_GENES)
        if self.kind in ("marker_norms", "markers", "marker_focus_norms", "marker_focus"):
            bounds = self.kind in ("markers", "marker_focus")
            _check_frame(request.frame, n_columns, bounds=bounds)
        if self.kind in ("marker_norms", "marker_focus_norms"):
            return
        _check_gene_list(request.genes, n_vars, n_genes)
        if self.width:
            _check_loadings(request.loadings, n_genes, self.width)
        if self.assignment is not None:
            _check_assignment(request.assignment, self.assignment, self.rows, self.width)
        if self.public_basis != (request.basis is not None):
            wrong = "needs the reference's basis" if self.public_basis else "carries an unplanned basis"
            raise ScheduleError(f"release {self.index} ({self.kind}) {wrong}")
        if request.basis is not None:
            _check_basis(request.basis, request.genes, request.loadings, n_vars)


def _check_frame(frame: Any, n_vars: int, bounds: bool) -> None:
    """Refuse a marker frame unless its centre (and, for the table, both bounds) are in range."""
    if not isinstance(frame, _markers.MarkerFrame):
        raise ScheduleError(f"a marker frame of type {type(frame).__name__}")
    if bounds and (frame.sum_bound is None or frame.square_bound is None):
        raise ScheduleError("a marker table request without its released bounds")
    try:
        frame.check(n_vars)
    except _markers.BoundError as err:
        raise ScheduleError(str(err)) from None


def _check_focus_genes(columns: Any, n_vars: int, most: int) -> int:
    """Refuse a focused gene list unless it holds 1 to ``most`` distinct genes; return its size."""
    columns = np.asarray(columns if columns is not None else [])
    if columns.ndim != 1 or not np.issubdtype(columns.dtype, np.integer):
        raise ScheduleError(f"the focused genes are not a vector of integer indices (dtype {columns.dtype})")
    distinct = len(np.unique(columns))
    limit = min(n_vars, most)
    in_range = len(columns) > 0 and 0 <= int(columns.min()) and int(columns.max()) < n_vars
    if not in_range or distinct != len(columns) or len(columns) > limit:
        raise ScheduleError(
            f"{len(columns)} focused gene indices ({distinct} distinct) where the plan allows 1 to {limit} "
            f"distinct genes of {n_vars}"
        )
    return len(columns)


def _check_gene_list(genes: Any, n_vars: int, n_genes: int) -> None:
    genes = np.asarray(genes if genes is not None else [])
    if genes.ndim != 1 or not np.issubdtype(genes.dtype, np.integer):
        raise ScheduleError(f"the gene list is not a vector of integer indices (dtype {genes.dtype})")
    distinct = len(np.unique(genes))
    in_range = len(genes) == 0 or (0 <= int(genes.min()) and int(genes.max()) < n_vars)
    if len(genes) != n_genes or distinct != len(genes) or not in_range:
        raise ScheduleError(
            f"{len(genes)} gene indices ({distinct} distinct) where the plan reads {n_genes} distinct genes "
            f"of {n_vars}"
        )


def _check_finite(name: str, values: Any, shape: tuple[int, ...]) -> np.ndarray:
    values = np.asarray(values if values is not None else np.zeros((0, 0)))
    if values.shape != shape:
        raise ScheduleError(f"{name} of shape {values.shape} where the plan expects {shape}")
    if not np.issubdtype(values.dtype, np.floating) and not np.issubdtype(values.dtype, np.integer):
        raise ScheduleError(f"{name} of dtype {values.dtype}")
    values = values.astype(np.float64)
    if not np.isfinite(values).all() or (values.size and np.abs(values).max() > MAX_PUBLIC_VALUE):
        raise ScheduleError(f"{name} with values that are not finite or above {MAX_PUBLIC_VALUE:g}")
    return values


def _check_loadings(loadings: Any, n_genes: int, width: int) -> None:
    values = _check_finite("loadings", loadings, (n_genes, width))
    if np.abs(values.T @ values - np.eye(width)).max() > ORTHONORMAL_TOL:
        raise ScheduleError("loadings whose columns are not orthonormal")


def _check_basis(basis: Any, genes: Any, loadings: Any, n_vars: int) -> None:
    """Refuse a public basis unless its genes and loadings are the request's, μ finite and s ≥ its floor."""
    if not isinstance(basis, PublicBasis):
        raise ScheduleError(f"a public basis of type {type(basis).__name__}")
    same = np.array_equal(basis.genes, genes) and np.array_equal(basis.loadings, loadings)
    n_genes = len(basis.genes)
    if not same:
        raise ScheduleError("a public basis whose genes or loadings are not the request's")
    _check_gene_list(basis.shared, n_vars, max(1, len(np.asarray(basis.shared))))
    _check_finite("the basis' gene means", basis.means, (n_genes,))
    scales = _check_finite("the basis' gene scales", basis.scales, (n_genes,))
    if (scales < MIN_SCALE).any():
        raise ScheduleError(f"gene scales below {MIN_SCALE:g}")
    for name, value in (("target sum", basis.target_sum), ("radius", basis.radius)):
        if value is not None and not (np.isfinite(value) and 0 < value <= MAX_PUBLIC_VALUE):
            raise ScheduleError(f"a basis {name} of {value!r}")


def _check_assignment(assignment: Any, kind: str, rows: int, width: int) -> None:
    if not isinstance(assignment, _kmeans.Assignment) or assignment.kind != kind:
        got = getattr(assignment, "kind", None)
        raise ScheduleError(f"a k-means assignment of kind {got!r} where the plan has {kind!r}")
    bits = int(np.log2(rows))
    shape = (width, bits) if kind == "sketch" else (rows, width)
    _check_finite(f"the {kind} assignment", assignment.matrix, shape)


@dataclass(frozen=True)
class ClusterPlan(PlanSettings):
    """A whole private clustering, fixed before any cell is read (public: sent to every site).

    ``releases`` is the plan as the one plan type (:class:`~dpsc.privacy.ReleasePlan`): every release
    the clustering makes, in order, each with its σ (q = 1; the k-means release counts
    :attr:`kmeans_steps` steps), and the (ε, δ) they were calibrated for; the σ live there only.
    The other fields are the clustering's public settings. Build one with :meth:`of` (or
    :func:`plan_clustering`, which calibrates).
    """

    releases: ReleasePlan
    n_vars: int
    n_clusters: int
    n_genes: int  # genes the PCA reads: selected when fewer than n_vars
    n_comps: int
    random_state: int = 0
    kmeans: dict[str, Any] = field(default_factory=lambda: kmeans_plan())
    markers: bool = False  # a last release: each cluster's marker statistics (:mod:`._markers`)
    #: genes and loadings come from a public reference (:mod:`._public_basis`): only the k-means
    #: (and marker) releases read the cells
    public_basis: bool = False
    #: the plan opens with the count that chooses the k-means start (:mod:`._type_gate`); the plan
    #: is one branch (its ``kmeans``), :meth:`branch` gives either, which follow the same count
    gated: bool = False
    #: a gated plan's k-means σ in each branch, in :data:`BRANCHES` order (its other σ serve both)
    branch_sigmas: tuple[float, float] = (0.0, 0.0)
    #: what one individual is: ``"cell"``, or ``"donor"`` (each cell's contribution weighted
    #: 1/its donor's cells, :mod:`dpsc.privacy._unit`); the same σ serve both
    unit: str = "cell"

    def __post_init__(self) -> None:
        names = tuple(r.name for r in self.releases.releases)
        if names != self.kinds:
            raise ValueError(f"A clustering of these settings makes the releases {self.kinds}, not {names}.")
        if self.releases["kmeans"].steps != self.kmeans_steps:
            raise ValueError(f"The k-means release takes {self.kmeans_steps} steps with these settings.")

    @classmethod
    def of(
        cls,
        epsilon: float | None,
        delta: float,
        *,
        n_vars: int,
        n_clusters: int,
        n_genes: int,
        sigmas: dict[str, float],
        n_comps: int | None = None,
        random_state: int = 0,
        kmeans: dict[str, Any] | None = None,
        markers: bool = False,
        accountant: str = "rdp",
        public_basis: bool = False,
        gated: bool = False,
        branch_sigmas: tuple[float, float] = (0.0, 0.0),
        unit: str = "cell",
    ) -> ClusterPlan:
        """Return the plan of these settings whose releases carry ``sigmas`` (by kind; no calibration).

        ``sigmas`` may name kinds the plan does not make (a site's or a server's full table); they
        are not part of the plan. ``epsilon`` and ``delta`` are the target the σ were calibrated for.
        ``n_comps`` defaults to :data:`N_COMPS` (at most ``n_genes - 1``), ``kmeans`` to
        :func:`kmeans_plan`.
        """
        kmeans = kmeans_plan() if kmeans is None else kmeans
        n_comps = min(N_COMPS, n_genes - 1) if n_comps is None else n_comps
        kinds = release_kinds(n_genes < n_vars, markers, epsilon is not None, public_basis, gated)
        steps = kmeans_steps(kmeans)
        releases = ReleasePlan.of(
            *(
                PlannedRelease(k, steps=steps if k == "kmeans" else 1, sigma=float(sigmas.get(k, 0.0)))
                for k in kinds
            ),
            accountant=accountant,
            epsilon=epsilon,
            delta=delta,
        )
        settings = (n_vars, n_clusters, n_genes, n_comps, random_state, kmeans, markers, public_basis, gated)
        return cls(releases, *settings, tuple(float(v) for v in branch_sigmas), unit)

    @property
    def sigmas(self) -> dict[str, float]:
        """σ of every kind a clustering can release, 0 for the kinds this plan does not make."""
        made = self.releases.sigmas
        return {kind: made.get(kind, 0.0) for kind in (*KINDS, *MARKER_KINDS, TYPE_COUNT)}

    @property
    def select_genes(self) -> bool:
        """Whether the plan starts with the DP gene selection (it reads fewer genes than there are)."""
        return self.n_genes < self.n_vars and not self.public_basis

    @property
    def kmeans_steps(self) -> int:
        """Releases of the k-means step."""
        return kmeans_steps(self.kmeans)

    @property
    def marker_kinds(self) -> tuple[str, ...]:
        """The marker releases the plan makes: none without markers; without ε no histogram of norms."""
        return marker_kinds(self.markers, self.epsilon is not None, self.public_basis)

    @property
    def n_releases(self) -> int:
        """Every release of the plan, in order."""
        pca = 0 if self.public_basis else 2
        return int(self.gated) + int(self.select_genes) + pca + self.kmeans_steps + len(self.marker_kinds)

    @property
    def most_releases(self) -> int:
        """The releases of the longer branch of a gated plan (:meth:`branch`); else :attr:`n_releases`.

        What a site's ``max_rounds`` is checked against before it serves the first release.
        """
        if not self.gated:
            return self.n_releases
        longest = max(kmeans_steps(kmeans_plan(public_start)) for public_start in (True, False))
        return self.n_releases - self.kmeans_steps + longest

    def release_delta(self, index: int) -> float:
        """Return the δ a site books release ``index`` with: the plan's δ split over its releases.

        A gated plan's count (release 0) is booked before its branch is known, with the share
        :data:`~._type_gate.COUNT_DELTA_SHARE` of δ; the rest of δ is split over the branch's other
        releases, so that the releases of either branch add up to the plan's δ, and the type start's
        single k-means release, which holds nearly all of the ε, is booked at nearly the whole δ (a
        line's own ε at its δ never exceeds the plan's; the ledger composes the lines at their sum).
        """
        if not self.gated:
            return self.delta / self.n_releases
        count = self.delta * _type_gate.COUNT_DELTA_SHARE
        return count if index == 0 else (self.delta - count) / (self.n_releases - 1)

    @property
    def start(self) -> str:
        """The k-means start of a plan on a public basis (:data:`BRANCHES`): ``"types"`` or ``"sketch"``."""
        return "sketch" if self.kmeans["n_sketch_steps"] else "types"

    def branch(self, start: str) -> ClusterPlan:
        """Return the plan a gated clustering follows after its count: ``"types"`` or ``"sketch"``.

        The same releases and σ but the k-means: the type start's single Lloyd release, or the
        sketch's releases, with that branch's σ (:attr:`branch_sigmas`, calibrated with the rest to
        the same (ε, δ)). No calibration. Raises for another name, or a plan that is not gated.
        """
        if not self.gated or start not in BRANCHES:
            raise ValueError(f"Only a gated plan has branches, {BRANCHES}; got {start!r}.")
        return ClusterPlan.of(
            self.epsilon,
            self.delta,
            n_vars=self.n_vars,
            n_clusters=self.n_clusters,
            n_genes=self.n_genes,
            n_comps=self.n_comps,
            sigmas={**self.sigmas, "kmeans": self.branch_sigmas[BRANCHES.index(start)]},
            random_state=self.random_state,
            kmeans=kmeans_plan(public_start=start == "types"),
            markers=self.markers,
            accountant=self.accountant,
            public_basis=True,
            gated=True,
            branch_sigmas=self.branch_sigmas,
            unit=self.unit,
        )

    def kmeans_signal(self, n_individuals: float) -> tuple[int, float, float]:
        r"""Return the k-means table's rows, the expected weight per row and its count's noise sd.

        Each of the rows (k from a public start, else the :attr:`coreset_size` Lloyd centroids)
        holds about :math:`n/\text{rows}` of the ``n_individuals`` (cells, or donors at the donor
        unit, whose weights add up to 1 each); one release's count carries noise of sd
        :math:`\sigma\Delta/(\kappa R) = \sigma\sqrt{1+\kappa^2}/\kappa`. A row whose expected
        weight is below twice that sd is below the test a released count must pass to be in use
        (:func:`~._kmeans.clusters_above_noise`): the result is then dominated by noise. Reads the
        plan and a number only.
        """
        rows = self.n_clusters if self.start == "types" and self.public_basis else self.coreset_size
        kappa = float(self.kmeans["count_scale"])
        noise_sd = self.sigmas["kmeans"] * _kmeans.table_sensitivity(CLIP_NORM, kappa) / (kappa * CLIP_NORM)
        return rows, float(n_individuals) / rows, float(noise_sd)

    @property
    def releases_in_words(self) -> str:
        """The plan's releases as a record states them: "1 discrete Gaussian release", "5 … releases"."""
        return f"{self.n_releases} discrete Gaussian release{'' if self.n_releases == 1 else 's'}"

    @property
    def coreset_size(self) -> int:
        """m, the centroids of the DP k-means' Lloyd rounds (``oversampling`` × k)."""
        return int(self.kmeans["oversampling"]) * int(self.n_clusters)

    @property
    def sketch_bits(self) -> int:
        r"""Projection bits of the DP k-means sketch (at least :math:`\lceil\log_2 2m\rceil`)."""
        return max(int(self.kmeans["n_bits"]), int(np.ceil(np.log2(2 * self.coreset_size))))

    def schedule(self) -> tuple[ReleaseStep, ...]:
        """Return the plan's releases as the steps they are served in: what each sums, its size and inputs.

        The one definition of the clustering's requests: :func:`run_clustering` checks each request
        it makes against it, and a federated site (:class:`dpsc.federated.Site`) serves exactly
        these steps, each once, in this order, and refuses anything else. Each step is one draw of a
        release of :attr:`releases` (its σ is that release's), and the schedule holds exactly each
        release's planned number of steps, so what a site serves is what the plan accounts for.
        """
        k, m, d = self.kmeans, self.coreset_size, self.n_comps
        entries: list[tuple] = []
        if self.gated:
            entries.append((TYPE_COUNT, 2, _type_gate.SENSITIVITY, None, 0, 0))
        if self.select_genes:
            entries.append(("genes", 2 * self.n_vars + 1, _hvg.SENSITIVITY, None, 0, 0))
        if not self.public_basis:
            entries.append(("sum", self.n_genes, 1.0, None, 0, 0))
            entries.append(("pca", self.n_genes * (self.n_genes + 1) // 2, 1.0, None, 0, 1))
        sensitivity = _kmeans.table_sensitivity(CLIP_NORM, k["count_scale"])
        sketch_rows = 2**self.sketch_bits
        for _ in range(k["n_sketch_steps"]):
            entries.append(("kmeans", sketch_rows * (d + 1), sensitivity, "sketch", sketch_rows, d))
        refine = int(k.get("refine_rounds", 0))
        for _ in range((k["n_lloyd_rounds"] - refine) * k["steps_per_round"]):
            entries.append(("kmeans", m * (d + 1), sensitivity, "nearest", m, d))
        for _ in range(refine * k["steps_per_round"]):
            rows = self.n_clusters
            entries.append(("kmeans", rows * (d + 1), sensitivity, "nearest", rows, d))
        if self.markers:
            table = _markers.MarkerTable(self.n_clusters, self.n_vars)
            if "marker_center" in self.marker_kinds:  # else the public reference's centre
                entries.append(("marker_center", self.n_vars + 1, 1.0, None, 0, 0))
            if "marker_norms" in self.marker_kinds:
                norms = _markers.norm_release(0.0)
                entries.append(("marker_norms", norms.size, norms.sensitivity, None, 0, 0))
            entries.append(
                ("markers", self.n_clusters * table.width, table.sensitivity, "nearest", self.n_clusters, d)
            )
            if "marker_focus" in self.marker_kinds:  # at most FOCUS_GENES genes per cluster
                width = 3 * min(self.n_vars, self.n_clusters * _markers.FOCUS_GENES) + 1
                rows = self.n_clusters
                entries.append(("marker_focus_norms", norms.size, norms.sensitivity, None, rows, 0))
                entries.append(("marker_focus", rows * width, table.sensitivity, "nearest", rows, d))
        steps = tuple(
            ReleaseStep(
                index,
                self.releases[kind],
                size,
                delta,
                assignment,
                rows,
                width,
                self.public_basis and assignment is not None,
            )
            for index, (kind, size, delta, assignment, rows, width) in enumerate(entries)
        )
        served = Counter(step.kind for step in steps)
        if served != {r.name: r.steps for r in self.releases.releases}:  # what is served is what is accounted
            raise ValueError(
                f"The schedule {dict(served)} does not expand the plan's releases {self.releases}."
            )
        return steps

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of release the plan makes, in order (the gene selection only when it selects)."""
        private = self.epsilon is not None
        return release_kinds(self.select_genes, self.markers, private, self.public_basis, self.gated)

    def history(self) -> list[tuple[float, float, int]]:
        """Return the Opacus history of the whole clustering (every release reads all cells: q = 1)."""
        return self.releases.history()

    def spent(self) -> float | None:
        """ε of the whole plan at δ (``None`` without privacy)."""
        return None if self.epsilon is None else self.releases.spent()

    def to_config(self) -> dict[str, Any]:
        """Return the plan as flat scalars (a Flower ConfigRecord)."""
        return {
            "epsilon": -1.0 if self.epsilon is None else float(self.epsilon),
            "delta": float(self.delta),
            "n-vars": int(self.n_vars),
            "n-clusters": int(self.n_clusters),
            "n-genes": int(self.n_genes),
            "n-comps": int(self.n_comps),
            "random-state": int(self.random_state),
            "markers": int(self.markers),
            "public-basis": int(self.public_basis),
            "gated": int(self.gated),
            "donor-unit": int(self.unit == "donor"),
            **{
                f"sigma-kmeans-{name}": sigma
                for name, sigma in zip(BRANCHES, self.branch_sigmas, strict=True)
            },
            "kmeans-sketch-steps": int(self.kmeans["n_sketch_steps"]),
            **{f"sigma-{k}": float(v) for k, v in self.sigmas.items()},
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ClusterPlan:
        """Inverse of :meth:`to_config` (σ of kinds the plan does not make are not part of it).

        The k-means settings are :func:`kmeans_plan`'s; a plan on a public basis may start from
        public centroids and so make no sketch release (``kmeans-sketch-steps`` 0).
        """
        epsilon = float(config["epsilon"])
        public_basis = bool(int(config.get("public-basis", 0)))
        sketch = int(config.get("kmeans-sketch-steps", KMEANS_PLAN["n_sketch_steps"]))
        kmeans = kmeans_plan(public_start=public_basis and sketch == 0)
        return cls.of(
            None if epsilon < 0 else epsilon,
            float(config["delta"]),
            n_vars=int(config["n-vars"]),
            n_clusters=int(config["n-clusters"]),
            n_genes=int(config["n-genes"]),
            n_comps=int(config["n-comps"]),
            sigmas={k: float(config.get(f"sigma-{k}", 0.0)) for k in (*KINDS, *MARKER_KINDS, TYPE_COUNT)},
            random_state=int(config["random-state"]),
            markers=bool(int(config.get("markers", 0))),
            kmeans=kmeans,
            public_basis=public_basis,
            gated=public_basis and bool(int(config.get("gated", 0))),
            branch_sigmas=tuple(float(config.get(f"sigma-kmeans-{name}", 0.0)) for name in BRANCHES),
            unit="donor" if int(config.get("donor-unit", 0)) else "cell",
        )


def marker_kinds(markers: bool, private: bool, public_center: bool = False) -> tuple[str, ...]:
    """Return the marker releases a clustering makes (none without markers; some with noise only).

    Without noise there is neither a histogram of the norms nor a focused table. ``public_center``:
    the centre is a public reference's (:attr:`~._public_basis.PublicBasis.marker_center`), so it
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
    the count that chooses the k-means start when the plan is ``gated`` (:mod:`._type_gate`).
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
    Lloyd rounds of the k reduced centroids (:func:`~._kmeans.dp_kmeans_centroids`). With a
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


def _kinds(n_vars: int, n_genes: int | None) -> tuple[str, ...]:
    """Return the releases a plan is calibrated with: the gene selection above :data:`MIN_GENES` genes.

    Also when a stated ``n_genes`` (a site checking a server's plan) is below ``n_vars``.
    """
    selecting = n_vars > MIN_GENES or (n_genes is not None and n_genes < n_vars)
    return KINDS if selecting else KINDS[1:]


def _split(epsilon: float, delta: float, kinds: tuple[str, ...], steps: int, accountant: str) -> ReleasePlan:
    """Return the calibrated plan of these releases, the shares of :data:`SHARES` composed to (ε, δ).

    One σ search per release (:meth:`~dpsc.privacy.ReleasePlan.calibrate`).
    """
    parts = _markers.FOCUSED_SHARES
    total = sum(parts.values())
    shares = {**SHARES, **{kind: MARKERS_SHARE * parts[part] / total for kind, part in MARKER_PARTS.items()}}
    shares[TYPE_COUNT] = _type_gate.COUNT_SHARE * SHARES["kmeans"]
    releases = [PlannedRelease(k, share=shares[k], steps=steps if k == "kmeans" else 1) for k in kinds]
    return ReleasePlan.of(*releases, accountant=accountant).calibrate(epsilon, delta)


def plan_clustering(
    epsilon: float | None,
    delta: float,
    *,
    n_vars: int,
    n_clusters: int,
    n_obs: int | None = None,
    n_genes: int | None = None,
    random_state: int = 0,
    accountant: str = "rdp",
    markers: bool = False,
    public_basis: PublicBasis | None = None,
    public_start: bool | None = None,
    gated: bool | None = None,
    unit: str = "cell",
) -> ClusterPlan:
    """Split (ε, δ) over the releases by :data:`SHARES`, calibrate each σ once, choose the genes.

    The number of genes the PCA reads is ``n_genes`` when given (a site checking a server's plan),
    else :func:`genes_for` at the PCA's σ of a plan with gene selection. One calibration: a plan
    over more than :data:`MIN_GENES` genes is calibrated with the gene selection, one σ search per
    release; when it reads every gene, that release leaves the plan and its share goes to the
    others (:meth:`~dpsc.privacy.ReleasePlan.without`: one common scale, no second σ search), as in
    a fit's start (:func:`dpsc.model._dcan_privacy.start_parts`).
    Reads no cell: ``n_obs`` (the number of cells, public) is needed when the matrix has more than
    :data:`MIN_GENES` genes and there is noise. ``markers``: the plan ends with the release of each
    cluster's marker statistics, its share :data:`MARKERS_SHARE` of the same (ε, δ).
    ``public_basis``: genes and components from a public reference (:mod:`._public_basis`); the
    whole ε goes to the k-means (and marker) releases, with no sketch release when the k-means
    starts from public centroids (``public_start``; ``None``: when the basis holds a start).
    ``gated``: the plan opens with the count that chooses between the type start and the sketch
    (:mod:`._type_gate`; ``None``: when the basis holds a start with its types' radii); the plan
    returned is the type start's branch (:meth:`ClusterPlan.branch`). ``unit``: what one
    individual is, ``"cell"`` or ``"donor"``; the calibration is the same (every release keeps its
    bound per donor, :func:`contribution` with weights), the plan states it.
    """
    if unit not in ("cell", "donor"):
        raise ValueError(f"unit must be 'cell' or 'donor', got {unit!r}.")
    extra = MARKER_KINDS if markers else ()
    if public_basis is not None:
        start = public_basis.start is not None if public_start is None else bool(public_start)
        gate = start and public_basis.start_radii is not None if gated is None else bool(gated)
        shape = (len(public_basis.genes), public_basis.n_comps)
        plan = _plan_on_public_basis(
            epsilon, delta, n_vars, n_clusters, shape, random_state, accountant, markers, start, gate
        )
        return replace(plan, unit=unit)
    if n_vars < 3:
        raise ValueError(f"A clustering needs at least 3 genes, got {n_vars}.")
    steps = kmeans_steps(kmeans_plan())
    sigmas = dict.fromkeys((*KINDS, *MARKER_KINDS), 0.0)
    if epsilon is None:
        n_genes = genes_for(0, 0.0, n_vars) if n_genes is None else n_genes
    else:
        if n_vars > MIN_GENES and n_genes is None and n_obs is None:
            raise ValueError("plan_clustering needs n_obs (the number of cells) to choose the genes.")
        split = _split(float(epsilon), delta, (*_kinds(n_vars, n_genes), *extra), steps, accountant)
        if n_genes is None:
            n_genes = genes_for(n_obs or 0, split.sigma("pca"), n_vars)
        if n_genes == n_vars and "genes" in split:  # every gene read: no gene selection
            split = split.without("genes")  # its share goes to the rest, with no second σ search
        sigmas.update(split.sigmas)
    if not 3 <= n_genes <= n_vars:
        raise ValueError(f"A clustering reads between 3 and {n_vars} genes, got {n_genes}.")
    return ClusterPlan.of(
        epsilon,
        delta,
        n_vars=n_vars,
        n_clusters=n_clusters,
        n_genes=n_genes,
        sigmas=sigmas,
        random_state=random_state,
        markers=markers,
        accountant=accountant,
        unit=unit,
    )


def _plan_on_public_basis(
    epsilon: float | None,
    delta: float,
    n_vars: int,
    n_clusters: int,
    shape: tuple[int, int],
    random_state: int,
    accountant: str,
    markers: bool,
    public_start: bool,
    gated: bool = False,
) -> ClusterPlan:
    """Return the plan of a clustering on public genes and loadings (``shape``: genes × components).

    The k-means (and marker) releases only; a ``gated`` plan opens with the count that chooses the
    start: each branch (the type start's k-means, the sketch's) is calibrated with the count and the
    markers to (ε, δ), and every release but the k-means gets the larger of its two σ
    (:mod:`._type_gate`: either branch then spends at most (ε, δ); its k-means σ is kept per branch).
    """
    kinds = (*((TYPE_COUNT,) if gated else ()), "kmeans", *marker_kinds(markers, epsilon is not None, True))
    kmeans = kmeans_plan(public_start)  # public starting centroids: no sketch release
    sigmas = dict.fromkeys((*KINDS, *MARKER_KINDS, TYPE_COUNT), 0.0)
    branch_sigmas = (0.0, 0.0)
    if epsilon is not None and gated:  # each branch calibrated; every release but its k-means serves both
        splits = [
            _split(float(epsilon), delta, kinds, kmeans_steps(kmeans_plan(b == "types")), accountant)
            for b in BRANCHES
        ]
        sigmas.update({kind: max(split.sigma(kind) for split in splits) for kind in kinds})
        branch_sigmas = tuple(split.sigma("kmeans") for split in splits)
        sigmas["kmeans"] = branch_sigmas[0 if public_start else 1]
    elif epsilon is not None:
        sigmas.update(_split(float(epsilon), delta, kinds, kmeans_steps(kmeans), accountant).sigmas)
    return ClusterPlan.of(
        epsilon,
        delta,
        n_vars=n_vars,
        n_clusters=n_clusters,
        n_genes=shape[0],
        n_comps=shape[1],
        sigmas=sigmas,
        random_state=random_state,
        kmeans=kmeans,
        markers=markers,
        accountant=accountant,
        public_basis=True,
        gated=gated,
        branch_sigmas=branch_sigmas,
    )


@dataclass(frozen=True)
class Request:
    """Which sum a release asks for, with what was released before it (all public).

    ``kind`` is one of :data:`KINDS`; ``index`` counts the plan's releases; ``genes`` (indices of the
    genes the PCA reads), ``loadings`` (those genes × the loadings released so far: the mean
    direction for ``"pca"``, all of them for ``"kmeans"``) and ``assignment`` (the k-means rows) are
    set for the steps that need them; ``frame`` (the released centre, and for the tables the
    released bounds of the cells' expression, :class:`~._markers.MarkerFrame`) for the marker
    histograms and tables; ``columns`` (the genes of the focused marker table, post-processing of
    the first) for the focused histograms and table; ``basis`` (the public reference's map of a
    cell to its point, :mod:`._public_basis`) for the k-means and marker tables of a plan on one.
    """

    kind: str
    index: int
    sigma: float
    genes: np.ndarray | None = None
    loadings: np.ndarray | None = None
    assignment: _kmeans.Assignment | None = None
    frame: _markers.MarkerFrame | None = None
    columns: np.ndarray | None = None
    basis: PublicBasis | None = None  # the public map of a cell to its k-means point, when public
    branch: str = ""  # the start a gated plan follows after its count (:data:`BRANCHES`), once chosen

    def marker_table(self, n_vars: int) -> _markers.MarkerTable:
        """Return the layout of the marker table this request asks for (over ``columns`` when focused)."""
        rows = self.assignment.n_rows
        if self.columns is None:
            return _markers.MarkerTable(rows, n_vars, self.frame)
        return _markers.MarkerTable(rows, len(self.columns), self.frame, columns=np.asarray(self.columns))

    def release(self, n_vars: int, count_scale: float = KMEANS_PLAN["count_scale"]) -> GaussianSum:
        """Return the :class:`GaussianSum` this request's sum is released with."""
        if self.kind == "genes":
            return _hvg.gene_statistics_release(n_vars, self.sigma)
        if self.kind == "sum":
            return _pca.cell_sum_release(len(self.genes), self.sigma)
        if self.kind == "pca":
            return _pca.second_moment_release(len(self.genes), self.sigma)
        if self.kind == "kmeans":
            d = self.loadings.shape[1]
            return _kmeans.table_release(self.assignment.n_rows, d, CLIP_NORM, count_scale, self.sigma)
        if self.kind == "marker_center":
            return _markers.center_release(n_vars, self.sigma)
        if self.kind == "marker_norms":
            return _markers.norm_release(self.sigma)
        if self.kind == "marker_focus_norms":
            return _markers.norm_release(self.sigma)
        if self.kind in ("markers", "marker_focus"):
            return _markers.marker_release(self.marker_table(n_vars), self.sigma)
        if self.kind == TYPE_COUNT:
            return GaussianSum(RELEASE_NAMES[TYPE_COUNT], 2, _type_gate.SENSITIVITY, self.sigma)
        raise ValueError(f"Unknown release {self.kind!r}; the clustering has {KINDS}.")


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
    """:func:`contribution` over rows held in memory (or backed), weighted as it says."""
    if request.kind == "kmeans":
        points = cell_points(matrix, request.genes, request.loadings, request.basis)
        return _kmeans.kmeans_table(points, request.assignment, CLIP_NORM, count_scale, weights=weights)
    if request.kind == TYPE_COUNT:  # each cell's point against the public start and its types' radii
        basis = request.basis
        points = cell_points(matrix, None, None, basis)
        return _type_gate.inside_counts(points, basis.start, basis.start_radii, weights)
    if request.kind == "genes":
        return _hvg.gene_sums(matrix, True, _hvg.DEFAULT_SQUARE_CLIP, weights)
    if request.kind == "sum":
        return _pca.cell_sum(matrix, True, columns=request.genes, weights=weights)
    if request.kind == "pca":
        return _pca.upper(_pca.second_moment(matrix, True, request.genes, request.loadings, weights))
    if request.kind == "marker_center":
        return _markers.center_sum(matrix, weights)
    if request.kind in ("marker_norms", "marker_focus_norms"):
        return _markers.norm_histograms(matrix, request.frame.center, request.columns, weights)
    if request.kind in ("markers", "marker_focus"):  # each cell's cluster: its nearest released centroid
        points = cell_points(matrix, request.genes, request.loadings, request.basis)
        labels = _kmeans.nearest_centroid(points, request.assignment.matrix, "euclidean")
        return _markers.group_table(matrix, labels, request.marker_table(matrix.shape[1]), weights)
    raise ValueError(f"Unknown release {request.kind!r}; the clustering has {KINDS}.")


def cell_points(
    matrix: Any, genes: np.ndarray, loadings: np.ndarray, basis: PublicBasis | None = None
) -> np.ndarray:
    r"""Each cell's k-means point: :math:`x_i = (w\,z_i^\top u,\ z_i^\top v_1, …) / \lVert\cdot\rVert_2`.

    The projection on the released loadings with the mean direction's coordinate weighted by
    :data:`MEAN_WEIGHT`, scaled to unit norm (cosine; a map of each cell alone). With a public
    ``basis``: its point :math:`p_i` (:mod:`._public_basis`; norm at most 1).
    """
    if basis is not None:
        return np.asarray(basis.points(matrix))
    weights = np.ones(loadings.shape[1])
    weights[0] = MEAN_WEIGHT
    return _kmeans.kmeans_points(_pca.project(matrix, loadings * weights, True, columns=genes), "cosine")


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
    marker_table: np.ndarray | None = None  # the released per-cluster marker statistics (:mod:`._markers`)
    marker_frame: _markers.MarkerFrame | None = None  # the released centre and bounds of that table
    marker_focus_genes: np.ndarray | None = None  # the focused table's genes (post-processing)
    marker_focus_table: np.ndarray | None = None  # the released statistics over them
    marker_focus_frame: _markers.MarkerFrame | None = None  # that table's centre and released bounds
    basis: PublicBasis | None = None  # the public reference's map of a cell to its point, when used
    #: each centroid's noise sd per coordinate (:func:`~._kmeans.dp_kmeans_centroids`; post-processing)
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
            released, spec, _hvg.DEFAULT_SQUARE_CLIP, 3.0, GENE_RANKING
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

    :mod:`._type_gate`: one release of sensitivity 1; the choice is post-processing of it.
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

    U is post-processing of the first marker table (:func:`~._markers.focus_genes` of its ranking),
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
