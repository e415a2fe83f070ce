r"""A representation taken from public cells: genes, gene scales and components, with no ε.

A public reference (cells of the same tissue from another donor, study or condition, assumed
public and disjoint from the private cells) fixes a map of one cell to a point:

.. math::

    y_i = \mathrm{clip}\big((\log(1 + T x_i / \textstyle\sum_g x_{ig}) - \mu) / s,\ -c,\ c\big),
    \qquad p_i = V^\top y_i / \max(R, \lVert V^\top y_i\rVert_2)

over the reference's highly variable genes :math:`g \in G` (scanpy's ``flavor="seurat"``
selection on the reference), the total :math:`\sum_g x_{ig}` taken over every gene the reference
shares with the cells, with :math:`\mu, s` the reference's gene means and standard deviations,
:math:`c` = :data:`CLIP` (scanpy's ``sc.pp.scale(max_value=10)``) and :math:`V` the reference's top
principal components of the same :math:`y` (scanpy's centred PCA), :math:`T` the reference's
median total (scanpy's ``normalize_total``) and :math:`R` the 0.9 quantile of the norms of the
reference cells' :math:`V^\top y` (:data:`RADIUS_QUANTILE`): the point is the projection in units
of R, clipped to the unit ball (k-means in the euclidean metric, as scanpy's; ``R = None``: on the
unit sphere).
:math:`\mu, s, V, T, R` are computed from the reference only (:func:`basis_from_reference`), so
for the private cells :math:`p_i` is a map of that cell and public values: no release, no ε, and
each :math:`p_i` has norm at most 1, the clipping radius of the DP k-means (:mod:`.kmeans`),
whose sensitivity argument it meets unchanged.

**Privacy argument.** The reference is an input the data owner declares public (it must not hold
the private cells); whatever is computed from it alone is public. The private cells are read only
through the DP k-means tables of their points :math:`p_i` (and, with markers, the marker tables),
each a Gaussian release of a sum over cells with the plan's σ.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import _blocks

CLIP = 10.0  # scanpy's sc.pp.scale(max_value=10): no gene dominates a cell's point
MIN_SCALE = 1e-6  # a gene constant in the reference gets this standard deviation (its y is 0)
#: The points' radius R is this quantile of the norms of the reference cells' :math:`V^\top y`
#: (``None``: every point scaled to unit norm, k-means on the sphere). Chosen by leave one
#: reference / private pair out among 0.5, 0.9 and the sphere (docs, Benchmarks:
#: "``tl.cluster(reference=...)`` on reference / private pairs").
RADIUS_QUANTILE: float | None = 0.9


@dataclass(frozen=True)
class PublicBasis:
    r"""The public map of a cell to its point (module docstring): genes, μ, s, V, T and R.

    Attributes
    ----------
    genes
        Indices of the reference's highly variable genes in the *private* matrix (n_genes).
    means, scales
        μ and s of :math:`\log(1 + T x / \sum x)` over those genes in the reference.
    loadings
        V, genes × components, orthonormal columns.
    shared
        Indices (in the same matrix) of every gene the reference shares with it: a cell's total.
    target_sum
        T, the reference's median total over the shared genes (scanpy's ``normalize_total``).
    radius
        R: each point is :math:`V^\top y / R` clipped to norm 1; ``None``: scaled to norm 1.
    start
        Public starting centroids of the DP k-means in the points' space (computed from the
        reference's points alone), or ``None``: the k-means starts from its own sketch release.
    start_radii
        With a start of the reference's types: each starting centroid's type radius (0 for one that
        is not a type's), which the count choosing the start reads (:mod:`.type_gate`); else ``None``.
    marker_center
        The reference cells' mean log1p(CP10k) expression on the ``shared`` genes, in their order
        (:func:`~.public_markers.reference_center`): the centre the marker statistics of a
        clustering on this basis are measured from, so that no centre is released; ``None`` when
        not computed.
    """

    genes: np.ndarray
    means: np.ndarray
    scales: np.ndarray
    loadings: np.ndarray
    shared: np.ndarray
    target_sum: float = 1e4
    radius: float | None = None
    start: np.ndarray | None = None
    marker_center: np.ndarray | None = None
    start_radii: np.ndarray | None = None

    @property
    def n_comps(self) -> int:
        """Number of components (the points' dimension)."""
        return int(self.loadings.shape[1])

    def scaled(self, block: Any) -> np.ndarray:
        """Return :math:`y` of each cell of ``block`` (cells × all private genes), dense float64."""
        return _scaled(_row_totals(block[:, self.shared]), _dense(block[:, self.genes]), self)

    def points(self, matrix: Any) -> Any:
        """Return each cell's point :math:`p_i`, of norm at most 1 (lazy for a Dask matrix)."""
        rows = _rows(self.shared)  # the block is densified over the shared genes
        return _blocks.map_row_blocks(matrix, self._block_points, self.n_comps, np.float64, rows)

    def _block_points(self, block: Any) -> np.ndarray:
        return to_ball(self.scaled(block) @ self.loadings, self.radius)

    def with_columns(self, genes: np.ndarray, shared: np.ndarray) -> PublicBasis:
        """Return the same map for a matrix whose columns of these genes are ``genes`` and ``shared``."""
        return replace(self, genes=genes, shared=shared)

    def marker_center_for(self, n_vars: int) -> np.ndarray:
        """Return the marker centre on all ``n_vars`` private genes (0 on a gene the reference lacks)."""
        if self.marker_center is None:
            raise ValueError("This public basis has no marker centre; build it with PublicReference.basis().")
        center = np.zeros(int(n_vars))
        center[np.asarray(self.shared)] = self.marker_center
        return center

    def with_start(self, start: np.ndarray | None, radii: np.ndarray | None = None) -> PublicBasis:
        """Return the same map with public starting centroids for the DP k-means (and their types' radii)."""
        if start is None:
            return replace(self, start=None, start_radii=None)
        radii = None if radii is None else np.asarray(radii, dtype=np.float64)
        return replace(self, start=np.asarray(start, dtype=np.float64), start_radii=radii)


def same_basis(given: Any, own: PublicBasis, rtol: float = 1e-6) -> bool:
    """Whether ``given`` is the map ``own`` (same genes; μ, s, V, T and R equal up to round-off).

    A site compares the basis a server sends with the one it computes from its own copy of the
    reference; the starting centroids are the server's post-processing and are not compared.
    """
    if not isinstance(given, PublicBasis):
        return False
    ints = all(
        np.shape(a) == np.shape(b) and np.array_equal(a, b)
        for a, b in ((given.genes, own.genes), (given.shared, own.shared))
    )
    if not ints or np.shape(given.loadings) != np.shape(own.loadings):
        return False
    close = all(
        np.shape(a) == np.shape(b) and np.allclose(a, b, rtol=rtol, atol=rtol * 1e-3)
        for a, b in ((given.means, own.means), (given.scales, own.scales), (given.loadings, own.loadings))
    )
    radii = (given.radius is None) == (own.radius is None) and (
        own.radius is None or np.isclose(given.radius, own.radius, rtol=rtol)
    )
    centers = (
        given.marker_center is None
        or own.marker_center is None
        or (
            np.shape(given.marker_center) == np.shape(own.marker_center)
            and np.allclose(given.marker_center, own.marker_center, rtol=rtol, atol=rtol * 1e-3)
        )
    )
    return bool(close and radii and centers and np.isclose(given.target_sum, own.target_sum, rtol=rtol))


def to_ball(rows: np.ndarray, radius: float | None) -> np.ndarray:
    r"""Scale rows by 1/R and clip them to norm 1 (R = ``radius``), or scale them to norm 1 (``None``)."""
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    if radius is None:
        return np.where(norms > 1e-12, rows / np.maximum(norms, 1e-12), 0.0)
    return rows / np.maximum(radius, norms)


def _dense(X: Any) -> np.ndarray:
    """Return counts as dense float64, a value that is not finite or is negative read as 0 (per cell)."""
    X = X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    return np.where(np.isfinite(X) & (X > 0), X, 0.0).astype(np.float64)


def _row_totals(X: Any) -> np.ndarray:
    """Return each cell's total count (cells × 1) as :func:`_dense` reads its values, without densifying."""
    if not sp.issparse(X):
        return _dense(X).sum(1, keepdims=True)
    X = sp.csr_matrix(X, dtype=np.float64, copy=True)
    X.data = np.where(np.isfinite(X.data) & (X.data > 0), X.data, 0.0)
    return np.asarray(X.sum(1)).reshape(-1, 1)


def _logged(totals: np.ndarray, counts: np.ndarray, target_sum: float) -> np.ndarray:
    return np.log1p(counts * (target_sum / np.where(totals > 0, totals, 1.0)))


def _scaled(totals: np.ndarray, counts: np.ndarray, basis: PublicBasis) -> np.ndarray:
    logged = _logged(totals, counts, basis.target_sum)
    return np.clip((logged - basis.means) / basis.scales, -CLIP, CLIP)


def top_components(centred: np.ndarray, n_comps: int) -> np.ndarray:
    r"""Return the top ``n_comps`` right singular vectors of ``centred`` (genes × components).

    The eigenvectors of the smaller of the two Gram matrices (:math:`A A^\top` when there are
    fewer cells than genes, mapped back by :math:`A^\top u / \lVert A^\top u \rVert`; else
    :math:`A^\top A`), only the top ones computed: the principal components of a full SVD at a
    fraction of its cost. Each column's largest entry is made positive (a deterministic sign).
    """
    n, g = centred.shape
    if n >= g:
        return _top_eigenvectors(centred.T @ centred, n_comps)
    vectors = centred.T @ _top_eigenvectors(centred @ centred.T, n_comps, signed=False)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=0, keepdims=True), 1e-300)
    return _signed(np.ascontiguousarray(vectors))


