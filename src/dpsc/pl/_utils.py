"""Shared plumbing of the plotting functions (scanpy's show/save/ax convention)."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
import matplotlib.pyplot as plt
from matplotlib.axes import Axes


def get_ax(ax: Axes | None, figsize: tuple[float, float] = (4.5, 3.5)) -> Axes:
    """Return the Axes to draw on: ``ax`` or a new figure's."""
    if ax is not None:
        return ax
    _, new_ax = plt.subplots(figsize=figsize)
    return new_ax


def uns_record(adata: ad.AnnData, key: str, producer: str) -> dict:
    """Return ``adata.uns["dpsc"][key]``, or raise a KeyError naming the call that writes it."""
    record = adata.uns.get("dpsc", {}).get(key)
    if record is None:
        raise KeyError(f"adata.uns['dpsc'][{key!r}] is missing; run {producer} first.")
    return record


def finish(ax: Axes, show: bool | None, save: str | Path | None) -> Axes | None:
    """Save and/or show the figure; return the Axes unless it was shown."""
    if save:
        ax.figure.savefig(save, bbox_inches="tight", dpi=150)
    if show is None:
        show = not save
    if show:
        plt.show()
        return None
    return ax
