r"""DP PCA as a release of the sum over cells: "Analyze Gauss" (Dwork, Talwar, Thakurta & Zhang 2014).

**Per-cell contribution.** Each cell is represented from itself alone:
:math:`z_i = r_i / \lVert r_i\rVert_2` with :math:`r_i = \log(1 + 10^4 x_i / \sum_g x_{ig})`
(:func:`unit_rows`; a cell without counts is a zero row, and a negative or non-finite count is
read as 0 — a per-cell map, so no value of a cell can make the release refuse). Its contribution
is the upper triangle (diagonal included) of :math:`z_i z_i^\top`, of L2 norm at most
:math:`\lVert z_i z_i^\top\rVert_F = \lVert z_i\rVert_2^2 \le 1`: sensitivity 1.

**Sum.** :math:`S = \sum_i z_i z_i^\top` (:func:`second_moment`), over all cells or over one
site's cells.

**Noise.** :func:`second_moment_release` is the :class:`~dpsc.privacy.GaussianSum` of the
:math:`d(d+1)/2` upper-triangle entries; the released matrix is mirrored
(:func:`from_upper`). :func:`released_loadings` is the whole central release (:func:`dpsc.pp.pca`
and DP-DCAN's input loadings); the private clustering asks for the same sum, over all cells or
summed over sites, through :mod:`dpsc.methods.clustering`.

**Post-processing** (:func:`loadings`): keep the ``n_genes`` genes with the largest noisy second
moments :math:`\tilde S_{gg}` (the noise's spectral norm grows as :math:`\sigma\sqrt d`, so a
smaller block keeps more signal); the top eigenvectors of that block, skipping the first when
``drop_mean_component`` (the rows are non-negative, so by Perron–Frobenius the top eigenvector is a
non-negative direction close to the mean cell: skipping it is scanpy's centring done on the
release), are the loadings.

**Residual release** (the private clustering, :mod:`dpsc.methods.clustering`): the cells' sum
:math:`s = \sum_i z_i` (:func:`cell_sum`, sensitivity 1) gives the mean direction
:math:`u = \tilde s / \lVert\tilde s\rVert` (:func:`mean_direction`); the second moment of the unit
residuals :math:`r_i = P z_i / \lVert P z_i\rVert`, :math:`P = I - u u^\top` (:func:`residual_rows`;
still of norm at most 1, so sensitivity 1) gives the other loadings (:func:`residual_loadings`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import _blocks
from ..privacy import GaussianSum, SecureRandom

MAX_GENES = 5000  # S is a dense genes × genes matrix
DEFAULT_GENE_BLOCK = 500  # genes kept (by noisy second moment) before the eigendecomposition


def unit_rows(matrix: Any, log_normalize: bool = True) -> np.ndarray | sp.csr_matrix:
    """Per-cell representation: log1p(CP10k) (or the values as given), each row scaled to norm 1.

    Non-finite values (and, for counts, negative ones) count as 0; a row without counts stays 0.
    """
    X = sp.csr_matrix(matrix, dtype=np.float64) if sp.issparse(matrix) else np.array(matrix, np.float64)
    values = X.data if sp.issparse(X) else X
    bad = ~np.isfinite(values) | ((values < 0) if log_normalize else False)
    if bad.any():
        if sp.issparse(X):  # csr_matrix(float64 input) shares the caller's data: copy first
            X = X.copy()
            values = X.data
        values[bad] = 0.0
    if log_normalize:
        totals = np.asarray(X.sum(1)).ravel()
        totals = np.where(totals > 0, totals, 1.0)
        if sp.issparse(X):
            X = sp.diags(1e4 / totals) @ X
            X.data = np.log1p(X.data)
        else:
            X = np.log1p(X * (1e4 / totals)[:, None])
    norms = np.sqrt(np.asarray(X.multiply(X).sum(1) if sp.issparse(X) else (X**2).sum(1)).ravel())
    scale = 1.0 / np.maximum(norms, 1e-12)
    return sp.diags(scale) @ X if sp.issparse(X) else X * scale[:, None]


def unit_row_blocks(matrix: Any, log_normalize: bool = True, columns: np.ndarray | None = None):
    """Yield the unit-norm cells (:func:`unit_rows`) of ``matrix``, one row block at a time.

    ``columns``: only these genes, each cell normalised over them (as in an AnnData subset).
    """
    for block in _blocks.row_blocks(matrix):
        yield unit_rows(block if columns is None else block[:, columns], log_normalize)


@_blocks.sum_over_cells("weights")
def second_moment(
    matrix: Any,
    log_normalize: bool = True,
    columns: np.ndarray | None = None,
    released: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    r""":math:`S = \sum_i z_i z_i^\top` over the unit-norm cells :math:`z_i` (:func:`unit_rows`).

    Read in row blocks of an in-memory or backed matrix; each block's rows are densified
    :data:`dpsc._blocks.DENSE_ROWS` at a time and summed with a dense float64 BLAS product
    :math:`Z_b^\top Z_b` (exact, and on 2 threads about 3× faster than a sparse product whose
    output is nearly dense). Genes × genes, float64. ``columns``: only these genes (each cell is
    then normalised over them, as in an AnnData subset to them). ``released``: orthonormal columns
    (genes × m) released before; each :math:`z_i` is then replaced by its unit residual
    (:func:`residual_rows`), still of norm at most 1. ``weights``: each cell's weight
    :math:`w_i` in :math:`\sum_i w_i z_i z_i^\top` (the donor unit's :math:`1/m_d`; ``None``: 1).
    """
    d = matrix.shape[1] if columns is None else len(columns)
    S = np.zeros((d, d))
    start = 0
    for block in unit_row_blocks(matrix, log_normalize, columns):
        for rows in _blocks.row_blocks(block, _blocks.DENSE_ROWS):
            Z = rows.toarray() if sp.issparse(rows) else rows
            if released is not None:
                Z = residual_rows(Z, released)
            w = _blocks.rows_of(weights, start, Z.shape[0])
            start += Z.shape[0]
            S += Z.T @ (Z if w is None else Z * w[:, None])
    return S


def residual_rows(Z: np.ndarray, released: np.ndarray) -> np.ndarray:
    r"""Each row's part orthogonal to the released directions, scaled to norm 1 (a zero part stays 0).

    :math:`r_i = P z_i / \lVert P z_i\rVert_2` with :math:`P = I - U U^\top` and :math:`U` the
    orthonormal ``released`` columns: a map of the cell and public values only, of norm at most 1
    whatever the columns are. A part below 10⁻⁹ (rounding of a cell along the directions) is 0.
    """
    with np.errstate(over="ignore", invalid="ignore"):  # hostile directions: such rows become 0
        R = Z - (Z @ released) @ released.T
        norms = np.linalg.norm(R, axis=1)
    keep = np.isfinite(norms) & (norms > 1e-9)  # a row that is not finite contributes zero
    scale = np.divide(1.0, norms, out=np.zeros_like(norms), where=keep)
    return np.where(keep[:, None], R, 0.0) * scale[:, None]


@_blocks.sum_over_cells("weights")
def cell_sum(
    matrix: Any,
    log_normalize: bool = True,
    columns: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    r""":math:`s = \sum_i w_i z_i` over the unit-norm cells (:func:`unit_rows`; sensitivity 1), in row blocks.

    ``weights``: each cell's :math:`w_i` (the donor unit's :math:`1/m_d`; ``None``: 1).
    """
    d = matrix.shape[1] if columns is None else len(columns)
    total = np.zeros(d)
    start = 0
    for block in unit_row_blocks(matrix, log_normalize, columns):
        total += _blocks.weighted_rows(block, _blocks.rows_of(weights, start, block.shape[0]))
        start += block.shape[0]
    return total


def cell_sum_release(n_genes: int, noise_multiplier: float) -> GaussianSum:
    r"""Return the Gaussian release of :math:`s = \sum_i z_i` (sensitivity 1)."""
    return GaussianSum("cell sum", n_genes, 1.0, noise_multiplier)


def second_moment_release(n_genes: int, noise_multiplier: float) -> GaussianSum:
    """Return the Gaussian release of the upper triangle of S (sensitivity 1)."""
    return GaussianSum("second moment", n_genes * (n_genes + 1) // 2, 1.0, noise_multiplier)


def upper(S: np.ndarray) -> np.ndarray:
    """Return the upper triangle of ``S`` (diagonal included), row by row: what is released."""
    return S[np.triu_indices(S.shape[0])]


def from_upper(values: np.ndarray, n_genes: int) -> np.ndarray:
    """Return the symmetric matrix whose upper triangle is ``values``."""
    S = np.zeros((n_genes, n_genes))
    S[np.triu_indices(n_genes)] = values
    return S + np.triu(S, 1).T


def loadings(
    S_noisy: np.ndarray, n_comps: int, n_genes: int | None, drop_mean_component: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Post-processing of the released matrix: ``(loadings, kept gene indices, eigenvalues)``.

    Loadings are genes × ``n_comps`` with zero rows for the genes not kept and deterministic signs
    (the largest entry of each component is positive).
    """
    d = S_noisy.shape[0]
    keep = np.sort(np.argsort(np.diag(S_noisy))[::-1][: n_genes or d])
    eigval, eigvec = np.linalg.eigh(S_noisy[np.ix_(keep, keep)])
    skip = int(drop_mean_component)
    order = np.argsort(eigval)[::-1][skip : skip + n_comps]
    V = eigvec[:, order]
    V *= np.sign(V[np.abs(V).argmax(0), np.arange(n_comps)])
    out = np.zeros((d, n_comps))
    out[keep] = V
    return out, keep, eigval[order]


