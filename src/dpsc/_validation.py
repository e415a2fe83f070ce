"""Input checks that run before any work and never modify the user's AnnData."""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

from ._blocks import blockwise_sum, check_row_chunks, row_blocks

SCOPES = ("encoder", "full", "paper")
LIKELIHOODS = ("zinb", "gaussian")
MIN_CELLS = 10


def get_matrix(adata: ad.AnnData, layer: str | None) -> Any:
    """Return ``adata.X`` or ``adata.layers[layer]``; unknown layers raise a clear error."""
    if not isinstance(adata, ad.AnnData):
        raise TypeError(f"Expected an AnnData object, got {type(adata).__name__}.")
    if layer is None:
        if adata.X is None:
            raise ValueError("adata.X is empty; pass layer='counts' (or wherever the counts are).")
        check_row_chunks(adata.X)
        return adata.X
    if layer not in adata.layers:
        known = list(adata.layers.keys()) or "none"
        raise ValueError(f"Unknown layer {layer!r}; adata.layers has: {known}. Pass layer=None for adata.X.")
    check_row_chunks(adata.layers[layer], f"adata.layers[{layer!r}]")
    return adata.layers[layer]


def check_public_counts(
    adata: ad.AnnData, layer: str | None, log_normalize: bool, tool: str, fix: str | None = None
) -> None:
    """Refuse log-normalised input to a tool that reads raw counts, from public metadata only.

    scanpy's ``sc.pp.log1p`` records itself in ``adata.uns["log1p"]``; a DP release must not
    look at the values to decide (refuse-versus-run would then be an output about the cells), so
    this check reads that metadata and nothing else. ``fix`` names the option for transformed data
    (``None``: the tool takes raw counts only).
    """
    if log_normalize and layer is None and "log1p" in adata.uns:
        where = [name for name in adata.layers.keys() if "count" in str(name).lower()]
        layer_hint = f"layer={where[0]!r}" if where else "layer='counts'"
        other = f", or {fix} for log-normalised data" if fix else ""
        raise ValueError(
            f"{tool} needs raw counts, but adata.uns['log1p'] says X is already log-transformed. Pass "
            f"the raw counts with {layer_hint}{other}."
        )


def check_cells(
    adata: ad.AnnData, matrix: Any, tool: str, counts: bool = True, fix: str | None = None
) -> None:
    """Refuse non-finite values, and non-counts where counts are read; warn on duplicate gene names.

    Before any release (central calls). The caller holds these cells: a check that reads them and
    raises here is not a release (nothing leaves the process, nothing is booked;
    ``docs/privacy.md``). A federated site never runs it: there a refusal the server sees may not
    depend on the cells, and a non-finite cell contributes zero instead. ``counts``: the tool reads
    raw counts, so negative or non-integer values (log-normalised or scaled data that carries no
    ``uns["log1p"]``) are refused with the fix (``fix``: the option for transformed data, if any).
    """
    duplicated = adata.var_names[adata.var_names.duplicated()]
    if len(duplicated):
        warnings.warn(
            f"adata.var_names has {len(duplicated)} duplicate gene names (e.g. {duplicated[0]!r}): {tool} "
            "works by position, but its gene lists will repeat names. Call adata.var_names_make_unique() "
            "first.",
            UserWarning,
            stacklevel=3,
        )
    bad = int(blockwise_sum(matrix, _non_finite_rows) or 0)
    if bad:
        raise ValueError(
            f"{tool}: {bad} cells of the expression matrix hold NaN or infinite values; it needs raw counts. "
            "Drop those cells first, e.g. adata = adata[np.isfinite(np.asarray(adata.X.sum(axis=1))).ravel()]"
            ".copy() (use the layer you pass for layer=). Nothing was spent."
        )
    not_counts = int(blockwise_sum(matrix, _non_count_rows) or 0) if counts else 0
    if not_counts:
        layers = [name for name in adata.layers.keys() if "count" in str(name).lower()]
        fixes = [f"layer={layers[0]!r}" if layers else "layer='counts' (if a layer holds them)"]
        if adata.raw is not None:
            fixes.append("adata.raw.to_adata() (if adata.raw holds them)")
        raise ValueError(
            f"{tool} needs raw counts, but {not_counts} cells of the expression matrix hold negative or "
            "non-integer values (log-normalised or scaled data?). Pass the counts: "
            f"{' or '.join(fixes)}{f', or {fix} for transformed data' if fix else ''}. Nothing was spent."
        )


def _non_finite_rows(block: Any) -> int:
    """Count the cells of a block with a NaN or infinite value."""
    if np.isfinite(_values(block)).all():
        return 0
    dense = block.toarray() if sp.issparse(block) else np.asarray(block)
    return int((~np.isfinite(dense)).any(axis=1).sum())