def _top_eigenvectors(gram: np.ndarray, n_comps: int, signed: bool = True) -> np.ndarray:
    """Return the eigenvectors of the ``n_comps`` largest eigenvalues of ``gram``, largest first."""
    import scipy.linalg

    size = gram.shape[0]
    _, vectors = scipy.linalg.eigh(gram, subset_by_index=[size - n_comps, size - 1])
    vectors = np.ascontiguousarray(vectors[:, ::-1])
    return _signed(vectors) if signed else vectors


def _signed(vectors: np.ndarray) -> np.ndarray:
    """Make each column's largest entry positive (a deterministic sign)."""
    vectors *= np.sign(vectors[np.abs(vectors).argmax(0), np.arange(vectors.shape[1])])
    return vectors


#: Reference cells read at once when the basis streams over them: a dense block holds about this
#: many values (rows × the shared genes), so memory does not grow with the reference's cells.
BLOCK_VALUES = 8_000_000


def _shared_blocks(reference: Any, reference_genes: np.ndarray) -> Any:
    """Yield the reference's counts on the shared genes, dense float64 row blocks (:func:`_dense`)."""
    for block in _blocks.row_blocks(reference, _rows(reference_genes)):
        yield _dense(block[:, reference_genes])


def seurat_top_genes(mean: np.ndarray, var: np.ndarray, n_top: int, n_bins: int = 20) -> np.ndarray:
    r"""Return scanpy's ``highly_variable_genes(flavor="seurat", n_top_genes=n_top)`` mask from moments.

    ``mean`` and ``var`` (unbiased) are each gene's over the cells of :math:`e^{\log(1 + x)} - 1`,
    the normalised counts: the dispersion :math:`\log(\mathrm{var}/\mathrm{mean})` is z-scored
    within ``n_bins`` equal-width bins of :math:`\log(1 + \mathrm{mean})` (a bin of one gene: that
    gene's dispersion divided by itself), and the ``n_top`` largest normalised dispersions are kept
    (ties at the cut-off kept too). scanpy's steps on its moments, so the genes do not depend on
    how the cells were read (tested against scanpy).
    """
    import pandas as pd

    mean = np.where(mean == 0, 1e-12, mean)
    with np.errstate(divide="ignore", invalid="ignore"):
        dispersion = var / mean
        dispersion[dispersion == 0] = np.nan
        dispersion = np.log(dispersion)
    frame = pd.DataFrame({"means": np.log1p(mean), "dispersions": dispersion})
    bins = pd.cut(frame["means"], bins=n_bins)
    stats = frame.groupby(bins, observed=True)["dispersions"].agg(avg="mean", dev="std")
    single = stats["dev"].isnull()
    stats.loc[single, "dev"] = stats.loc[single, "avg"]
    stats.loc[single, "avg"] = 0.0
    per_gene = stats.loc[bins]
    norm = (frame["dispersions"].to_numpy() - per_gene["avg"].to_numpy()) / per_gene["dev"].to_numpy()
    ranked = np.sort(norm[~np.isnan(norm)])[::-1]
    cut = ranked[min(n_top, ranked.size) - 1]
    return np.nan_to_num(norm, nan=-np.inf) >= cut


