"""ε spent against training step."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
from matplotlib.axes import Axes

from ..privacy import get_record
from ._utils import finish, get_ax


def privacy(
    adata: ad.AnnData,
    key: str = "X_dpdcan",
    *,
    ax: Axes | None = None,
    show: bool | None = None,
    save: str | Path | None = None,
) -> Axes | None:
    """Plot ε spent after each step (exact accountant values) with the target as a line.

    Parameters
    ----------
    adata
        AnnData fitted with :func:`dpsc.tl.fit`.
    key
        The fit's ``key_added`` (reads ``uns["dpsc"][key]["privacy"]``).
    ax, show, save
        scanpy's conventions; the Axes is returned when not shown.
    """
    record = get_record(adata, key)
    steps, eps = list(record.get("curve_steps", [])), list(record.get("curve_epsilon", []))
    if not steps:
        raise ValueError("This fit was not private (epsilon=None): there is no ε curve to plot.")
    target = get_ax(ax)
    target.plot(steps, eps, color="C0", label=f"spent ({record['accountant'].upper()})")
    target.axhline(record["target_epsilon"], color="C3", ls="--", lw=1, label="target ε")
    target.set_xlabel("sampled-Gaussian steps (DP-SGD, k-means, frequency and label-count releases)")
    target.set_ylabel(f"ε at δ = {record['delta']:.0e}")
    target.set_title(
        f"{record['guarantee']}, scope = {record['scope']}, "
        f"σ = {record['noise_multiplier']:.3g}, q = {record['sample_rate']:.3g}"
    )
    target.legend(frameon=False)
    return finish(target, show, save)