def _non_count_rows(block: Any) -> int:
    """Count the cells of a block with a negative or non-integer value (NaN-free blocks)."""
    values = _values(block)
    if values.size == 0 or ((values >= 0) & (values == np.round(values))).all():
        return 0
    dense = block.toarray() if sp.issparse(block) else np.asarray(block)
    return int(((dense < 0) | (dense != np.round(dense))).any(axis=1).sum())


def _values(block: Any) -> np.ndarray:
    """Return the stored values (non-zeros of a sparse block, everything of a dense one)."""
    return np.asarray(block.data) if sp.issparse(block) else block


def _check_values(values: np.ndarray, likelihood: str) -> None:
    if not np.all(np.isfinite(values)):
        raise ValueError(
            "The expression matrix contains NaN or infinite values; drop those cells first, e.g. "
            "adata = adata[np.isfinite(np.asarray(adata.X.sum(axis=1))).ravel()].copy()."
        )
    if likelihood == "zinb":
        if np.any(values < 0):
            raise ValueError(
                "The ZINB model needs raw counts, but the matrix has negative values. Pass the "
                "raw counts (layer='counts'), or likelihood='gaussian' for transformed data."
            )
        if not np.all(values == np.round(values)):
            raise ValueError(
                "The ZINB model needs raw integer counts, but the matrix has non-integer values "
                "(normalised or log-transformed data?). Pass the raw counts (e.g. "
                "layer='counts'), or likelihood='gaussian' for log-normalised data."
            )


def check_matrix(matrix: Any, likelihood: str, *, training: bool = True) -> None:
    """Reject NaN/inf, negative or non-integer values (ZINB), empty cells and (when training) empty genes."""
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"Unknown likelihood {likelihood!r}; choose one of {LIKELIHOODS}.")
    empty_cells = 0
    gene_sums = np.zeros(matrix.shape[1])
    for block in row_blocks(matrix):
        _check_values(_values(block), likelihood)
        magnitude = abs(block)
        empty_cells += int((np.asarray(magnitude.sum(axis=1)).ravel() == 0).sum())
        gene_sums += np.asarray(magnitude.sum(axis=0)).ravel()
    if empty_cells:
        raise ValueError(
            f"{empty_cells} cell(s) have no counts at all. dpsc does not drop "
            "cells silently; filter them first: sc.pp.filter_cells(adata, min_counts=1)."
        )
    if training and np.any(gene_sums == 0):  # a new site's cells may lack some genes
        raise ValueError(
            f"{int((gene_sums == 0).sum())} gene(s) are zero in every cell. Filter them first: "
            "sc.pp.filter_genes(adata, min_counts=1) (command line: --filter-genes). Which genes "
            "are dropped depends on the cells, so that choice is not covered by the ε."
        )


DEFAULT_DELTA = 1e-5
MAX_DEFAULT_BATCH = 4096


def check_site_key(adata: ad.AnnData, site_key: str) -> None:
    """Refuse a missing site column with the fix; reads metadata only."""
    if site_key in adata.obs:
        return
    hint = ""
    if site_key == "site" and "client" in adata.obs:
        hint = (
            " (obs['client'] is there: pass site_key='client', or rerun dpsc.pp.partition, "
            "which now writes 'site')"
        )
    raise ValueError(
        f"obs[{site_key!r}] is missing{hint}: assign cells to sites first, e.g. dpsc.pp.partition(adata, 4)."
    )


MIN_SITE_CELLS = 2
"""Fewest cells a site of a simulated federation may hold."""


class Sites(NamedTuple):
    """The sites of a federation read from ``obs[site_key]``: sorted names, each cell's site, sizes."""

    names: list[str]
    of_cell: np.ndarray
    sizes: pd.Series


def federation_sites(adata: ad.AnnData, site_key: str) -> Sites:
    """Return the sites of ``obs[site_key]``; refuse fewer than 2 sites or a site under 2 cells.

    Reads metadata only (the site column), so a refusal costs no ε.
    """
    check_site_key(adata, site_key)
    of_cell = adata.obs[site_key].astype(str).to_numpy()
    sizes = pd.Series(of_cell).value_counts().sort_index()
    names = [str(name) for name in sizes.index]
    if len(names) < 2:
        raise ValueError(f"obs[{site_key!r}] has {len(names)} site(s); a federation needs at least 2.")
    small = [name for name in names if sizes[name] < MIN_SITE_CELLS]
    if small:
        raise ValueError(f"Site(s) {small} have fewer than {MIN_SITE_CELLS} cells; merge or drop them.")
    return Sites(names, of_cell, sizes)


def default_batch_size(n_obs: int) -> int:
    """Return the expected Poisson batch of a default fit: 10 % of the cells, at most 4096.

    Up to 40 960 cells this is q = 0.1; above, the batch stays at 4096 cells (the memory of one
    step does not grow with n) and q = 4096 / n falls, so an epoch has n / 4096 steps. The
    accountant calibrates σ for that q and step count. Reads only the number of cells.
    """
    return int(max(1, min(round(0.1 * n_obs), MAX_DEFAULT_BATCH)))


