r"""Private marker genes: Gaussian releases of per-group sums, then scanpy's t-test on them.

**Per-cell contribution.** Cell :math:`i` of group :math:`g(i)` is represented by its log
expression :math:`x_i = \log(1 + 10^4 c_i / \sum_j c_{ij})` over the G genes (scanpy's
``normalize_total`` + ``log1p``; a negative or non-finite count reads as 0, a cell without counts
is 0), measured from a released centre :math:`m` (the cells' mean expression) and weighted per gene
by :math:`g = g(m)` (:func:`gene_weights`, a public map of the centre): :math:`y_i = g \odot (x_i -
m)`, its squared entries weighted again, :math:`q_i = g^2 \odot (x_i - m)^2`, and its detection
:math:`d_i = [x_i > 0]`. Three releases, in order, then a focused pair:

1. **the centre** (:func:`center_sum`, :func:`released_center`): the sum of
   :math:`(x_i / B_2(G), 1) / \sqrt 2` over the cells (the expression sums and the count), with
   :math:`B_p(G) = \max_{1\le k\le G} \sqrt k\,\log(1 + 10^4/k)^{p/2}`
   (:func:`expression_bound`; the norm of a cell whose counts are spread evenly over k genes, the
   largest over k, so :math:`\lVert x_i\rVert_2 \le B_2(G)` always and the sensitivity is 1).
   :math:`m` is the noisy mean, shrunk toward 0 by its noise (:math:`m = \max(0, 1 - 2 G s^2 /
   \lVert\tilde m\rVert^2)\,\tilde m`, s the noise sd of a coordinate) and clipped to
   :math:`[0, \log(1 + 10^4)]`: post-processing. Measured from the mean, a cell's vector is
   shorter than from 0, so the bounds below, and the noise proportional to them, are smaller;
2. **the bounds** (:func:`norm_histograms`, :func:`released_frame`): histograms of
   :math:`\lVert y_i\rVert_2` and :math:`\lVert q_i\rVert_2` on :data:`NORM_BINS` bins each,
   spaced geometrically up to their worst cases :math:`\max_j g_j B_2(G) + \lVert g m\rVert` and
   :math:`\max_j g_j^2 B_4(G) + \lVert g^2 m^2\rVert` (for :math:`x, m \ge 0`,
   :math:`(x - m)^2 \le x^2 + m^2`);
   each cell adds 1 to one bin of each (sensitivity :math:`\sqrt 2`). :math:`C_y` and :math:`C_q`
   are the upper edges of the bins where the noisy cumulative counts first reach
   :data:`NORM_QUANTILE` of their noisy totals (post-processing; at most the worst cases);
3. **the table**: the row :math:`e_{g(i)} \otimes (w_x \mathrm{clip}_{C_y}(y_i) / C_y,\ w_s
   \mathrm{clip}_{C_q}(q_i) / C_q,\ w_d \mathrm{clip}_{C_d}(d_i) / C_d,\ w_n)` of a groups ×
   (3G + 1) table (weights :data:`WEIGHTS`; :math:`C_d = \sqrt{\min(G, 2000)}`,
   :data:`DETECTION_GENES`). The cells above a bound (most cells: it is a low quantile) are
   scaled down to it, so every mean and variance carries noise proportional to a short bound;
   their group's statistics are then shrunk toward the centre, nearly alike for every gene of the
   group, which keeps the genes' ranks and shrinks their fold changes a little. A cell adds to
   its own group's row only, so adding or removing one cell changes the table by at most
   :math:`\Delta = \sqrt{w_x^2 + w_s^2 + w_d^2 + w_n^2}` in L2, whatever the groups, the centre
   and the bounds are (all public when the table is released; a cell in no group adds nothing);
4. **the focused table** (``tl.rank_genes_groups`` with ε): U, the union of each group's
   :data:`FOCUS_GENES` best genes in the ranked table (:func:`focus_genes`, post-processing), then
   releases 2 and 3 again with every cell's vector restricted to U: :math:`x_i` is still
   log1p(CP10k) of the whole cell, only its coordinates outside U are dropped
   (``MarkerTable.columns``), so the worst cases (with :math:`B_p(|U|)`) and Δ hold as above.
   Restricted to U the cells are much shorter, so the released bounds and the noise proportional to
   them are smaller; the genes of U take their statistics and ranks from this table
   (:func:`focused_result`).

**Sum and noise.** Each release is a :class:`~dpsc.privacy.GaussianSum` (:func:`center_release`,
:func:`norm_release`, :func:`marker_release`): three releases (five with the focused table)
composed by the accountant. Over sites each is the sum of the sites' ones (the clustering's own
markers make the first three).

**Post-processing** (:func:`projected_sums`, :func:`group_statistics`, :func:`rank_markers`): the
expression sums kept where they stand above the noise (their directions above the edge of the
noise's spectrum, and single entries beyond a universal threshold), then the sums back in the data's
units (the weights divided out, then :math:`\sum x = \sum y + \tilde n m`, :math:`\sum x^2 = \sum y^2
+ 2 m \sum y + \tilde n m^2`, y unweighted; gene j's noise sd is then the table's over
:math:`g_j`); noisy counts :math:`\tilde n_g` clipped to at least 1,
means :math:`\mu = S/\tilde n`, second moments, variances shrunk toward their mean–variance trend
by their known noise (:func:`shrunk_variances`) and clipped to at least 0, the rest of the
cells as the sum of the other groups; the t-test score of scanpy,
:math:`(\mu_g - \mu_r)/\sqrt{v_g/n_g + v_r/n_r}`, with the known variance of the noise of the two
means (as the projection leaves it) added under the root (a gene whose difference is within the
noise does not rank high);
Welch's degrees of freedom, p-values and Benjamini–Hochberg; scanpy's log fold change; the
fraction of cells expressing each gene. A group whose noisy count is near zero gets means of the
noise's size and scores near 0: its markers are noise, and ``rank_genes_groups`` says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import _blocks
from ..privacy import GaussianSum

DENSE_VALUES = 8_000_000  # values of the per-cell rows densified at once
DETECTION_GENES = 2000  # detection vectors are clipped to sqrt(min(G, this)) in L2
#: Weights of the four parts of a cell's row: the expression sums carry the marker signal, so they
#: get the largest share of the sensitivity; the squares (variances), detections (fractions
#: expressing) and the count rank no gene by themselves (a group's noisy count mostly rescales all
#: of its means at once). The detections keep 0.3: a fraction's noise sd is inversely proportional
#: to it. Chosen by leave one file out on every fold (docs, Benchmarks: the markers' constants).
WEIGHTS = {"sum": 1.0, "squares": 0.25, "detected": 0.3, "count": 0.15}
#: Δ, the L2 bound of one cell's row of the table: the norm of the weights (module docstring).
SENSITIVITY = math.sqrt(sum(w**2 for w in WEIGHTS.values()))
#: Bins of each histogram of the cells' norms that releases :math:`C_y` and :math:`C_q` (module docstring).
NORM_BINS = 64
#: :math:`C_y` and :math:`C_q` are the released norms below which this share of the cells lie. A
#: low bound scales most cells down toward the centre and shortens every sum's noise by the same
#: factor: the ranks gain more from the noise than they lose from the shrinkage. Chosen among 0.3 …
#: 0.95 by leave one file out (docs, Benchmarks: the markers' constants; 0.3 to 0.5 are level).
NORM_QUANTILE = 0.3
#: The largest log expression, :math:`\log(1 + 10^4)`: a centre coordinate lies in [0, this].
MAX_LOG_EXPRESSION = math.log1p(1e4)
#: Each gene's weight in the table grows with its released mean: :math:`g_j \propto (m_j + t)^a`
#: (:func:`gene_weights`), so a gene's sums carry noise of sd proportional to :math:`1/g_j`. The
#: markers scanpy ranks first are expressed genes; the weights move noise from them to the genes
#: near zero, which rarely rank high. a = 0 is the same noise on every gene. Chosen by leave one
#: file out (docs, Benchmarks: the markers' constants).
GENE_WEIGHT_POWER = 0.25
GENE_WEIGHT_OFFSET = 0.05  # t: the weight of a gene never detected, relative to one of mean 1
#: Bins of genes (by their noisy mean) in which a group's noisy variances are shrunk toward their
#: trend (:func:`shrunk_variances`); the count hardly matters (docs, Benchmarks: the markers' variances).
TREND_BINS = 20
#: The focused release (:func:`focus_genes`): after the first table, each group's this many best
#: genes (their union U, post-processing of that table) are released again, alone. A cell's
#: vector restricted to U is much shorter than over every gene, so the bounds released for it, and
#: the noise proportional to them, are smaller: the genes that can reach a group's top ranks get
#: their statistics from a table with less noise. Chosen by leave one file out (docs, Benchmarks:
#: the markers' constants).
FOCUS_GENES = 50
#: Shares of the markers' ε of their five releases: the centre (it sets where the cells are measured
#: from and the genes' weights, :func:`gene_weights`), the histograms of the norms and the table over
#: every gene, then the histograms of the norms over U and the table over U (:func:`focus_genes`).
#: Relative (the plan normalises them). Chosen by leave one file out (docs, Benchmarks: the
#: markers' constants).
FOCUSED_SHARES = {"center": 0.15, "norms": 0.05, "table": 0.3, "focus_norms": 0.05, "focus_table": 0.45}
#: A singular direction of the released groups × genes sums is kept when its singular value exceeds
#: this multiple of the largest one a table of pure noise reaches, :math:`s(\sqrt G + \sqrt K)`
#: (:func:`projected_sums`). 1: the edge of the noise's spectrum itself, a constant of the
#: mechanism, not of the data (docs, Benchmarks: the markers' projection).
NOISE_EDGE = 1.0


def gene_weights(center: np.ndarray) -> np.ndarray:
    r"""Return :math:`g_j = (m_j + t)^a / \sqrt{\tfrac1G \sum_k (m_k + t)^{2a}}` (public: the centre's map).

    A function of the released centre alone (:data:`GENE_WEIGHT_POWER`, :data:`GENE_WEIGHT_OFFSET`),
    fixed before the bounds and the table are released; scaled to root mean square 1. A centre of
    zeros (no privacy, or a centre within its noise) gives every gene weight 1.
    """
    center = np.asarray(center, dtype=np.float64)
    weights = (np.maximum(center, 0.0) + GENE_WEIGHT_OFFSET) ** GENE_WEIGHT_POWER
    return weights / math.sqrt(float(np.mean(weights**2)))


def expression_bound(n_genes: int, power: int = 2) -> float:
    r"""Return :math:`B_p(G) = \max_{1 \le k \le G} \sqrt k \log(1 + 10^4/k)^{p/2}` (module docstring)."""
    k = np.arange(1, int(n_genes) + 1, dtype=np.float64)
    return float(np.max(np.sqrt(k) * np.log1p(1e4 / k) ** (power / 2)))


def bound_floor(power: int) -> float:
    r"""Return the smallest bound an honest run releases for the part of ``power`` 1 (sums) or 2 (squares).

    A first table's bounds are upper edges of its histograms, at least :math:`e_1 \ge 1`
    (:func:`norm_edges`: the worst case is above 1); a focused table's are at least the first's
    divided by :math:`c^p`, where :math:`c` is the ratio of two root-mean-square weights
    (:func:`focused_frame`), at most :math:`((M + t)/t)^a` for a centre in :math:`[0, M]`. So
    :math:`((t / (M + t))^a)^p`; a smaller bound is no frame of dpsc's and is refused
    (:meth:`MarkerFrame.check`): a bound near 0 would amplify the round-off of each cell's clip.
    """
    ratio = (GENE_WEIGHT_OFFSET / (MAX_LOG_EXPRESSION + GENE_WEIGHT_OFFSET)) ** GENE_WEIGHT_POWER
    return float(ratio**power) * (1 - 1e-12)


class BoundError(ValueError):
    """A centre or bound of the marker table that breaks the bounds the proof assumes."""


@dataclass(frozen=True)
class MarkerFrame:
    r"""Where the table measures the cells from, and the bounds of its two expression parts (public).

    ``center``: the released centre :math:`m` (G values in :math:`[0, \log(1 + 10^4)]`);
    ``sum_bound`` and ``square_bound``: :math:`C_y` and :math:`C_q` (``None``: the worst cases,
    which no cell reaches).
    """

    center: np.ndarray
    sum_bound: float | None = None
    square_bound: float | None = None

    @cached_property
    def weights(self) -> np.ndarray:
        """The genes' weights :math:`g` (:func:`gene_weights` of the centre, computed once)."""
        return gene_weights(self.center)

    @property
    def worst(self) -> tuple[float, float]:
        r"""The worst norms of a cell's two expression parts (no cell reaches them).

        :math:`\max g\,B_2(G) + \lVert g m\rVert` and :math:`\max g^2 B_4(G) + \lVert g^2 m^2\rVert`.

        For :math:`x, m \ge 0`: :math:`\lVert g(x - m)\rVert \le \max g \lVert x\rVert + \lVert g m\rVert`
        and :math:`(x - m)^2 \le x^2 + m^2`.
        """
        center = np.asarray(self.center, dtype=np.float64)
        n_genes, g = len(center), self.weights
        return (
            float(g.max()) * expression_bound(n_genes) + float(np.linalg.norm(g * center)),
            float(g.max()) ** 2 * expression_bound(n_genes, 4) + float(np.linalg.norm((g * center) ** 2)),
        )

    @property
    def bounds(self) -> tuple[float, float]:
        """:math:`C_y, C_q` (the worst cases where not released)."""
        worst = self.worst
        return (
            worst[0] if self.sum_bound is None else float(self.sum_bound),
            worst[1] if self.square_bound is None else float(self.square_bound),
        )

    def check(self, n_genes: int) -> None:
        """Raise :class:`BoundError` unless the centre and bounds are within the proof's bounds."""
        center = np.asarray(self.center)
        if (
            center.shape != (n_genes,)
            or not np.issubdtype(center.dtype, np.number)
            or not np.isfinite(center).all()
            or center.min(initial=0.0) < 0.0
            or center.max(initial=0.0) > MAX_LOG_EXPRESSION
        ):
            raise BoundError(
                f"a marker centre of shape {center.shape} with values outside [0, {MAX_LOG_EXPRESSION:.4g}] "
                f"where {n_genes} finite values in that range are allowed"
            )
        parts = zip(("sum", "square"), (self.sum_bound, self.square_bound), self.worst, (1, 2), strict=True)
        for name, bound, worst, power in parts:
            if bound is None:
                continue
            floor = bound_floor(power)
            if (
                isinstance(bound, bool)
                or not isinstance(bound, float | int | np.floating | np.integer)
                or not math.isfinite(float(bound))
                or not floor <= float(bound) <= worst * (1 + 1e-12)
            ):
                raise BoundError(
                    f"a {name} bound of {bound!r} where [{floor:.6g}, {worst:.6g}] is allowed (the smallest "
                    "bound an honest run releases, and the worst case)"
                )

    def to_array(self) -> np.ndarray:
        """``[C_y, C_q, m…]`` (NaN for a bound not released): how a frame travels to sites."""
        bounds = [np.nan if b is None else float(b) for b in (self.sum_bound, self.square_bound)]
        return np.concatenate([bounds, np.asarray(self.center, dtype=np.float64)])

    @classmethod
    def from_array(cls, values: np.ndarray) -> MarkerFrame:
        """Return the frame written by :meth:`to_array`."""
        values = np.asarray(values, dtype=np.float64).ravel()
        if values.size < 3:
            raise BoundError(f"a marker frame of {values.size} values")
        bound = lambda v: None if np.isnan(v) else float(v)  # noqa: E731
        return cls(values[2:].copy(), bound(values[0]), bound(values[1]))


@dataclass(frozen=True)
class MarkerTable:
    """The layout and bounds of the per-group table (all public: groups, genes, weights, frame).

    ``frame``: the released centre and bounds (:class:`MarkerFrame`); ``None``: centre 0 and the
    worst-case bounds (exact statistics, no privacy).
    """

    n_groups: int
    n_genes: int
    frame: MarkerFrame | None = None
    #: The matrix's genes the table reads (each cell's log1p(CP10k) is computed from all of its
    #: counts, then restricted to these); ``None``: every gene, ``n_genes`` of them.
    columns: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.frame is not None:
            self.frame.check(self.n_genes)
        if self.columns is not None:
            columns = np.asarray(self.columns)
            if (
                columns.shape != (self.n_genes,)
                or not np.issubdtype(columns.dtype, np.integer)
                or len(np.unique(columns)) != self.n_genes
                or columns.min(initial=0) < 0
            ):
                raise BoundError(f"a marker table's genes {columns!r}: {self.n_genes} distinct gene indices")

    @property
    def center(self) -> np.ndarray:
        """The centre :math:`m` the cells are measured from."""
        return np.zeros(self.n_genes) if self.frame is None else np.asarray(self.frame.center, np.float64)

    @property
    def weights(self) -> np.ndarray:
        """The genes' weights :math:`g` (1 without a frame)."""
        return np.ones(self.n_genes) if self.frame is None else self.frame.weights

    @property
    def bounds(self) -> dict[str, float]:
        """:math:`C_y, C_q, C_d`: the L2 bounds of a cell's expression, squares and detection."""
        frame = self.frame if self.frame is not None else MarkerFrame(np.zeros(self.n_genes))
        sum_bound, square_bound = frame.bounds
        return {
            "sum": sum_bound,
            "squares": square_bound,
            "detected": math.sqrt(min(self.n_genes, DETECTION_GENES)),
        }

    @property
    def sensitivity(self) -> float:
        """Δ, the L2 bound of one cell's row (:data:`SENSITIVITY`)."""
        return SENSITIVITY

    @property
    def width(self) -> int:
        """Values per group: sums, squares, detections (G each) and the count."""
        return 3 * self.n_genes + 1

    def scale(self, part: str) -> float:
        """Factor from released units back to the data's units for ``part`` (``C / w``; count: ``1 / w``)."""
        if part == "count":
            return 1.0 / WEIGHTS["count"]
        return self.bounds[part] / WEIGHTS[part]


# -- 1. the centre ------------------------------------------------------------------------------------
@_blocks.sum_over_cells("weights")
def center_sum(matrix: Any, weights: np.ndarray | None = None) -> np.ndarray:
    r"""Return the exact sum over the cells of :math:`w_i (x_i / B_2(G), 1) / \sqrt 2` (norms at most 1).

    G + 1 values: the scaled sums of the log expression, then the scaled number of cells.
    ``weights``: the :math:`w_i` (the donor unit's :math:`1/m_d`; ``None``: 1 each).
    """
    scale = expression_bound(matrix.shape[1]) * math.sqrt(2.0)
    total = np.zeros(matrix.shape[1] + 1)
    start = 0
    for rows in _rows(matrix, matrix.shape[1]):
        x = _sparse_log_expression(rows) if sp.issparse(rows) else _log_expression(rows)
        w = _blocks.rows_of(weights, start, rows.shape[0])
        start += rows.shape[0]
        total[:-1] += _blocks.weighted_rows(x, w) / scale
        total[-1] += (rows.shape[0] if w is None else w.sum()) / math.sqrt(2.0)
    return total


def center_release(n_genes: int, noise_multiplier: float) -> GaussianSum:
    """Return the Gaussian release of the centre's sum and count (sensitivity 1)."""
    return GaussianSum("marker centre", n_genes + 1, 1.0, noise_multiplier)


def released_center(values: np.ndarray, release: GaussianSum) -> np.ndarray:
    r"""Return the centre :math:`m` from the released sums: the noisy mean, shrunk by its noise, clipped.

    Post-processing of the release: :math:`\tilde m = B_2 \tilde S / \tilde n`, each coordinate's
    noise sd :math:`s \approx \sqrt 2 B_2 \sigma_{\text{noise}} / \tilde n`, then
    :math:`\max(0, 1 - 2 G s^2 / \lVert\tilde m\rVert^2)\,\tilde m` in :math:`[0, \log(1 + 10^4)]`:
    a mean whose squared norm is within twice the noise's (:math:`G s^2`) is no centre (0).
    """
    values = np.asarray(values, dtype=np.float64) * math.sqrt(2.0)
    sums, count = values[:-1], max(float(values[-1]), 1.0)
    scale = expression_bound(len(sums)) / count
    mean, noise = sums * scale, release.noise_std * math.sqrt(2.0) * scale
    norm2 = float((mean**2).sum())
    shrink = 0.0 if norm2 <= 0 else max(0.0, 1.0 - 2.0 * len(mean) * noise**2 / norm2)
    return np.clip(shrink * mean, 0.0, MAX_LOG_EXPRESSION)


# -- 2. the bounds ------------------------------------------------------------------------------------
def norm_edges(worst: float) -> np.ndarray:
    """Return a histogram's :data:`NORM_BINS` + 1 public edges, geometric from 1 to ``worst``."""
    return np.geomspace(1.0, max(float(worst), 1.0 + 1e-9), NORM_BINS + 1)


@_blocks.sum_over_cells("weights")
def norm_histograms(
    matrix: Any, center: np.ndarray, columns: np.ndarray | None = None, weights: np.ndarray | None = None
) -> np.ndarray:
    r"""Return the exact histograms of :math:`\lVert y_i\rVert_2` and :math:`\lVert q_i\rVert_2`, joined.

    :math:`y_i = g \odot (x_i - m)`, :math:`q_i = y_i^2` (the weights of the centre), over the genes
    ``columns`` (``None``: every gene; ``center`` has one value per gene read).
    Bin j of each counts the cells with norm in :math:`(e_j, e_{j+1}]`
    (edges :func:`norm_edges` of the frame's worst cases); the first bin also holds the norms at
    most 1. One cell adds 1 to one bin of each (its weight :math:`w_i` with ``weights``, the donor
    unit's :math:`1/m_d`).
    """
    center = np.asarray(center, dtype=np.float64)
    counts = np.zeros(2 * NORM_BINS)
    frame = MarkerFrame(center)
    edges, gene_weights = [norm_edges(w)[1:] for w in frame.worst], frame.weights
    start = 0
    for rows in _rows(matrix, matrix.shape[1]):
        if sp.issparse(rows):
            parts = _sparse_norms(_restricted(_sparse_log_expression(rows), columns), center, gene_weights)
        else:
            y = gene_weights * (_restricted(_log_expression(rows), columns) - center)
            parts = (np.sqrt((y**2).sum(1)), np.sqrt((y**4).sum(1)))
        w = _blocks.rows_of(weights, start, rows.shape[0])
        start += rows.shape[0]
        for part, norms in enumerate(parts):
            bins = np.clip(np.searchsorted(edges[part], norms, side="left"), 0, NORM_BINS - 1)
            counts[part * NORM_BINS : (part + 1) * NORM_BINS] += np.bincount(bins, w, minlength=NORM_BINS)
    return counts


def norm_release(noise_multiplier: float) -> GaussianSum:
    r"""Return the Gaussian release of the two histograms (a cell: one bin of each, Δ = :math:`\sqrt 2`)."""
    return GaussianSum("marker norms", 2 * NORM_BINS, math.sqrt(2.0), noise_multiplier)


def released_bound(histogram: np.ndarray, worst: float, quantile: float | None = None) -> float:
    """Return the upper edge of the bin where the cumulative count reaches ``quantile`` (at most ``worst``).

    ``quantile`` defaults to :data:`NORM_QUANTILE`. Post-processing of a released histogram:
    negative noisy counts read as 0; with no count left the bound is ``worst``.
    """
    quantile = NORM_QUANTILE if quantile is None else quantile
    edges = norm_edges(worst)
    cumulative = np.cumsum(np.maximum(np.asarray(histogram, dtype=np.float64), 0.0))
    if not np.isfinite(cumulative[-1]) or cumulative[-1] <= 0:
        return float(worst)
    reached = int(np.searchsorted(cumulative, quantile * cumulative[-1], side="left"))
    return float(min(edges[min(reached, NORM_BINS - 1) + 1], worst))


def released_frame(histograms: np.ndarray, center: np.ndarray) -> MarkerFrame:
    """Return the frame of the table: the centre and the two bounds read from the released histograms."""
    values = np.asarray(histograms, dtype=np.float64)
    worst = MarkerFrame(center).worst
    return MarkerFrame(
        np.asarray(center, dtype=np.float64),
        released_bound(values[:NORM_BINS], worst[0]),
        released_bound(values[NORM_BINS:], worst[1]),
    )


def focused_frame(histograms: np.ndarray, first: MarkerFrame, columns: np.ndarray) -> MarkerFrame:
    r"""Return the focused table's frame: the first centre at U, bounds read from U's histograms.

    Each bound is at most the first table's, in U's units (post-processing of both releases): with
    the first weights :math:`g` and U's own :math:`g_U` (:func:`gene_weights` of the centre at U;
    :math:`g_j = c\,g_{U,j}` on U for one constant c), every cell has
    :math:`c\lVert g_U (x - m)_U\rVert \le \lVert g (x - m)\rVert`, so the cells' norms over U, and
    their quantile, are at most :math:`C_y / c` (and :math:`C_q / c^2` for the squares). The
    histograms of few cells or of a small ε can read a bound above that from their noise alone.
    """
    columns = np.asarray(columns)
    center = np.asarray(first.center, dtype=np.float64)[columns]
    read = released_frame(histograms, center)
    ratio = float(first.weights[columns][0] / read.weights[0])
    sum_bound, square_bound = first.bounds
    return MarkerFrame(
        center, min(read.sum_bound, sum_bound / ratio), min(read.square_bound, square_bound / ratio**2)
    )


def release_frame(
    n_genes: int,
    center_sigma: float,
    release_center: Callable[[], np.ndarray],
    release_norms: Callable[[MarkerFrame], np.ndarray] | None,
) -> MarkerFrame:
    """Release the centre, then the histograms of the norms from it; return the table's frame.

    ``release_center()`` returns the released centre sums (:func:`center_sum` plus its noise),
    ``release_norms(frame)`` the released histograms (:func:`norm_histograms` from the frame's
    centre, plus their noise). Without ε (``release_norms`` is ``None``) no histogram is released:
    the centre is the exact mean and the bounds are the worst cases, stated in the frame, which no
    cell reaches, so the table's statistics are exact. Post-processing between the releases only.
    """
    center = released_center(release_center(), center_release(n_genes, center_sigma))
    return frame_from_center(center, release_norms)


def frame_from_center(
    center: np.ndarray, release_norms: Callable[[MarkerFrame], np.ndarray] | None
) -> MarkerFrame:
    r"""Return the table's frame from a public centre: the bounds released from it, or the worst cases.

    ``center``: a released centre, or a public reference's (:mod:`.public_markers`: any public
    :math:`m \ge 0` in bounds keeps every Δ). Without ε (``release_norms`` is ``None``) the frame
    states the worst-case bounds.
    """
    if release_norms is None:
        return MarkerFrame(center, *MarkerFrame(center).worst)
    return released_frame(release_norms(MarkerFrame(center)), center)


# -- 3. the table -------------------------------------------------------------------------------------
def marker_release(table: MarkerTable, noise_multiplier: float) -> GaussianSum:
    """Return the Gaussian release of the whole groups × (3G + 1) table."""
    return GaussianSum("marker statistics", table.n_groups * table.width, table.sensitivity, noise_multiplier)


def _rows(matrix: Any, width: int):
    """Row blocks of the matrix, at most :data:`DENSE_VALUES` values densified at once."""
    chunk = max(256, int(DENSE_VALUES // max(width, 1)))
    for block in _blocks.row_blocks(matrix):
        yield from _blocks.row_blocks(block, chunk)


def _log_expression(block: Any) -> np.ndarray:
    """log1p(CP10k) of a row block, dense float64; a negative or non-finite count reads as 0."""
    X = block.toarray() if sp.issparse(block) else np.array(block, dtype=np.float64)
    X = np.where(np.isfinite(X) & (X > 0), X, 0.0).astype(np.float64)
    totals = X.sum(1)
    totals = np.where(totals > 0, totals, 1.0)
    return np.log1p(X * (1e4 / totals)[:, None])


def _sparse_log_expression(block: Any) -> sp.csr_matrix:
    """log1p(CP10k) of a sparse row block, kept sparse (the same values as :func:`_log_expression`)."""
    X = sp.csr_matrix(block, dtype=np.float64, copy=True)
    X.data[~(np.isfinite(X.data) & (X.data > 0))] = 0.0
    X.eliminate_zeros()
    totals = np.asarray(X.sum(1)).ravel()
    totals[totals <= 0] = 1.0
    X.data = np.log1p(X.data * np.repeat(1e4 / totals, np.diff(X.indptr)))
    return X


def _restricted(x: Any, columns: np.ndarray | None) -> Any:
    """Restrict the log expression of whole cells to ``columns`` (``None``: every gene)."""
    return x if columns is None else x[:, columns]


#: Relative slack added to the zeros' share of a sparse row's norm (:func:`_sparse_norms`): far above
#: the round-off of a sum of at most 10⁷ non-negative float64 terms, so the norm is an upper bound.
NORM_SLACK = 1e-9


def _sparse_norms(x: sp.csr_matrix, center: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Return upper bounds of :math:`\lVert g(x_i - m)\rVert_2` and :math:`\lVert g^2 (x_i - m)^2\rVert_2`.

    With :math:`h = g^2` and :math:`N_i` the genes where :math:`x_i \ne 0`:
    :math:`\lVert g(x - m)\rVert^2 = \sum_{j \in N} h_j (x_j - m_j)^2 + \sum_{j \notin N} h_j m_j^2`
    (likewise with :math:`h^2` and fourth powers). The first sum is computed term by term, never
    by expanding the square (which cancels to 0 when a centre sits on a cell); the second is
    :math:`T - \sum_{j \in N} h_j m_j^2` with :math:`T = \sum_j h_j m_j^2`, a difference of two sums
    of non-negative terms, to which :data:`NORM_SLACK` :math:`\cdot T` is added so that round-off
    cannot make it smaller than it is. The rows are never densified. Clipping with an upper bound
    of the norm keeps every cell within its bound (the sensitivity), whatever the centre.
    """
    h = np.asarray(weights, dtype=np.float64) ** 2
    center = np.asarray(center, dtype=np.float64)
    at, weight = center[x.indices], h[x.indices]
    diff2 = (x.data - at) ** 2

    def per_row(values: np.ndarray) -> np.ndarray:  # each row's sum of values on its non-zeros
        return np.asarray(sp.csr_matrix((values, x.indices, x.indptr), shape=x.shape).sum(1)).ravel()

    norms = []
    for power in (1, 2):
        total = float((h**power * center ** (2 * power)).sum())
        direct = per_row(weight**power * diff2**power)
        on_nonzeros = per_row(weight**power * at ** (2 * power))
        zeros = np.maximum(total - on_nonzeros, 0.0) + NORM_SLACK * total
        norms.append(np.sqrt(direct + zeros))
    return norms[0], norms[1]


def _sparse_group_table(
    x: sp.csr_matrix, codes: np.ndarray, table: MarkerTable, cell_weights: np.ndarray
) -> np.ndarray:
    r"""Return the table of :func:`cell_rows` summed per group (each row times its cell's weight), sparse.

    Each part of a cell's row is the cell's vector times its clip factor, so a group's sums are
    :math:`g \odot \sum_i a_i (x_i - m) = g \odot (\sum_i a_i x_i - (\sum_i a_i) m)` and
    :math:`g^2 \odot \sum_i b_i (x_i - m)^2 = g^2 \odot (\sum_i b_i x_i^2 - 2 m \sum_i b_i x_i +
    (\sum_i b_i) m^2)` (the same values as the dense rows).
    """
    bounds, m, g = table.bounds, table.center, table.weights
    norm_y, norm_y2 = _sparse_norms(x, m, g)
    detected = np.sqrt(np.diff(x.indptr).astype(np.float64))

    def factor(norms: np.ndarray, part: str) -> np.ndarray:  # each cell's clip factor × weight / bound
        return WEIGHTS[part] * np.minimum(1.0, bounds[part] / np.maximum(norms, 1e-12)) / bounds[part]

    member = np.flatnonzero(codes >= 0)
    rows = np.arange(len(codes))[member]
    shape = (table.n_groups, len(codes))
    weighted = lambda w: sp.csr_matrix(((w * cell_weights)[member], (codes[member], rows)), shape=shape)  # noqa: E731
    sums_by, squares_by = weighted(factor(norm_y, "sum")), weighted(factor(norm_y2, "squares"))
    detect_by = weighted(factor(detected, "detected"))
    a, b = np.asarray(sums_by.sum(1)), np.asarray(squares_by.sum(1))
    bx = np.asarray((squares_by @ x).todense())
    G = table.n_genes
    out = np.zeros((table.n_groups, table.width))
    out[:, :G] = g * (np.asarray((sums_by @ x).todense()) - a * m)
    out[:, G : 2 * G] = g**2 * (np.asarray((squares_by @ x.multiply(x)).todense()) - 2.0 * m * bx + b * m**2)
    binary = x.copy()
    binary.data[:] = 1.0
    out[:, 2 * G : 3 * G] = np.asarray((detect_by @ binary).todense())
    out[:, -1] = WEIGHTS["count"] * np.bincount(codes[member], cell_weights[member], minlength=table.n_groups)
    return out


def _clip(rows: np.ndarray, bound: float) -> np.ndarray:
    """Scale each row to L2 norm at most ``bound`` (a per-cell map)."""
    norms = np.sqrt((rows**2).sum(1, keepdims=True))
    return rows * np.minimum(1.0, bound / np.maximum(norms, 1e-12))


def cell_rows(x: np.ndarray, table: MarkerTable) -> np.ndarray:
    """Each cell's scaled (expression, squares, detection, count) row, from the table's centre, gene-weighted.

    Every part is clipped to its bound (module docstring, release 3).
    """
    bounds = table.bounds
    y = table.weights * (x - table.center)
    return np.hstack(
        [
            _clip(y, bounds["sum"]) * (WEIGHTS["sum"] / bounds["sum"]),
            _clip(y**2, bounds["squares"]) * (WEIGHTS["squares"] / bounds["squares"]),
            _clip((x > 0).astype(np.float64), bounds["detected"])
            * (WEIGHTS["detected"] / bounds["detected"]),
            np.full((len(x), 1), WEIGHTS["count"]),
        ]
    )


@_blocks.sum_over_cells("groups", "weights")
def group_table(
    matrix: Any, groups: np.ndarray, table: MarkerTable, weights: np.ndarray | None = None
) -> np.ndarray:
    r"""Return the exact table :math:`\sum_i w_i e_{g(i)} \otimes \text{row}_i`, flattened (group-major).

    ``groups``: each cell's group code in ``[0, n_groups)``, or −1 for a cell in no group (it adds
    nothing). Over the table's genes (``table.columns``). Read in row blocks, at most
    :data:`DENSE_VALUES` values densified at once. ``weights``: the :math:`w_i` (the donor unit's
    :math:`1/m_d`; ``None``: 1 each).
    """
    groups = np.asarray(groups, dtype=np.int64)
    total = np.zeros((table.n_groups, table.width))
    start = 0
    columns = table.columns
    for rows in _rows(matrix, max(table.width, matrix.shape[1])):  # about 64 MB densified at once
        codes = groups[start : start + rows.shape[0]]
        w = _blocks.rows_of(weights, start, rows.shape[0])
        w = np.ones(rows.shape[0]) if w is None else w
        start += rows.shape[0]
        member = np.flatnonzero(codes >= 0)
        if member.size and sp.issparse(rows):
            x = _restricted(_sparse_log_expression(rows), columns)
            total += _sparse_group_table(x, codes, table, w)
        elif member.size:
            contribution = cell_rows(_restricted(_log_expression(rows[member]), columns), table)
            onehot = sp.csr_matrix(
                (w[member], (codes[member], np.arange(member.size))),
                shape=(table.n_groups, member.size),
            )
            total += onehot @ contribution
    return total.reshape(-1)


@dataclass
class GroupStatistics:
    """Noisy per-group statistics in the data's units (post-processing of the release)."""

    counts: np.ndarray  # (groups,) noisy cell counts
    sums: np.ndarray  # (groups, genes) noisy sums of log expression
    squares: np.ndarray  # (groups, genes) noisy sums of squares
    detected: np.ndarray  # (groups, genes) noisy numbers of cells expressing
    sum_noise_sd: np.ndarray  # (genes,) noise sd of each gene's entry of ``sums``
    squares_noise_sd: np.ndarray | None = None  # (genes,) the same for ``squares``; None: exact
    center: np.ndarray | None = None  # (genes,) the centre the released sums were measured from
    #: (groups, groups) covariance across groups of the noise of one gene's sums, in units of that
    #: gene's ``sum_noise_sd`` squared (:func:`projected_sums`); None: independent (the identity)
    sum_noise_covariance: np.ndarray | None = None


def projected_sums(sums: np.ndarray, noise_std: float) -> tuple[np.ndarray, np.ndarray]:
    r"""Keep what of the released sums stands above the noise: their strong directions and entries.

    ``sums``: the released K × G block :math:`Y = S + E` of expression sums, in the table's units,
    every entry with independent Gaussian noise of sd :math:`s` (``noise_std``). Post-processing
    of the release, in two steps:

    1. **Directions.** A K × G table of such noise alone has singular values below
       :math:`s(\sqrt G + \sqrt K)`, the edge of its spectrum (Davidson & Szarek 2001, Thm II.13;
       thresholding there: Gavish & Donoho 2014). A direction of :math:`Y` whose singular value is
       below :data:`NOISE_EDGE` times the edge cannot be told from noise and carries mostly noise
       into every group's statistics. With :math:`U_r` the left singular vectors above it,
       :math:`P = U_r U_r^\top` and the sums become :math:`PY`; the directions kept are kept whole
       (not shrunk), so a group's genes keep their ratios within each.
    2. **Entries.** A group set apart by a few strong genes has too little energy for a direction of
       its own; its genes stand out in the residual :math:`R = (I - P)Y` instead, whose noise in row
       k has sd :math:`s_k = s\sqrt{1 - P_{kk}}`. Entries of R beyond the universal threshold
       :math:`s_k\sqrt{2\ln G}` (Donoho & Johnstone 1994: G noise entries exceed it with
       probability of order :math:`1/\sqrt{\ln G}`) are added back.

    Returns the sums and :math:`P`, the covariance across groups of the noise left in each gene's
    projected sums in units of :math:`s^2` (:math:`P E`; an entry added back carries the rest of
    its noise, which this leaves out). Without noise (:math:`s = 0`) the sums are returned as
    they are, with the identity.
    """
    sums = np.asarray(sums, dtype=np.float64)
    n_groups, n_genes = sums.shape
    if noise_std <= 0 or n_groups < 2:
        return sums, np.eye(n_groups)
    left, values, _ = np.linalg.svd(sums, full_matrices=False)
    kept = left[:, values > NOISE_EDGE * noise_std * (math.sqrt(n_genes) + math.sqrt(n_groups))]
    projector = kept @ kept.T
    projected = projector @ sums
    residual = sums - projected
    residual_sd = noise_std * np.sqrt(np.clip(1.0 - np.diag(projector), 0.0, None))
    threshold = residual_sd[:, None] * math.sqrt(2.0 * math.log(n_genes))
    return projected + np.where(np.abs(residual) > threshold, residual, 0.0), projector


def group_statistics(
    released: np.ndarray, table: MarkerTable, release: GaussianSum, *, project: bool = True
) -> GroupStatistics:
    r"""Split a released (or exact) table into its parts, back in the data's units.

    The expression sums are first projected on their directions above the noise
    (:func:`projected_sums`; ``project=False`` leaves them as released). The gene weights are then
    divided out, and the sums of :math:`y = x - m` are shifted back with the
    noisy counts: :math:`\sum x = \sum y + \tilde n m` and :math:`\sum x^2 = \sum y^2 + 2 m \sum y +
    \tilde n m^2` (post-processing).
    """
    G, g = table.n_genes, table.weights
    values = np.asarray(released, dtype=np.float64).reshape(table.n_groups, table.width)
    expression, covariance = values[:, :G], None
    if project:
        expression, covariance = projected_sums(expression, release.noise_std)
    counts = values[:, -1] * table.scale("count")
    sums = expression * table.scale("sum") / g
    squares = values[:, G : 2 * G] * table.scale("squares") / g**2
    m, n = table.center[None, :], np.maximum(counts, 1.0)[:, None]
    return GroupStatistics(
        counts=counts,
        sums=sums + n * m,
        squares=squares + 2.0 * m * sums + n * m**2,
        detected=values[:, 2 * G : 3 * G] * table.scale("detected"),
        sum_noise_sd=release.noise_std * table.scale("sum") / g,
        squares_noise_sd=release.noise_std * table.scale("squares") / g**2,
        center=table.center,
        sum_noise_covariance=covariance,
    )


@dataclass
class MarkerResult:
    """Per group: genes ranked by score, and each gene's statistics (groups × genes arrays)."""

    order: np.ndarray  # (groups, genes) gene indices, best first
    scores: np.ndarray
    pvals: np.ndarray
    pvals_adj: np.ndarray
    logfoldchanges: np.ndarray
    pts: np.ndarray  # fraction of the group's cells expressing
    pts_rest: np.ndarray
    counts: np.ndarray  # the noisy group sizes used (at least 1)


def shrunk_variances(variance: np.ndarray, mean: np.ndarray, noise_variance: np.ndarray) -> np.ndarray:
    r"""Shrink each noisy variance toward its group's mean–variance trend by its noise (post-processing).

    Per row (a group), the genes are cut into :data:`TREND_BINS` bins of equal size by their noisy
    mean; in bin b the trend is :math:`f_b = \max(0, \bar v_b)`, the mean of the bin's noisy
    variances, and the spread of the true variances around it
    :math:`\tau_b^2 = \max(\epsilon, \widehat{\mathrm{Var}}_b(v) - \overline{s^2}_b)` (the noisy
    variances' spread less the noise's). Gene j's variance is then the
    posterior mean of a normal prior :math:`N(f_b, \tau_b^2)` under Gaussian noise of variance
    :math:`s_j^2`: :math:`(\tau_b^2 v_j + s_j^2 f_b) / (\tau_b^2 + s_j^2)`, clipped to at least 0 (the
    James–Stein / empirical Bayes estimate). The noise of a group's variance is mostly the noise of its
    sum of squares over its size, which a small group divides by little: its t-scores then rank genes
    by noise in the denominator as much as by their difference. With no noise (:math:`s = 0`) every
    variance is unchanged.
    """
    shrunk = np.array(variance, dtype=np.float64, copy=True)
    n_bins = min(TREND_BINS, variance.shape[1])
    for row in range(variance.shape[0]):
        v, s2 = variance[row], noise_variance[row]
        for genes in np.array_split(np.argsort(mean[row], kind="stable"), n_bins):
            trend = max(float(v[genes].mean()), 0.0)
            spread = max(float(v[genes].var()) - float(s2[genes].mean()), 1e-12)
            shrunk[row, genes] = v[genes] + s2[genes] / (spread + s2[genes]) * (trend - v[genes])
    return np.maximum(shrunk, 0.0)


def variance_noise(
    n: np.ndarray | float,
    mean: np.ndarray | float,
    center: np.ndarray | float,
    noise_sd: np.ndarray | float,
    squares_noise_sd: np.ndarray | float,
) -> np.ndarray:
    r"""Return the noise variance of a group's variance :math:`(S_2/n - \mu^2)\,n/(n-1)` (first order).

    The variance equals :math:`(Y_2/n - (Y_1/n)^2)\,n/(n-1)` in the released sums :math:`Y_1, Y_2` of
    :math:`x - m` and its square (:func:`group_statistics`), so for noise sds :math:`s_1, s_2` of
    the two sums its noise variance is :math:`((s_2/n)^2 + (2(\mu - m)\,s_1/n)^2)\,(n/(n-1))^2`: a
    gene near the centre carries only the noise of its squares.
    """
    unbiased = n / np.maximum(n - 1.0, 1.0)
    return ((squares_noise_sd / n) ** 2 + (2.0 * (mean - center) * noise_sd / n) ** 2) * unbiased**2


def _moments(sums, squares, counts, noise_sd, squares_noise_sd=None, center=0.0):
    """Means, variances (shrunk by their noise: :func:`shrunk_variances`), sizes and the means' noise."""
    n = np.maximum(counts, 1.0)[:, None]
    raw_mean = sums / n
    mean = np.maximum(raw_mean, 0.0)
    variance = (squares / n - raw_mean**2) * n / np.maximum(n - 1.0, 1.0)
    if squares_noise_sd is not None:
        noise = variance_noise(n, raw_mean, center, noise_sd, squares_noise_sd)
        variance = shrunk_variances(variance, mean, noise)
    return mean, np.maximum(variance, 0.0), n, (noise_sd / n) ** 2


def _noise_shares(covariance: np.ndarray | None, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    r"""Per group, the noise variance of its own sums and of the rest's, in units of one entry's.

    With covariance :math:`P` across groups (:func:`projected_sums`; the identity when the sums are
    as released): group k's own share is :math:`P_{kk}` and the rest's, the sum over the other
    groups, :math:`a^\top P a` with :math:`a = 1 - e_k`, i.e. :math:`1^\top P 1 - 2 (P1)_k + P_{kk}`
    (K − 1 for the identity).
    """
    P = np.eye(n_groups) if covariance is None else np.asarray(covariance, dtype=np.float64)
    own = np.clip(np.diag(P), 0.0, None)
    others = np.maximum(P.sum() - 2.0 * P.sum(1) + np.diag(P), 0.0)
    return own, others


def rank_markers(stats: GroupStatistics) -> MarkerResult:
    """Scanpy's t-test of each group against the rest, on the noisy statistics (module docstring)."""
    from scipy import stats as st

    counts = np.maximum(stats.counts, 1.0)
    rest = lambda per_group: per_group.sum(0, keepdims=True) - per_group  # noqa: E731
    sd_sums, sd_squares = stats.sum_noise_sd, stats.squares_noise_sd
    center = 0.0 if stats.center is None else stats.center
    rest_counts = np.maximum(rest(counts[:, None])[:, 0], 1.0)
    own, others = _noise_shares(stats.sum_noise_covariance, len(counts))
    sd_g = sd_sums * np.sqrt(own)[:, None]
    mean_g, var_g, n_g, noise_g = _moments(stats.sums, stats.squares, counts, sd_g, sd_squares, center)
    mean_r, var_r, n_r, noise_r = _moments(
        rest(stats.sums),
        rest(stats.squares),
        rest_counts,
        sd_sums * np.sqrt(others)[:, None],
        None if sd_squares is None else sd_squares * math.sqrt(len(counts) - 1),
        center,
    )
    se2_g, se2_r = var_g / n_g + noise_g, var_r / n_r + noise_r
    denominator = np.sqrt(se2_g + se2_r)
    scores = np.divide(mean_g - mean_r, denominator, out=np.zeros_like(mean_g), where=denominator > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        dof = (se2_g + se2_r) ** 2 / (se2_g**2 / np.maximum(n_g - 1, 1) + se2_r**2 / np.maximum(n_r - 1, 1))
    dof = np.nan_to_num(dof, nan=1.0, posinf=1e6)
    pvals = 2.0 * st.t.sf(np.abs(scores), np.maximum(dof, 1.0))
    pvals_adj = np.vstack([_benjamini_hochberg(p) for p in pvals])
    # a mean of log expressions lies in [0, log(1 + 10^4)]; noise beyond it would overflow expm1
    top = lambda mean: np.minimum(mean, MAX_LOG_EXPRESSION)  # noqa: E731
    logfold = np.log2((np.expm1(top(mean_g)) + 1e-9) / (np.expm1(top(mean_r)) + 1e-9))
    pts = np.clip(stats.detected / n_g, 0.0, 1.0)
    pts_rest = np.clip(rest(stats.detected) / n_r, 0.0, 1.0)
    order = np.argsort(-scores, axis=1, kind="stable")
    return MarkerResult(order, scores, pvals, pvals_adj, logfold, pts, pts_rest, counts)


def focus_genes(first: MarkerResult, per_group: int | None = None) -> np.ndarray:
    """Return U, the union of each group's ``per_group`` best genes in a ranked release, sorted.

    ``per_group`` defaults to :data:`FOCUS_GENES`. Post-processing of the first table: the genes
    the focused release reads are public once that table is.
    """
    per_group = FOCUS_GENES if per_group is None else int(per_group)
    return np.unique(first.order[:, :per_group])


def focused_result(first: MarkerResult, focused: MarkerResult, genes: np.ndarray) -> MarkerResult:
    r"""Join the ranking of every gene (``first``) with the focused one of the genes U (``genes``).

    The statistics of a gene in U come from the focused table (less noise), the others' from the
    first table. Each group's ranking lists U by its focused scores, then the other genes by their
    first scores: a gene outside U did not reach the group's :data:`FOCUS_GENES` best in the first
    table. The adjusted p-values are recomputed over the joined p-values (Benjamini–Hochberg), and
    the group sizes are the first table's. Post-processing of the two releases.
    """
    genes = np.asarray(genes)
    joined = {}
    for name in ("scores", "pvals", "logfoldchanges", "pts", "pts_rest"):
        values = np.array(getattr(first, name), dtype=np.float64, copy=True)
        values[:, genes] = getattr(focused, name)
        joined[name] = values
    outside = np.ones(first.order.shape[1], dtype=bool)
    outside[genes] = False
    order = np.vstack(
        [np.concatenate([genes[focused.order[k]], row[outside[row]]]) for k, row in enumerate(first.order)]
    )
    pvals_adj = np.vstack([_benjamini_hochberg(p) for p in joined["pvals"]])
    return MarkerResult(order=order, pvals_adj=pvals_adj, counts=first.counts, **joined)


def _benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """Benjamini–Hochberg adjusted p-values (as scanpy's ``corr_method="benjamini-hochberg"``)."""
    m = len(p)
    order = np.argsort(p)
    ranked = p[order] * m / np.arange(1, m + 1)
    adjusted = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty(m)
    out[order] = np.minimum(adjusted, 1.0)
    return out