def mean_direction(noisy_sum: np.ndarray) -> np.ndarray:
    """Return the released cell sum scaled to norm 1 (post-processing; a zero sum: all genes equal)."""
    norm = float(np.linalg.norm(noisy_sum))
    if norm > 0 and np.isfinite(norm):
        return noisy_sum / norm
    return np.full(noisy_sum.shape, 1.0 / np.sqrt(noisy_sum.size))


def residual_loadings(
    S_noisy: np.ndarray, direction: np.ndarray, n_comps: int
) -> tuple[np.ndarray, np.ndarray]:
    r"""Return the loadings ``[u, v_1, …, v_{m-1}]`` and the eigenvalues of the :math:`v_j` (post-processing).

    :math:`u` is the released mean direction; :math:`v_j` are the top eigenvectors of the released
    second moment of the unit residuals (:func:`residual_rows`), made orthogonal to :math:`u`
    (the noise leaves them slightly off it) and signed so that each one's largest entry is
    positive. Genes × ``n_comps``, orthonormal columns.
    """
    eigval, eigvec = np.linalg.eigh(S_noisy)
    order = np.argsort(eigval)[::-1][: n_comps - 1]
    V = eigvec[:, order]
    V = V - np.outer(direction, direction @ V)
    V = np.linalg.qr(np.column_stack([direction, V]))[0][:, 1:]  # orthonormal and orthogonal to u
    V *= np.sign(V[np.abs(V).argmax(0), np.arange(V.shape[1])])
    return np.column_stack([direction, V]), eigval[order]


