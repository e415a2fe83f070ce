"""Training curve of a federated fit."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
import numpy as np
from matplotlib.axes import Axes

from ._utils import finish, get_ax, uns_record


def federated(
    adata: ad.AnnData,
    key: str = "X_fedsc",
    *,
    ax: Axes | None = None,
    show: bool | None = None,
    save: str | Path | None = None,
) -> Axes | None:
    """Plot the sites' mean local loss per round (weighted by cells) of :func:`dpsc.tl.fit_federated`.

    Parameters
    ----------
    adata
        AnnData passed to :func:`dpsc.tl.fit_federated`.
    key
        The fit's ``key_added`` (reads ``uns["dpsc"][key]``).
    ax, show, save
        scanpy's conventions; the Axes is returned when not shown.
    """
    record = uns_record(adata, key, "dpsc.tl.fit_federated")
    loss = np.asarray(record["loss"], dtype=float)
    target = get_ax(ax)
    target.plot(np.arange(1, len(loss) + 1), loss, marker="o", ms=3)
    target.set_xlabel("round")
    target.set_ylabel("mean local loss (last local epoch)")
    target.set_title(f"{record['method']}, {len(record['sites'])} sites")
    return finish(target, show, save)
