"""``dpsc.tl.rank_genes_groups``: marker genes of each group from one private release, in scanpy's format.

The mechanism (per-cell rows, their bounds, the per-group table and scanpy's t-test on it) is
:mod:`dpsc.privacy._markers`; this module checks the arguments, books the release and writes
``uns[key_added]`` in the structure :func:`scanpy.tl.rank_genes_groups` writes, so that
:func:`scanpy.get.rank_genes_groups_df`, :func:`scanpy.pl.rank_genes_groups` and
:func:`scanpy.pl.rank_genes_groups_dotplot` read it unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import anndata as ad
import numpy as np
import pandas as pd

from dpsc._docs import doc_params

from .._api import DEFAULT_EPSILON, store_result
from .._validation import check_privacy_args, check_public_counts, get_matrix, resolve_delta
from ..privacy import (
    COMMON_NOT_COVERED,
    NoiseSource,
    PrivacyRecord,
    calibrate_noise_multiplier,
    gaussian_release_record,
    no_guarantee_record,
    spending,
)
from ..privacy import _markers as mechanism


def markers_record(
    sigma: float, epsilon: float | None, delta: float, n_obs: int, groupby: str, noise: NoiseSource
) -> PrivacyRecord:
    """Record of the one Gaussian release of the per-group table (proven (ε, δ)-DP; none without ε)."""
    covered = f"the marker table in uns (every gene's statistics in every group of obs[{groupby!r}])"
    if epsilon is None:
        return no_guarantee_record("tl.rank_genes_groups", unit=f"one of the {n_obs} cells", covered=covered)
    return gaussian_release_record(
        "tl.rank_genes_groups",
        sigma=sigma,
        target_epsilon=epsilon,
        delta=delta,
        unit=f"adding or removing one of the {n_obs} cells (with its value of obs[{groupby!r}])",
        mechanism="the discrete Gaussian mechanism on per-group sums of each cell's log1p(CP10k) "
        "expression, its squares and its detected genes, and on the group sizes (each cell adds to its "
        "own group only; every part bounded from the number of genes alone)",
        covered=f"{covered} and anything computed from it",
        not_covered=f"{COMMON_NOT_COVERED}; the groups themselves (obs[{groupby!r}] is read as part of "
        "each cell: when it comes from a private clustering, that clustering's ε covers it); plots "
        "such as sc.pl.rank_genes_groups_dotplot, which read the cells again on this machine",
        noise=noise,
        scope="marker genes",
        max_grad_norm=mechanism.SENSITIVITY,
    )


def _group_codes(adata: ad.AnnData, groupby: str, groups: Sequence[str] | None) -> tuple[np.ndarray, list]:
    """Each cell's code among the groups (−1: in none) and the group names; reads metadata only."""
    if groupby not in adata.obs:
        raise KeyError(f"groupby={groupby!r} is not a column of adata.obs; run dpsc.tl.cluster first.")
    column = adata.obs[groupby]
    if not isinstance(column.dtype, pd.CategoricalDtype):
        raise ValueError(
            f"adata.obs[{groupby!r}] is not categorical: the groups must be known without reading the cells. "
            f"Make it categorical (adata.obs[{groupby!r}] = adata.obs[{groupby!r}].astype('category')) or "
            "name the groups with groups=[...]."
        )
    names = [str(c) for c in column.cat.categories] if groups is None else [str(g) for g in groups]
    if len(names) < 2 or len(set(names)) != len(names):
        raise ValueError(f"rank_genes_groups needs at least 2 distinct groups, got {names}.")
    lookup = {name: k for k, name in enumerate(names)}
    codes = np.array([lookup.get(str(v), -1) if pd.notna(v) else -1 for v in column], dtype=np.int64)
    return codes, names


def _recarray(values: np.ndarray, names: list[str], dtype: str) -> np.recarray:
    return np.rec.fromarrays(list(values), dtype=[(name, dtype) for name in names])


def _scanpy_result(result, names, var_names, n_genes, groupby, layer, pts: bool) -> dict:
    """Return what :func:`scanpy.tl.rank_genes_groups` writes (method ``"t-test"``, reference ``"rest"``)."""
    top = result.order[:, :n_genes]
    pick = lambda values: np.take_along_axis(values, top, axis=1)  # noqa: E731
    out = {
        "params": {
            "groupby": groupby,
            "reference": "rest",
            "method": "t-test",
            "use_raw": False,
            "layer": layer,
            "corr_method": "benjamini-hochberg",
        },
        "names": _recarray(np.asarray(var_names)[top].astype(object), names, "O"),
        "scores": _recarray(pick(result.scores).astype(np.float32), names, "float32"),
        "pvals": _recarray(pick(result.pvals), names, "float64"),
        "pvals_adj": _recarray(pick(result.pvals_adj), names, "float64"),
        "logfoldchanges": _recarray(pick(result.logfoldchanges).astype(np.float32), names, "float32"),
    }
    if pts:
        out["pts"] = pd.DataFrame(result.pts.T, index=var_names, columns=names)
        out["pts_rest"] = pd.DataFrame(result.pts_rest.T, index=var_names, columns=names)
    return out


