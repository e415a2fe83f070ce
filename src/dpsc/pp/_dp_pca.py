r"""``dpsc.pp.pca``: principal components from one Gaussian release of the gene covariance.

"Analyze Gauss" (Dwork, Talwar, Thakurta & Zhang 2014, Alg. 1). Each cell is represented per
cell only: :math:`z_i = r_i / \lVert r_i\rVert_2` with :math:`r_i = \log(1 + 10^4 x_i / \sum_g
x_{ig})` (no statistic across cells). Adding or removing one cell changes
:math:`S = \sum_i z_i z_i^\top` by :math:`z z^\top`, whose upper triangle (diagonal included) has
L2 norm at most :math:`\lVert zz^\top\rVert_F = \lVert z\rVert_2^2 = 1`. Adding
:math:`\mathcal N(0, \sigma^2)` to every upper-triangle entry (mirrored below) is therefore the
Gaussian mechanism with sensitivity 1, one Opacus history step :math:`(\sigma, q = 1, 1)`, with σ
calibrated for the asked (ε, δ). Everything afterwards is post-processing of :math:`\tilde S`:

1. keep the ``n_genes`` genes with the largest noisy second moments :math:`\tilde S_{gg}` (the
   spectral norm of the noise grows as :math:`\sigma\sqrt d`, so fewer genes keep more signal);
2. the top ``n_comps`` eigenvectors of the kept block are the loadings (``varm["PCs"]``, zero for
   the other genes); with ``drop_mean_component`` (default) the top eigenvector is skipped and
   the next ``n_comps`` are kept. The rows :math:`z_i` are non-negative, so the top eigenvector of
   :math:`S` is (Perron–Frobenius) a non-negative direction close to the mean cell: a cell's
   coordinate on it says how typical the cell is, not which type it is, and it holds most of
   each cell's norm (on PBMC 4k at ε = 4.8: median coordinate 0.69 on it, median norm 0.27 of the
   next 16 together; cosine 0.9999 between it and the mean cell). Skipping it is scanpy's
   centring done on the release: the projections that remain are those of the centred cells,
   up to the small angle between the top eigenvector and the mean;
3. each cell's projection :math:`z_i^\top V` goes to ``obsm[key_added]`` (a function of that cell
   and the released loadings only, so a later DP step may read it cell by cell).
"""

from __future__ import annotations

import anndata as ad
import numpy as np
import scipy.sparse as sp

from dpsc._docs import doc_params

from .._api import DEFAULT_EPSILON, store_result
from .._validation import _row_blocks, check_privacy_args, get_matrix, resolve_delta
from ..privacy import (
    COMMON_NOT_COVERED,
    NoiseSource,
    PrivacyRecord,
    calibrate_noise_multiplier,
    check_budget,
    gaussian_release_record,
)

MAX_GENES = 5000  # S is a dense genes × genes matrix
DEFAULT_PCA_GENES = 500  # the gene block kept before the eigendecomposition (``pca``'s n_genes)
DENSE_ROWS = 4096  # cells densified at once for S's product (4096 × 2000 genes: 66 MB in float64)


def unit_rows(matrix, log_normalize: bool = True) -> np.ndarray | sp.csr_matrix:
    """Per-cell representation: log1p(CP10k) (or the values as given), each row scaled to norm 1."""
    X = (
        sp.csr_matrix(matrix, dtype=np.float64)
        if sp.issparse(matrix)
        else np.asarray(matrix, dtype=np.float64)
    )
    if log_normalize:
        totals = np.asarray(X.sum(1)).ravel()
        totals = np.where(totals > 0, totals, 1.0)  # a cell without counts stays a zero row
        if sp.issparse(X):
            X = sp.diags(1e4 / totals) @ X
            X.data = np.log1p(X.data)
        else:
            X = np.log1p(X * (1e4 / totals)[:, None])
    norms = np.sqrt(np.asarray(X.multiply(X).sum(1) if sp.issparse(X) else (X**2).sum(1)).ravel())
    scale = 1.0 / np.maximum(norms, 1e-12)
    return sp.diags(scale) @ X if sp.issparse(X) else X * scale[:, None]