def released_loadings(
    matrix: Any,
    noise_multiplier: float,
    stream: SecureRandom,
    n_comps: int,
    n_genes: int | None,
    drop_mean_component: bool,
    log_normalize: bool = True,
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Release the second moment of ``matrix``'s cells with Gaussian noise and return its loadings.

    The whole central release: :math:`\tilde S = S + \mathcal N(0, \sigma^2)` on the upper
    triangle of :math:`S = \sum_i z_i z_i^\top` (sensitivity 1; the caller's accountant records
    one history entry :math:`(\sigma, q = 1)`), then post-processing only (:func:`loadings`).

    Parameters
    ----------
    matrix
        Cells × genes (in memory or backed), read in row blocks.
    noise_multiplier
        σ of the release.
    stream
        The secret (or benchmark-seeded) noise stream of this one release.
    n_comps, n_genes, drop_mean_component
        Passed to :func:`loadings`.
    log_normalize
        Whether the rows are counts (log1p(CP10k) before the unit norm) or values as given.
    weights
        Each cell's weight in the sum (the donor unit: 1/its donor's cells, so a donor's
        contribution keeps the sensitivity 1; :func:`second_moment`).

    Returns
    -------
    What :func:`loadings` returns: ``(loadings, kept gene indices, eigenvalues)``.
    """
    d = matrix.shape[1]
    S = second_moment(matrix, log_normalize, weights=weights)
    noisy = second_moment_release(d, noise_multiplier).release(upper(S), stream)
    return loadings(from_upper(noisy, d), n_comps, n_genes, drop_mean_component)


def project(
    matrix: Any, pcs: np.ndarray, log_normalize: bool = True, columns: np.ndarray | None = None
) -> np.ndarray:
    r"""Each cell's projection :math:`z_i^\top V` (a function of that cell and the loadings), float32.

    A row whose projection is not finite (loadings that overflow) is zero: a per-cell map. On a Dask
    array: a lazy Dask array of the same rows (:func:`dpsc._blocks.map_row_blocks`).
    """
    if _blocks.is_dask(matrix):
        return _blocks.map_row_blocks(
            matrix, lambda block: project(block, pcs, log_normalize, columns), pcs.shape[1]
        )
    out = np.empty((matrix.shape[0], pcs.shape[1]), dtype=np.float32)
    start = 0
    for block in unit_row_blocks(matrix, log_normalize, columns):
        with np.errstate(over="ignore", invalid="ignore"):
            rows = np.asarray(block @ pcs, dtype=np.float32)
        rows[~np.isfinite(rows).all(1)] = 0.0
        out[start : start + len(rows)] = rows
        start += len(rows)
    return out
