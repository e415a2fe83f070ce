"""ROC curves of a membership-inference audit."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
import numpy as np
from matplotlib.axes import Axes

from ._utils import finish, get_ax, uns_record


def audit(
    adata: ad.AnnData,
    *,
    ax: Axes | None = None,
    show: bool | None = None,
    save: str | Path | None = None,
) -> Axes | None:
    """Plot the ROC curve of each attack of :func:`dpsc.tl.audit`, with the chance diagonal.

    The bound implied by the claimed (ε, δ), TPR ≤ e^ε·FPR + δ, is drawn as a dotted line
    when ε is finite: a DP model's curve must stay under it (up to sampling error).

    Parameters
    ----------
    adata
        AnnData passed to :func:`dpsc.tl.audit` (reads ``uns["dpsc"]["audit"]``).
    ax, show, save
        scanpy's conventions; the Axes is returned when not shown.
    """
    record = uns_record(adata, "audit", "dpsc.tl.audit(adata, ...)")
    target = get_ax(ax, figsize=(4.0, 4.0))
    table = record["table"]
    for i, (name, roc) in enumerate(record["roc"].items()):
        auc = table["auc"][list(table["attack"]).index(name)]
        target.plot(roc["fpr"], roc["tpr"], color=f"C{i}", label=f"{name} attack (AUC {auc:.3f})")
    target.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--", label="chance")
    eps = record["claimed_epsilon"]
    if eps != "inf":
        fpr = np.linspace(0, 1, 200)
        bound = np.minimum(1.0, np.exp(float(eps)) * fpr + float(record["delta"]))
        target.plot(fpr, bound, color="C3", lw=0.8, ls=":", label=f"(ε={float(eps):.2g}, δ) limit")
        title = f"Membership inference, ε = {float(eps):.2g}"
    else:
        title = "Membership inference, non-private"
    target.set_xlabel("false positive rate")
    target.set_ylabel("true positive rate")
    target.set_title(title)
    target.legend(fontsize=7, loc="lower right")
    return finish(target, show, save)