def write_markers(
    target: ad.AnnData,
    released: np.ndarray,
    release,
    names: list[str],
    groupby: str,
    *,
    n_genes: int | None = 100,
    pts: bool = True,
    layer: str | None = None,
    key: str = "rank_genes_groups",
) -> dict:
    """Rank a released marker table and write it to ``target.uns[key]`` in scanpy's format.

    Post-processing only. Returns the parameters to record: the group sizes used and the groups
    whose noisy size is below twice its noise (their markers are mostly noise).
    """
    table = mechanism.MarkerTable(len(names), target.n_vars)
    result = mechanism.rank_markers(mechanism.group_statistics(released, table, release))
    kept = target.n_vars if n_genes is None else min(int(n_genes), target.n_vars)
    target.uns[key] = _scanpy_result(result, names, target.var_names, kept, groupby, layer, pts)
    count_noise = release.noise_std * table.scale("count")
    below = [name for name, size in zip(names, result.counts, strict=True) if size < 2 * count_noise]
    return {"n_genes": kept, "group_sizes": result.counts.tolist(), "groups_below_noise": below}


@doc_params
def rank_genes_groups(
    adata: ad.AnnData,
    groupby: str = "dp_kmeans",
    *,
    groups: Sequence[str] | None = None,
    n_genes: int | None = 100,
    pts: bool = True,
    epsilon: float | None = DEFAULT_EPSILON,
    delta: float | None = None,
    layer: str | None = None,
    noise_seed: int | None = None,
    key_added: str = "rank_genes_groups",
    copy: bool = False,
) -> ad.AnnData | None:
    """Rank marker genes of each group from a differentially private release, as scanpy does.

    One Gaussian release of a groups × (3G + 1) table: per group, the sums of each cell's
    log1p(CP10k) expression, of its squares and of its detected genes, and the group's size
    (:mod:`dpsc.privacy._markers` states the bounds; each cell adds to its own group only, so one
    cell moves the table by at most Δ whatever the groups are). Then scanpy's t-test of each
    group against the rest on the noisy statistics (post-processing), with the known noise of the
    two means added to the standard error so that differences within the noise do not rank high;
    log fold changes and the fraction of cells expressing each gene as scanpy computes them.
    Proven (ε, δ)-DP for the marker table with respect to adding or removing one cell; the ε
    joins the AnnData's ledger. To name clusters within one budget, split it:
    ``eps_cluster, eps_markers = dpsc.privacy.split_budget(...)`` or simply
    ``tl.cluster(adata, k, epsilon=6)`` then ``tl.rank_genes_groups(adata, epsilon=2)``.

    Parameters
    ----------
    adata
        Cells × genes, raw counts.
    groupby
        Categorical ``obs`` column of the groups (default: :func:`dpsc.tl.cluster`'s clusters).
        Its categories are the groups (public metadata); a cell in none of them adds nothing.
    groups
        Rank only these groups (against the rest of the cells in them); ``None``: every category.
    n_genes
        Genes kept per group in the result (``None``: every gene).
    pts
        Also write the fraction of cells expressing each gene (``pts``, ``pts_rest``).
    epsilon, delta
        The release's (ε, δ); ``epsilon=None``: exact statistics, no privacy (a reference run).
        ``delta=None``: 10⁻⁵, or 1/(10 n) above 10⁴ cells.
    layer
        Layer with the counts; ``None`` for ``X``.
    noise_seed
        {doc_noise_seed}
    key_added
        ``uns`` key of the scanpy-format result; the record goes to ``uns["dpsc"][key_added]``.
    copy
        {doc_copy}

    Returns
    -------
    ``None``, or the new AnnData with ``copy=True``. Writes ``uns[key_added]`` with scanpy's
    fields (``params``, ``names``, ``scores``, ``pvals``, ``pvals_adj``, ``logfoldchanges``,
    ``pts``, ``pts_rest``), and ``uns["dpsc"][key_added]`` with the record and the noisy group
    sizes (a group whose noisy size is below twice its noise has markers that are mostly noise:
    ``groups_below_noise`` lists them).
    """
    delta = resolve_delta(delta, adata.n_obs)
    matrix = get_matrix(adata, layer)
    check_privacy_args(epsilon, delta, adata.n_obs)
    check_public_counts(adata, layer, True, "dpsc.tl.rank_genes_groups", fix="layer='counts'")
    codes, names = _group_codes(adata, groupby, groups)
    if n_genes is not None and (isinstance(n_genes, bool) or int(n_genes) < 1):
        raise ValueError(f"n_genes must be a positive integer or None, got {n_genes!r}.")
    kept = adata.n_vars if n_genes is None else min(int(n_genes), adata.n_vars)
    sigma = 0.0 if epsilon is None else calibrate_noise_multiplier(epsilon, delta, 1.0, 1)
    noise = NoiseSource(noise_seed)
    record = markers_record(sigma, epsilon, delta, adata.n_obs, groupby, noise)
    with spending(adata, record, key_added) as booking:
        table = mechanism.MarkerTable(len(names), adata.n_vars)
        release = mechanism.marker_release(table, sigma)
        exact = mechanism.group_table(matrix, codes, table)
        released = exact if sigma == 0 else release.release(exact, noise.stream("tl.rank_genes_groups"))
        target = adata.copy() if copy else adata
        written = write_markers(
            target, released, release, names, groupby, n_genes=kept, pts=pts, layer=layer, key=key_added
        )
        params = {"groupby": groupby, "groups": names, "layer": layer, **written}
        return store_result(adata, target, key_added, record, params, copy=copy, booking=booking)


__all__ = ["rank_genes_groups"]
