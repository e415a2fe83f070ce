r"""Private marker genes: one Gaussian release of per-group sums, then scanpy's t-test on them.

**Per-cell contribution.** Cell :math:`i` of group :math:`g(i)` is represented by its log
expression :math:`x_i = \log(1 + 10^4 c_i / \sum_j c_{ij})` over the G genes (scanpy's
``normalize_total`` + ``log1p``; a negative or non-finite count reads as 0, a cell without counts
is 0), its squares :math:`x_i^2` and its detection :math:`d_i = [x_i > 0]`. Each part is clipped
to an L2 bound that reads only the number of genes G (a per-cell map, so the bound holds for
every cell whatever its counts):

* :math:`C_s = B_4(G)` with
  :math:`B_p(G) = \max_{1\le k\le G} \sqrt k\,\log(1 + 10^4/k)^{p/2}`
  (:func:`expression_bound`): the norms of a cell whose counts are spread evenly over k genes,
  the largest over k (about 80 and 219). A cell's log expression is largest when its counts are
  even, so the clip never binds;
* :math:`C_x`, the expression's bound, is *released* (:func:`released_sum_bound`): a first release
  of the histogram of the cells' norms :math:`\lVert x_i\rVert_2` on :data:`NORM_BINS` bins spaced
  geometrically up to :math:`B_2(G)` (public edges, :func:`norm_edges`; each cell adds 1 to one bin:
  sensitivity 1, :func:`norm_histogram`), and :math:`C_x` the upper edge of the bin where the noisy
  cumulative count first reaches :data:`NORM_QUANTILE` of the noisy total (post-processing; at
  most :math:`B_2(G)`). The noise of every mean is proportional to :math:`C_x`, and most cells'
  norms lie well below the worst case :math:`B_2(G)`, so the small share :data:`NORM_SHARE` of the
  budget this release costs buys a smaller bound for the sums that carry the marker signal; the
  few cells above it are scaled down to it (their group's mean is then slightly low);
* :math:`C_d = \sqrt{\min(G, 2000)}` (:data:`DETECTION_GENES`) for the detection vector, of norm
  :math:`\sqrt{\#\text{detected}}` (a cell detecting more genes has it scaled down, so its group's
  fraction expressing is slightly low).

The contribution is the row :math:`e_{g(i)} \otimes (w_x x_i / C_x,\ w_s x_i^2 / C_s,\ w_d d_i /
C_d,\ w_n)` of a groups × (3G + 1) table (weights :data:`WEIGHTS`). A cell adds to its own group's
row only, so adding or removing one cell changes the table by at most
:math:`\Delta = \sqrt{w_x^2 + w_s^2 + w_d^2 + w_n^2}` in L2, whatever the groups are (a cell's
group is part of the cell; a cell in no group adds nothing).

**Sum and noise.** :func:`group_table` sums the rows; :func:`marker_release` is the
:class:`~dpsc.privacy.GaussianSum` of the table (one release, history :math:`(\sigma, 1, 1)`),
after the histogram's release (:func:`norm_release`, :math:`(\sigma_h, 1, 1)`): two releases,
composed by the accountant. Over sites the histogram and the table are sums of the sites' ones.

**Post-processing** (:func:`rank_markers`): noisy counts :math:`\tilde n_g` clipped to at least 1,
means :math:`\mu = S/\tilde n`, second moments, variances clipped to at least 0, the rest of the
cells as the sum of the other groups; the t-test score of scanpy,
:math:`(\mu_g - \mu_r)/\sqrt{v_g/n_g + v_r/n_r}`, with the known variance of the noise of the two
means added under the root (a gene whose difference is within the noise does not rank high);
Welch's degrees of freedom, p-values and Benjamini–Hochberg; scanpy's log fold change; the
fraction of cells expressing each gene. A group whose noisy count is near zero gets means of the
noise's size and scores near 0: its markers are noise, and ``rank_genes_groups`` says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import _blocks
from ._release import GaussianSum

DENSE_VALUES = 8_000_000  # values of the per-cell rows densified at once
DETECTION_GENES = 2000  # detection vectors are clipped to sqrt(min(G, this)) in L2
#: Weights of the four parts of a cell's row: the expression sums carry the marker signal, so they
#: get the largest share of the sensitivity (the noise on the other parts is then twice theirs).
WEIGHTS = {"sum": 1.0, "squares": 0.5, "detected": 0.5, "count": 0.5}
#: Δ, the L2 bound of one cell's row of the table: the norm of the weights (module docstring).
SENSITIVITY = math.sqrt(sum(w**2 for w in WEIGHTS.values()))
#: Bins of the histogram of the cells' norms that releases :math:`C_x` (module docstring).
NORM_BINS = 64
#: :math:`C_x` is the released norm below which this share of the cells lie: a bound most cells
#: keep (their sums are exact), set by the mechanism rather than by a data set.
NORM_QUANTILE = 0.9
#: Share of the markers' ε spent on the histogram of the norms (the table gets the rest).
NORM_SHARE = 0.1


def expression_bound(n_genes: int, power: int = 2) -> float:
    r"""Return :math:`B_p(G) = \max_{1 \le k \le G} \sqrt k \log(1 + 10^4/k)^{p/2}` (module docstring)."""
    k = np.arange(1, int(n_genes) + 1, dtype=np.float64)
    return float(np.max(np.sqrt(k) * np.log1p(1e4 / k) ** (power / 2)))


@dataclass(frozen=True)
class MarkerTable:
    """The layout and bounds of the per-group table (all public: groups, genes, weights, bound).

    ``sum_bound``: :math:`C_x`, the released bound of the expression part
    (:func:`released_sum_bound`); ``None``: the worst case :math:`B_2(G)`.
    """

    n_groups: int
    n_genes: int
    sum_bound: float | None = None

    def __post_init__(self) -> None:
        if self.sum_bound is not None:
            check_sum_bound(self.sum_bound, self.n_genes)

    @property
    def bounds(self) -> dict[str, float]:
        """:math:`C_x, C_s, C_d`: the L2 bounds of a cell's expression, squares and detection."""
        c_d = math.sqrt(min(self.n_genes, DETECTION_GENES))
        return {
            "sum": expression_bound(self.n_genes) if self.sum_bound is None else float(self.sum_bound),
            "squares": expression_bound(self.n_genes, 4),
            "detected": c_d,
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


class BoundError(ValueError):
    """A bound of the expression part that is not a finite number in :math:`(0, B_2(G)]`."""


def check_sum_bound(bound: object, n_genes: int) -> None:
    """Raise :class:`BoundError` unless ``bound`` is a finite number in :math:`(0, B_2(G)]` (public input)."""
    worst = expression_bound(n_genes)
    if (
        isinstance(bound, bool)
        or not isinstance(bound, float | int | np.floating | np.integer)
        or not math.isfinite(float(bound))
        or not 0.0 < float(bound) <= worst * (1 + 1e-12)
    ):
        raise BoundError(f"an expression bound of {bound!r} where (0, {worst:.6g}] is allowed")


def norm_edges(n_genes: int) -> np.ndarray:
    r"""Return the histogram's :data:`NORM_BINS` + 1 public edges, geometric from 1 to :math:`B_2(G)`."""
    return np.geomspace(1.0, expression_bound(n_genes), NORM_BINS + 1)


def norm_histogram(matrix: Any) -> np.ndarray:
    r"""Return the exact histogram of :math:`\lVert x_i\rVert_2` over the cells (bins of :func:`norm_edges`).

    Bin j counts the cells with norm in :math:`(e_j, e_{j+1}]`; the first bin also holds the norms
    at most :math:`e_0 = 1` (empty or nearly empty cells). One cell adds 1 to one bin.
    """
    edges = norm_edges(matrix.shape[1])
    counts = np.zeros(NORM_BINS)
    chunk = max(256, int(DENSE_VALUES // max(matrix.shape[1], 1)))
    for block in _blocks.row_blocks(matrix):
        for rows in _blocks.row_blocks(block, chunk):
            norms = np.sqrt((_log_expression(rows) ** 2).sum(1))
            bins = np.clip(np.searchsorted(edges[1:], norms, side="left"), 0, NORM_BINS - 1)
            counts += np.bincount(bins, minlength=NORM_BINS)
    return counts


def norm_release(noise_multiplier: float) -> GaussianSum:
    """Return the Gaussian release of the histogram of the norms (sensitivity 1)."""
    return GaussianSum("marker norms", NORM_BINS, 1.0, noise_multiplier)


def released_sum_bound(histogram: np.ndarray, n_genes: int, quantile: float | None = None) -> float:
    r"""Return :math:`C_x`: the upper edge of the bin where the cumulative count reaches ``quantile``.

    ``quantile`` defaults to :data:`NORM_QUANTILE`. Post-processing of the released histogram:
    negative noisy counts read as 0; with no count left the bound is the worst case :math:`B_2(G)`.
    """
    quantile = NORM_QUANTILE if quantile is None else quantile
    edges = norm_edges(n_genes)
    cumulative = np.cumsum(np.maximum(np.asarray(histogram, dtype=np.float64), 0.0))
    if not np.isfinite(cumulative[-1]) or cumulative[-1] <= 0:
        return float(edges[-1])
    reached = int(np.searchsorted(cumulative, quantile * cumulative[-1], side="left"))
    return float(min(edges[min(reached, NORM_BINS - 1) + 1], edges[-1]))


def marker_release(table: MarkerTable, noise_multiplier: float) -> GaussianSum:
    """Return the Gaussian release of the whole groups × (3G + 1) table."""
    return GaussianSum("marker statistics", table.n_groups * table.width, table.sensitivity, noise_multiplier)


def _log_expression(block: Any) -> np.ndarray:
    """log1p(CP10k) of a row block, dense float64; a negative or non-finite count reads as 0."""
    X = block.toarray() if sp.issparse(block) else np.array(block, dtype=np.float64)
    X = np.where(np.isfinite(X) & (X > 0), X, 0.0).astype(np.float64)
    totals = X.sum(1)
    totals = np.where(totals > 0, totals, 1.0)
    return np.log1p(X * (1e4 / totals)[:, None])


def _clip(rows: np.ndarray, bound: float) -> np.ndarray:
    """Scale each row to L2 norm at most ``bound`` (a per-cell map)."""
    norms = np.sqrt((rows**2).sum(1, keepdims=True))
    return rows * np.minimum(1.0, bound / np.maximum(norms, 1e-12))


def cell_rows(x: np.ndarray, table: MarkerTable) -> np.ndarray:
    """Each cell's scaled (expression, squares, detection, count) row, every part clipped to its bound."""
    bounds = table.bounds
    return np.hstack(
        [
            _clip(x, bounds["sum"]) * (WEIGHTS["sum"] / bounds["sum"]),
            _clip(x**2, bounds["squares"]) * (WEIGHTS["squares"] / bounds["squares"]),
            _clip((x > 0).astype(np.float64), bounds["detected"])
            * (WEIGHTS["detected"] / bounds["detected"]),
            np.full((len(x), 1), WEIGHTS["count"]),
        ]
    )


def group_table(matrix: Any, groups: np.ndarray, table: MarkerTable) -> np.ndarray:
    r"""Return the exact table :math:`\sum_i e_{g(i)} \otimes \text{row}_i`, flattened (group-major).

    ``groups``: each cell's group code in ``[0, n_groups)``, or −1 for a cell in no group (it adds
    nothing). Read in row blocks, at most :data:`DENSE_VALUES` values densified at once.
    """
    groups = np.asarray(groups, dtype=np.int64)
    total = np.zeros((table.n_groups, table.width))
    chunk = max(256, int(DENSE_VALUES // table.width))  # rows densified at once (about 64 MB)
    start = 0
    for block in _blocks.row_blocks(matrix):
        for rows in _blocks.row_blocks(block, chunk):
            codes = groups[start : start + rows.shape[0]]
            start += rows.shape[0]
            member = np.flatnonzero(codes >= 0)
            if member.size:
                contribution = cell_rows(_log_expression(rows[member]), table)
                onehot = sp.csr_matrix(
                    (np.ones(member.size), (codes[member], np.arange(member.size))),
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
    sum_noise_sd: float  # noise sd of one entry of ``sums``


def group_statistics(released: np.ndarray, table: MarkerTable, release: GaussianSum) -> GroupStatistics:
    """Split a released (or exact) table into its parts, back in the data's units."""
    G = table.n_genes
    values = np.asarray(released, dtype=np.float64).reshape(table.n_groups, table.width)
    return GroupStatistics(
        counts=values[:, -1] * table.scale("count"),
        sums=values[:, :G] * table.scale("sum"),
        squares=values[:, G : 2 * G] * table.scale("squares"),
        detected=values[:, 2 * G : 3 * G] * table.scale("detected"),
        sum_noise_sd=release.noise_std * table.scale("sum"),
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


def _moments(sums, squares, counts, noise_sd):
    n = np.maximum(counts, 1.0)[:, None]
    mean = np.maximum(sums / n, 0.0)
    variance = np.maximum(squares / n - mean**2, 0.0) * n / np.maximum(n - 1.0, 1.0)
    return mean, variance, n, (noise_sd / n) ** 2


def rank_markers(stats: GroupStatistics) -> MarkerResult:
    """Scanpy's t-test of each group against the rest, on the noisy statistics (module docstring)."""
    from scipy import stats as st

    counts = np.maximum(stats.counts, 1.0)
    rest = lambda per_group: per_group.sum(0, keepdims=True) - per_group  # noqa: E731
    mean_g, var_g, n_g, noise_g = _moments(stats.sums, stats.squares, counts, stats.sum_noise_sd)
    rest_counts = np.maximum(rest(counts[:, None])[:, 0], 1.0)
    mean_r, var_r, n_r, noise_r = _moments(
        rest(stats.sums), rest(stats.squares), rest_counts, stats.sum_noise_sd * math.sqrt(len(counts) - 1)
    )
    se2_g, se2_r = var_g / n_g + noise_g, var_r / n_r + noise_r
    denominator = np.sqrt(se2_g + se2_r)
    scores = np.divide(mean_g - mean_r, denominator, out=np.zeros_like(mean_g), where=denominator > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        dof = (se2_g + se2_r) ** 2 / (se2_g**2 / np.maximum(n_g - 1, 1) + se2_r**2 / np.maximum(n_r - 1, 1))
    dof = np.nan_to_num(dof, nan=1.0, posinf=1e6)
    pvals = 2.0 * st.t.sf(np.abs(scores), np.maximum(dof, 1.0))
    pvals_adj = np.vstack([_benjamini_hochberg(p) for p in pvals])
    logfold = np.log2((np.expm1(mean_g) + 1e-9) / (np.expm1(mean_r) + 1e-9))
    pts = np.clip(stats.detected / n_g, 0.0, 1.0)
    pts_rest = np.clip(rest(stats.detected) / n_r, 0.0, 1.0)
    order = np.argsort(-scores, axis=1, kind="stable")
    return MarkerResult(order, scores, pvals, pvals_adj, logfold, pts, pts_rest, counts)


def _benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """Benjamini–Hochberg adjusted p-values (as scanpy's ``corr_method="benjamini-hochberg"``)."""
    m = len(p)
    order = np.argsort(p)
    ranked = p[order] * m / np.arange(1, m + 1)
    adjusted = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty(m)
    out[order] = np.minimum(adjusted, 1.0)
    return out
