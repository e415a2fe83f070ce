"""Cumulative ε of everything dpsc released about the cells of one AnnData."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
import numpy as np
from matplotlib.axes import Axes

from ..privacy import ledger_frame
from ._utils import finish, get_ax

_COLOURS = {"proven": "C0", "heuristic": "C1", "none": "C3"}


def ledger(
    adata: ad.AnnData,
    *,
    ax: Axes | None = None,
    show: bool | None = None,
    save: str | Path | None = None,
) -> Axes | None:
    """Plot the composed ε after each dpsc call on these cells, one bar per call.

    Each bar is the ε that call's own record claims, coloured by its guarantee (proven,
    heuristic, none); the line is the composed total after that call
    (:func:`dpsc.privacy.spent` of the ledger up to it), which is below the plain sum where the
    RDP composition is tighter. A call without a guarantee makes the total infinite, drawn as
    an arrow at the top. The budget, if set, is a dashed line.

    Parameters
    ----------
    adata
        Cells with a ledger (``uns["dpsc"]["ledger"]``).
    ax, show, save
        scanpy's conventions; the Axes is returned when not shown.
    """
    frame = ledger_frame(adata)
    if frame.empty:
        raise ValueError("This AnnData has no ledger entries: no dpsc call has read its cells yet.")
    target = get_ax(ax, figsize=(max(4.5, 0.9 * len(frame) + 2), 3.5))
    x = np.arange(len(frame))
    finite = frame["cumulative_epsilon"].replace(np.inf, np.nan)
    top = float(np.nanmax([*finite.tolist(), *frame["epsilon"].replace(np.inf, np.nan).tolist(), 1.0]))
    heights = frame["epsilon"].replace(np.inf, top * 1.1)
    target.bar(x, heights, color=[_COLOURS[g] for g in frame["guarantee"]], alpha=0.6, width=0.6)
    target.step(x, finite.fillna(top * 1.1), where="mid", color="k", label="composed total")
    for i in np.flatnonzero(~np.isfinite(frame["cumulative_epsilon"])):
        target.annotate("∞", (x[i], top * 1.1), ha="center", va="bottom", color="C3")
    budget = adata.uns.get("dpsc", {}).get("budget")
    if budget is not None:
        target.axhline(float(budget["epsilon"]), color="C3", ls="--", lw=1, label="budget")
    target.set_xticks(x, [f"{t}\n{k}" for t, k in zip(frame["tool"], frame["key"], strict=True)], fontsize=7)
    target.set_ylabel("ε (per cell of this AnnData)")
    target.set_title("privacy ledger: bars = one call (blue proven, orange heuristic, red none)", fontsize=8)
    target.legend(frameon=False, fontsize=7)
    return finish(target, show, save)
