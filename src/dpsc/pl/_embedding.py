"""Embedding plot of DP results (thin over scanpy)."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
import scanpy as sc
from matplotlib.axes import Axes

from ._utils import finish, get_ax


def embedding(
    adata: ad.AnnData,
    color: str | None = "dp_cluster",
    basis: str = "umap",
    *,
    title: str | None = None,
    privacy_key: str = "X_dpdcan",
    ax: Axes | None = None,
    show: bool | None = None,
    save: str | Path | None = None,
    **kwargs,
) -> Axes | None:
    """Scatter of ``adata.obsm[f"X_{basis}"]`` coloured by ``color`` (via :func:`scanpy.pl.embedding`).

    Parameters
    ----------
    adata
        Annotated data with the embedding, e.g. after ``sc.pp.neighbors(adata,
        use_rep="X_dpdcan"); sc.tl.umap(adata)``.
    color
        ``obs`` column or gene to colour by.
    basis
        Embedding name (``"umap"`` reads ``obsm["X_umap"]``).
    title
        Panel title; the default names ε, the guarantee and the scope of the private fit
        recorded under ``privacy_key`` (its statement: ``dpsc.privacy.get_record(adata, key)``).
    privacy_key
        ``key_added`` of the fit whose ε the default title names.
    ax, show, save
        scanpy's conventions; the Axes is returned when not shown.
    **kwargs
        Passed to :func:`scanpy.pl.embedding`.
    """
    key = basis if basis.startswith("X_") else f"X_{basis}"
    if key not in adata.obsm:
        raise KeyError(
            f"adata.obsm has no {key!r}. Compute it first, e.g. sc.pp.neighbors(adata, "
            "use_rep='X_dpdcan'); sc.tl.umap(adata)."
        )
    if title is None:
        record = adata.uns.get("dpsc", {}).get(privacy_key, {}).get("privacy", {})
        eps = record.get("epsilon")
        if isinstance(eps, float) and eps == eps:
            title = f"{color} (ε = {eps:.3g}, {record.get('guarantee')}, {record.get('scope')} scope)"
        else:
            title = str(color)
    target = get_ax(ax)
    sc.pl.embedding(adata, basis=key, color=color, ax=target, show=False, title=title, **kwargs)
    return finish(target, show, save)