def basis_from_reference(
    reference: Any,
    reference_genes: np.ndarray,
    private_genes: np.ndarray,
    n_genes: int,
    n_comps: int,
    radius_quantile: float | None = RADIUS_QUANTILE,
) -> PublicBasis:
    r"""Compute the basis from public counts alone (scanpy's recipe; no private cell is read).

    Streams over the reference's cells in row blocks (in memory, backed or sparse), so its memory
    is that of a block and of the genes' moments, not of the reference's cells: four passes,

    1. each cell's total over the shared genes, and T, their median;
    2. each shared gene's sums of :math:`x` and :math:`x^2` (:math:`x = T\,c/\sum c`, scanpy's
       ``normalize_total``) and of :math:`\ell = \log(1 + x)` and :math:`\ell^2`: the genes kept
       (:func:`seurat_top_genes`) and their μ and s (the population standard deviation);
    3. :math:`\sum_i y_i` and :math:`\sum_i y_i y_i^\top` over the kept genes, whose centred
       difference :math:`\sum_i (y_i - \bar y)(y_i - \bar y)^\top` gives V, its top eigenvectors
       (scanpy's centred PCA; with fewer cells than genes, the cells' own Gram matrix);
    4. the cells' norms :math:`\lVert V^\top y_i\rVert`, whose quantile is R.

    Parameters
    ----------
    reference
        The reference's counts, cells × its genes.
    reference_genes, private_genes
        The shared genes: column indices in the reference and in the private matrix, same order.
    n_genes
        Genes kept: scanpy's ``highly_variable_genes(flavor="seurat")`` on the reference's
        :math:`\log(1 + T x/\sum x)` over the shared genes (every shared gene when there are
        fewer), T the median total of the reference's cells.
    n_comps
        Components V: the top principal components of the reference's :math:`y`.
    radius_quantile
        R is this quantile of the reference cells' :math:`\lVert V^\top y\rVert`
        (``None``: unit-norm points).
    """
    totals = np.concatenate([block.sum(1) for block in _shared_blocks(reference, reference_genes)])
    n = totals.size
    target_sum = float(np.median(totals)) if n else 0.0
    target_sum = target_sum if target_sum > 0 else 1e4
    moments = np.zeros((4, len(reference_genes)))
    for block in _shared_blocks(reference, reference_genes):
        logged = _logged(block.sum(1, keepdims=True), block, target_sum)
        x = np.expm1(logged)  # scanpy's seurat flavour reads the normalised counts back this way
        moments += (x.sum(0), (x * x).sum(0), logged.sum(0), (logged * logged).sum(0))
    keep = np.arange(len(reference_genes))
    if n_genes < len(keep):
        mean, mean_sq = moments[0] / n, moments[1] / n
        var = (mean_sq - mean**2) * (n / (n - 1) if n > 1 else 1.0)
        keep = np.flatnonzero(seurat_top_genes(mean, var, n_genes))
    means = moments[2, keep] / n
    scales = np.maximum(np.sqrt(np.maximum(moments[3, keep] / n - means**2, 0.0)), MIN_SCALE)
    basis = PublicBasis(
        np.asarray(private_genes, dtype=np.int64)[keep],
        means,
        scales,
        np.zeros((len(keep), 0)),
        np.asarray(private_genes, dtype=np.int64),
        target_sum,
        None,
    )
    own = basis.with_columns(np.asarray(reference_genes, dtype=np.int64)[keep], np.asarray(reference_genes))
    n_comps = min(n_comps, min(n, len(keep)) - 1)
    loadings = _reference_components(reference, own, n, n_comps)
    radius = None
    if radius_quantile is not None:
        norms = np.concatenate(
            [
                np.linalg.norm(own.scaled(b) @ loadings, axis=1)
                for b in _blocks.row_blocks(reference, _rows(reference_genes))
            ]
        )
        radius = float(np.quantile(norms, radius_quantile)) or 1.0
    return replace(basis, loadings=loadings, radius=radius)


def _rows(genes: np.ndarray) -> int:
    """Return the cells per block whose dense values over ``genes`` are about :data:`BLOCK_VALUES`."""
    return max(256, BLOCK_VALUES // max(1, len(genes)))


def _reference_components(reference: Any, own: PublicBasis, n: int, n_comps: int) -> np.ndarray:
    """Return V from the reference's y over the kept genes (pass 3 of :func:`basis_from_reference`)."""
    blocks = (own.scaled(b) for b in _blocks.row_blocks(reference, _rows(own.shared)))
    if n < len(own.genes):  # fewer cells than genes: their own Gram matrix (small)
        Y = np.concatenate(list(blocks))
        return top_components(Y - Y.mean(0), n_comps)
    total, second = np.zeros(len(own.genes)), np.zeros((len(own.genes), len(own.genes)))
    for Y in blocks:
        total += Y.sum(0)
        second += Y.T @ Y
    return _top_eigenvectors(second - np.outer(total, total) / n, n_comps)
