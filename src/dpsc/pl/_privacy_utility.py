"""A metric against ε from a table of fits (the privacy–utility trade-off)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.ticker import NullFormatter

from ._utils import finish, get_ax


def privacy_utility(
    results: pd.DataFrame,
    *,
    x: str = "epsilon",
    y: str = "ari",
    hue: str | None = "config",
    ax: Axes | None = None,
    show: bool | None = None,
    save: str | Path | None = None,
) -> Axes | None:
    """Plot ``y`` (mean ± sd over repeated rows) against ε, one line per ``hue`` group.

    Rows whose ``x`` is missing or infinite are non-private fits; each such group is drawn as a
    dashed horizontal line (mean) so that the cost of privacy reads off directly. The x axis is
    logarithmic.

    Parameters
    ----------
    results
        One row per fit, e.g. the benchmark's JSON lines or a table you build in a loop.
    x, y, hue
        Columns holding ε, the metric, and the group (``None``: one group).
    ax, show, save
        scanpy's conventions; the Axes is returned when not shown.
    """
    missing = [c for c in (x, y, hue) if c is not None and c not in results.columns]
    if missing:
        raise KeyError(f"results lacks column(s) {missing}; it has {list(results.columns)}.")
    df = results.copy()
    df[x] = pd.to_numeric(df[x], errors="coerce")
    groups = df.groupby(hue, sort=False) if hue is not None else [(y, df)]
    target = get_ax(ax, figsize=(5.0, 3.5))
    for i, (name, group) in enumerate(groups):
        color = f"C{i % 10}"
        private = group[np.isfinite(group[x])]
        public = group[~np.isfinite(group[x])]
        if len(private):
            stats = private.groupby(x)[y].agg(["mean", "std"]).reset_index().sort_values(x)
            target.errorbar(
                stats[x],
                stats["mean"],
                yerr=stats["std"].fillna(0),
                marker="o",
                ms=4,
                capsize=3,
                color=color,
                label=str(name),
            )
        if len(public):
            target.axhline(public[y].mean(), color=color, ls="--", lw=1, label=f"{name} (non-private)")
    target.set_xscale("log")
    asked = np.unique(df[x][np.isfinite(df[x])])  # one plain label per asked ε, no log-scale minor labels
    target.set_xticks(asked, [f"{value:g}" for value in asked])
    target.xaxis.set_minor_formatter(NullFormatter())
    target.set_xlabel("ε")
    target.set_ylabel(y.upper() if len(y) <= 4 else y)
    target.legend(fontsize=7, frameon=False)
    return finish(target, show, save)