def resolve_delta(delta: float | None, n_obs: int) -> float:
    r"""Return the δ to use: ``delta`` if given, else :math:`\min(10^{-5}, 1/(10\,n))`.

    δ bounds the probability that the guarantee fails outright, so it must be well below
    :math:`1/n` (a δ of :math:`1/n` would allow publishing one cell in full). The default is
    10⁻⁵ up to 10⁴ cells and :math:`1/(10\,n)` above, so that it stays an order of magnitude
    below :math:`1/n` at atlas scale. It reads only the number of cells.
    """
    return float(delta) if delta is not None else min(DEFAULT_DELTA, 0.1 / max(1, n_obs))


def check_epsilon(epsilon: Any, allow_none: bool = True) -> None:
    """ε must be a positive finite number (``None`` for a non-private call, where allowed)."""
    if epsilon is None:
        if not allow_none:
            raise ValueError(
                "epsilon must be a positive number (e.g. epsilon=8); this call has no non-private mode."
            )
        return
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float | np.integer | np.floating):
        raise TypeError(
            f"epsilon must be a number, e.g. epsilon=8; got {epsilon!r} ({type(epsilon).__name__})."
        )


def check_choice(name: str, value: Any, choices: tuple) -> None:
    """Refuse a value outside ``choices`` with a message that lists them."""
    if value not in choices:
        raise ValueError(f"Unknown {name} {value!r}; choose one of {choices}.")


def check_privacy_args(epsilon: float | None, delta: float, n_obs: int) -> None:
    """ε > 0 (or ``None`` for non-private), 0 < δ < 1/n."""
    check_epsilon(epsilon)
    if epsilon is not None:
        if not np.isfinite(epsilon) or epsilon <= 0:
            raise ValueError(
                f"epsilon must be a positive finite number (got {epsilon}); "
                "use epsilon=None for a non-private fit."
            )
    if not (0 < delta < 1.0 / n_obs):
        raise ValueError(
            f"delta must satisfy 0 < delta < 1/n_obs = {1.0 / n_obs:.2e} (got {delta}); a larger "
            "delta allows releasing a whole cell. Leave delta=None (the default, "
            f"{resolve_delta(None, n_obs):.1e} here) or pass a smaller value."
        )


def check_fit_args(*, n_obs: int, n_clusters: int, scope: str, batch_size: int | None) -> int:
    """Validate the shape arguments of a fit and return the batch size to use."""
    if scope not in SCOPES:
        raise ValueError(
            f"Unknown scope {scope!r}; choose 'encoder' (noise on the encoder, decoder fixed), 'full' "
            "(noise on every parameter) or 'paper' (the DP-DCAN paper's partial perturbation)."
        )
    if n_obs < MIN_CELLS:
        raise ValueError(f"Need at least {MIN_CELLS} cells to train with Poisson sampling; got {n_obs}.")
    if isinstance(n_clusters, bool) or not isinstance(n_clusters, int | np.integer):
        raise TypeError(
            f"n_clusters must be a whole number of clusters, got {n_clusters!r}; the privacy budget is "
            "the keyword epsilon= (dpsc.tl.fit(adata, n_clusters, epsilon=8), as dpsc.tl.cluster)."
        )
    if not (2 <= n_clusters <= n_obs):
        raise ValueError(f"n_clusters must be between 2 and n_obs={n_obs}; got {n_clusters}.")
    if batch_size is None:
        batch_size = default_batch_size(n_obs)
    if not (1 <= batch_size <= n_obs):
        raise ValueError(
            f"batch_size must be between 1 and n_obs={n_obs} (it sets the Poisson rate "
            f"q = batch_size / n_obs); got {batch_size}."
        )
    return int(batch_size)


def check_input_pcs(input_pcs: int | None, n_vars: int) -> None:
    """Refuse a number of input principal components the genes cannot hold (the mean one is dropped)."""
    if input_pcs is None:
        return
    if (
        isinstance(input_pcs, bool)
        or not isinstance(input_pcs, int | np.integer)
        or not (1 <= input_pcs <= n_vars - 1)
    ):
        raise ValueError(
            f"input_pcs must be an integer in [1, {n_vars - 1}] for {n_vars} genes (the mean component "
            f"is dropped), or None to read the genes; got {input_pcs!r}."
        )


TARGET_FREQUENCIES = ("uniform", "released")


def check_target_frequency(target_frequency: str) -> None:
    """Refuse a cluster-frequency option of DEC's target other than the two dpsc implements."""
    if target_frequency not in TARGET_FREQUENCIES:
        raise ValueError(
            f"Unknown target_frequency {target_frequency!r}; choose 'uniform' (f_j = 1) or "
            "'released' (noisy cluster frequencies, one accounted release per cluster epoch)."
        )
