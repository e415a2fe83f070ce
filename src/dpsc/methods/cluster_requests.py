"""The request protocol of the private clustering: one request per release, checked against the plan.

A :class:`Request` names the sum a release asks for and carries what was released before it (all
public); a :class:`ReleaseStep` is one step of a plan's schedule, and :meth:`ReleaseStep.check`
refuses any request that is not it, reading the request only, never a cell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..privacy import GaussianSum, PlannedRelease
from . import kmeans as _kmeans
from . import markers as _markers
from .cluster_design import (
    KMEANS_PLAN,
    MAX_PUBLIC_VALUE,
    ORTHONORMAL_TOL,
)
from .public_basis import MIN_SCALE, PublicBasis
from .release_kinds import kind_of


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
        return GaussianSum(kind_of(self.kind).words, size, self.sensitivity, self.sigma)

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
        carries = kind_of(self.kind).carries
        if not carries:  # a site counts in its own basis
            return
        n_columns = n_vars
        if "columns" in carries:
            n_columns = _check_focus_genes(request.columns, n_vars, self.rows * _markers.FOCUS_GENES)
        if "frame" in carries:  # a table (it carries an assignment) needs the released bounds too
            _check_frame(request.frame, n_columns, bounds="assignment" in carries)
        if "genes" not in carries:
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
class Request:
    """Which sum a release asks for, with what was released before it (all public).

    ``kind`` is one of :data:`KINDS`; ``index`` counts the plan's releases; ``genes`` (indices of the
    genes the PCA reads), ``loadings`` (those genes × the loadings released so far: the mean
    direction for ``"pca"``, all of them for ``"kmeans"``) and ``assignment`` (the k-means rows) are
    set for the steps that need them; ``frame`` (the released centre, and for the tables the
    released bounds of the cells' expression, :class:`~.markers.MarkerFrame`) for the marker
    histograms and tables; ``columns`` (the genes of the focused marker table, post-processing of
    the first) for the focused histograms and table; ``basis`` (the public reference's map of a
    cell to its point, :mod:`.public_basis`) for the k-means and marker tables of a plan on one.
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
        """Return the :class:`GaussianSum` this request's sum is released with (its kind's)."""
        return kind_of(self.kind).release(self, n_vars, count_scale)