def second_moment(matrix, log_normalize: bool = True) -> np.ndarray:
    r""":math:`S = \sum_i z_i z_i^\top` over the unit-norm cells :math:`z_i` (:func:`unit_rows`).

    Read in row blocks of an in-memory or backed matrix, so neither a dense copy of the cells nor
    a second sparse one is held. Each block's rows are densified :data:`DENSE_ROWS` at a time and
    summed with a dense BLAS product :math:`Z_b^\top Z_b` (exact in float64; on 2 threads about 3×
    faster than the sparse × sparse product, whose output is nearly dense). Genes × genes, float64.
    """
    S = np.zeros((matrix.shape[1], matrix.shape[1]))
    for block in _row_blocks(matrix):
        for rows in _row_blocks(unit_rows(block, log_normalize), DENSE_ROWS):
            Z = rows.toarray() if sp.issparse(rows) else rows
            S += Z.T @ Z
    return S


def release_loadings(
    S: np.ndarray,
    sigma: float,
    n_comps: int,
    n_genes: int | None,
    drop_mean_component: bool,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Release the loadings: one Gaussian release of the second-moment matrix ``S`` (steps 1–2 above).

    :math:`\tilde S = S + N + N_{>}^\top` with :math:`N` the upper triangle (diagonal included) of
    i.i.d. :math:`\mathcal N(0, \sigma^2)` entries: the Gaussian mechanism at sensitivity 1 when
    ``S`` sums :math:`z_i z_i^\top` over unit-norm cells (``sigma=0``: the exact, non-private
    eigenvectors). Everything after the draw is post-processing of :math:`\tilde S`. Returns the
    loadings (genes × ``n_comps``, zero rows for the genes not kept, deterministic signs), the
    indices of the kept genes and the noisy eigenvalues of the kept components.
    """
    d = S.shape[0]
    upper = np.triu(rng.normal(0.0, sigma, size=(d, d))) if sigma > 0 else np.zeros((d, d))
    S_noisy = S + upper + np.triu(upper, 1).T  # the release: everything below is post-processing
    keep = np.sort(np.argsort(np.diag(S_noisy))[::-1][: n_genes or d])
    eigval, eigvec = np.linalg.eigh(S_noisy[np.ix_(keep, keep)])
    skip = int(drop_mean_component)
    order = np.argsort(eigval)[::-1][skip : skip + n_comps]
    V = eigvec[:, order]
    V *= np.sign(V[np.abs(V).argmax(0), np.arange(n_comps)])  # deterministic signs
    loadings = np.zeros((d, n_comps))
    loadings[keep] = V
    return loadings, keep, eigval[order]


def _check(
    adata: ad.AnnData,
    n_comps: int,
    n_genes: int | None,
    epsilon: float,
    delta: float,
    layer,
    drop_mean_component: bool,
):
    matrix = get_matrix(adata, layer)
    check_privacy_args(epsilon, delta, adata.n_obs)
    if adata.n_vars > MAX_GENES:
        raise ValueError(
            f"dpsc.pp.pca releases a dense genes × genes matrix; {adata.n_vars} genes is more than "
            f"{MAX_GENES}. Restrict the genes first (a public gene list, or dpsc's DP gene selection)."
        )
    n_eig = n_comps + int(drop_mean_component)  # eigenvectors the kept block must have
    if not 1 <= n_comps <= adata.n_vars - int(drop_mean_component):
        raise ValueError(
            f"n_comps must be in [1, {adata.n_vars - int(drop_mean_component)}] for {adata.n_vars} genes"
            f"{' (the mean component is dropped)' if drop_mean_component else ''}, got {n_comps}."
        )
    if n_genes is not None and n_genes < n_eig:
        raise ValueError(
            f"n_genes must be at least {n_eig} for n_comps={n_comps}"
            f"{' plus the dropped mean component' if drop_mean_component else ''} "
            f"(or None for all genes), got {n_genes}."
        )
    values = matrix.data if sp.issparse(matrix) else np.asarray(matrix)
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ValueError("dpsc.pp.pca needs finite, non-negative expression values (raw counts by default).")
    if np.any(np.asarray(matrix.sum(1)).ravel() <= 0):
        raise ValueError(
            "Some cells have no counts; filter them first: sc.pp.filter_cells(adata, min_counts=1)."
        )
    return matrix


def pca_record(sigma: float, epsilon: float, delta: float, n_obs: int, noise: NoiseSource) -> PrivacyRecord:
    """Record of one Analyze-Gauss release (proven (ε, δ)-DP, Gaussian mechanism, sensitivity 1)."""
    return gaussian_release_record(
        "pp.pca",
        sigma=sigma,
        sample_rate=1.0,
        steps=1,
        target_epsilon=epsilon,
        delta=delta,
        unit=f"adding or removing one of the {n_obs} cells",
        mechanism="the Gaussian mechanism on the gene second-moment matrix of unit-norm cells "
        "(sensitivity 1)",
        covered="the loadings (varm['PCs']), the selected genes and the eigenvalues, and anything computed "
        "from them on other data",
        not_covered="the projections written to obsm for these cells (computed from each cell); "
        + COMMON_NOT_COVERED,
        noise_dict=noise.to_dict(),
        noise_sentence=noise.describe(),
        scope="loadings",
        max_grad_norm=1.0,
    )


@doc_params
def pca(
    adata: ad.AnnData,
    n_comps: int = 16,
    *,
    epsilon: float = DEFAULT_EPSILON / 2,
    delta: float | None = None,
    n_genes: int | None = DEFAULT_PCA_GENES,
    layer: str | None = None,
    log_normalize: bool = True,
    drop_mean_component: bool = True,
    key_added: str = "X_pca",
    noise_seed: int | None = None,
    copy: bool = False,
) -> ad.AnnData | None:
    """Differentially private PCA of the cells (Analyze Gauss, Dwork et al. 2014).

    One Gaussian release of the genes × genes second-moment matrix of unit-norm cells; the
    loadings are its top eigenvectors (module docstring for the argument). Proven (ε, δ)-DP for
    the loadings with respect to adding or removing one cell; the ε goes into the AnnData's
    ledger (:func:`dpsc.privacy.spent`).

    Parameters
    ----------
    adata
        Cells × genes, raw counts (or non-negative values with ``log_normalize=False``).
    n_comps
        Number of components. Components past the first few carry mostly noise at small ε;
        the default 16 is the number the private clustering benchmark uses.
    epsilon, delta
        The release's (ε, δ). The default is half of the workflow default 8: ``pp.pca`` then
        :func:`dpsc.tl.kmeans`, both at their defaults, spend 8 together. ``delta=None``:
        10⁻⁵, or 1/(10 n) above 10⁴ cells.
    n_genes
        Keep the genes with the largest *noisy* second moments before the eigendecomposition
        (post-processing; ``None``, or more than ``n_vars``, keeps all). The noise's spectral norm grows as
        σ√d, so a smaller block keeps more signal. 500 was chosen with the PBMC
        4k labels and confirmed on mouse bladder (``benchmarks/results/dp_pipeline.md``).
    layer
        Layer with the counts; ``None`` for ``X``.
    log_normalize
        Represent each cell as log1p(CP10k) before scaling it to unit norm.
    drop_mean_component
        Skip the top eigenvector (the direction of the mean cell, module docstring) and keep the
        next ``n_comps``: the counterpart of scanpy's ``zero_center=True``. Post-processing, no
        privacy cost.
    key_added
        ``obsm`` key of the projections; the record goes to ``uns["dpsc"][key_added]``.
    noise_seed
        {doc_noise_seed}
    copy
        {doc_copy}

    Returns
    -------
    ``None``, or the new AnnData with ``copy=True``. Writes ``obsm[key_added]`` (cells ×
    ``n_comps``), ``varm["PCs"]`` (genes × ``n_comps``, zero rows for the genes not kept),
    ``var["dp_pca_gene"]``, and the record and noisy eigenvalues in ``uns["dpsc"][key_added]``.
    """
    delta = resolve_delta(delta, adata.n_obs)
    matrix = _check(adata, n_comps, n_genes, epsilon, delta, layer, drop_mean_component)
    sigma = calibrate_noise_multiplier(epsilon, delta, 1.0, 1)
    noise = NoiseSource(noise_seed)
    record = pca_record(sigma, epsilon, delta, adata.n_obs, noise)
    check_budget(adata, record, key_added)

    S = second_moment(matrix, log_normalize)
    loadings, keep, eigval = release_loadings(
        S, sigma, n_comps, n_genes, drop_mean_component, noise.numpy_rng("releases")
    )

    target = adata.copy() if copy else adata
    target.obsm[key_added] = np.asarray(unit_rows(matrix, log_normalize) @ loadings, dtype=np.float32)
    target.varm["PCs"] = loadings
    target.var["dp_pca_gene"] = np.isin(np.arange(S.shape[0]), keep)
    params = {
        "n_comps": n_comps,
        "n_genes": n_genes,
        "layer": layer,
        "log_normalize": log_normalize,
        "drop_mean_component": drop_mean_component,
    }
    return store_result(adata, target, key_added, record, params, copy=copy, eigenvalues=eigval)
