"""Embedding plot of DP results (thin over scanpy)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anndata as ad
import matplotlib.pyplot as plt
import scanpy as sc
from matplotlib.axes import Axes

from ._utils import finish

#: Cluster columns dpsc writes by default, in the order ``color=None`` looks for them.
DEFAULT_CLUSTER_KEYS = ("dp_cluster", "dp_label")


def private_record(adata: ad.AnnData, color: str) -> dict[str, Any] | None:
    """Return the privacy record of the dpsc result ``color`` names, or ``None`` (labels, genes).

    ``color`` is a result when its own key holds a record (``tl.cluster``'s ``dp_cluster``) or a
    record's parameters name it as their ``cluster_key`` (``tl.fit``'s ``dp_cluster``); a record
    whose labels a later result replaced (``labels_replaced_by``) no longer describes the column.
    """
    results = {
        name: result
        for name, result in adata.uns.get("dpsc", {}).items()
        if isinstance(result, dict) and "privacy" in result and "labels_replaced_by" not in result
    }
    own = results.get(color)
    if own is not None:
        return own["privacy"]
    named = (r for r in results.values() if r.get("params", {}).get("cluster_key") == color)
    return next((r["privacy"] for r in named), None)


def _title(adata: ad.AnnData, color: str | None) -> str:
    """Name the ε and guarantee on a private output only (not on true labels or genes)."""
    record = None if color is None else private_record(adata, color)
    eps = None if record is None else record.get("epsilon")
    if isinstance(eps, float) and eps == eps:
        return f"{color} (ε = {eps:.3g}, {record.get('guarantee')})"
    return "" if color is None else str(color)


def embedding(
    adata: ad.AnnData,
    basis: str = "umap",
    *,
    color: str | Sequence[str] | None = None,
    title: str | Sequence[str] | None = None,
    ax: Axes | None = None,
    show: bool | None = None,
    save: str | Path | None = None,
    **kwargs,
) -> Axes | list[Axes] | None:
    """Scatter of ``adata.obsm[f"X_{basis}"]`` coloured by ``color`` (via :func:`scanpy.pl.embedding`).

    The signature is scanpy's: ``embedding(adata, basis, *, color=...)``.

    Parameters
    ----------
    adata
        Annotated data with the embedding, e.g. after ``sc.pp.neighbors(adata,
        use_rep="X_dpdcan"); sc.tl.umap(adata)``.
    basis
        Embedding name (``"umap"`` reads ``obsm["X_umap"]``); the axes are named as scanpy names
        them (``UMAP1``, ``UMAP2``).
    color
        What :func:`scanpy.pl.embedding` takes: an ``obs`` column or gene, or a list of them (one
        panel each). ``None``: the first of :data:`DEFAULT_CLUSTER_KEYS` in ``obs``.
    title
        Panel title(s); the default names ε and the guarantee on dpsc's private outputs (a result's
        own column, e.g. ``tl.cluster``'s ``dp_cluster``, or the clusters a fit writes) and only the
        column's name on anything else (true labels, genes).
    ax, show, save
        scanpy's conventions; the Axes (a list for several panels) is returned when not shown.
    **kwargs
        Passed to :func:`scanpy.pl.embedding`.
    """
    key = basis if basis.startswith("X_") else f"X_{basis}"
    if key not in adata.obsm and basis in adata.obs:
        raise KeyError(
            f"adata.obsm has no {key!r}; {basis!r} is a column of adata.obs. The second argument is the "
            f"basis, as in sc.pl.embedding: pass dpsc.pl.embedding(adata, 'umap', color={basis!r})."
        )
    if key not in adata.obsm:
        raise KeyError(
            f"adata.obsm has no {key!r}. Compute it first, e.g. sc.pp.neighbors(adata, "
            "use_rep='X_dpdcan'); sc.tl.umap(adata)."
        )
    if color is None:
        color = next((k for k in DEFAULT_CLUSTER_KEYS if k in adata.obs), None)
    colors = [color] if color is None or isinstance(color, str) else list(color)
    if title is None:
        title = [_title(adata, c) for c in colors]
    if len(colors) > 1 and ax is not None:
        raise ValueError(f"{len(colors)} colors make {len(colors)} panels: pass ax=None (one figure).")
    if len(colors) == 1 and ax is None:
        _, ax = plt.subplots(figsize=(4.5, 3.5))
    axes = sc.pl.embedding(
        adata,
        basis=key[2:],  # scanpy names the axes from the basis: UMAP1, UMAP2
        color=colors if len(colors) > 1 else colors[0],
        ax=ax,
        show=False,
        title=title if len(colors) > 1 or isinstance(title, str) else title[0],
        **kwargs,
    )
    if len(colors) == 1:
        return finish(ax, show, save)
    first = axes[0] if isinstance(axes, list) else axes
    finish(first, show, save)
    return None if (show or (show is None and not save)) else axes
