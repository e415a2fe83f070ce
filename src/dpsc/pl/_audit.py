"""Audit plots: ROC curves of membership inference, or claimed ε against a one-run lower bound."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
import numpy as np
from matplotlib.axes import Axes

from ._utils import finish, get_ax, uns_record


def audit(
    adata: ad.AnnData,
    key: str = "audit",
    *,
    ax: Axes | None = None,
    show: bool | None = None,
    save: str | Path | None = None,
) -> Axes | None:
    """Plot what :func:`dpsc.tl.audit` measured.

    After ``method="one_run"``: the claimed ε and the lower bound as bars, with the ceiling (the
    largest bound those canaries could give) as a dashed line; a lower bound above the claim
    is a proven bug. After ``method="shadow"``: the ROC curve of each attack with the chance
    diagonal. The bound implied by the claimed (ε, δ), TPR ≤ e^ε·FPR + δ, is drawn as a dotted line
    when ε is finite: a DP model's curve must stay under it (up to sampling error).

    Parameters
    ----------
    adata
        AnnData passed to :func:`dpsc.tl.audit`.
    key
        The audit's ``key_added`` (reads ``uns["dpsc"][key]``).
    ax, show, save
        scanpy's conventions; the Axes is returned when not shown.
    """
    record = uns_record(adata, key, "dpsc.tl.audit(adata, ...)")
    if "roc" not in record:
        return _one_run(record["table"], ax, show, save)
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


def _one_run(table: dict, ax: Axes | None, show: bool | None, save: str | Path | None) -> Axes | None:
    target = get_ax(ax, figsize=(3.5, 3.5))
    claimed, lower = float(table["epsilon_claimed"][0]), float(table["epsilon_lower"][0])
    ceiling = float(table["ceiling"][0])
    shown = claimed if np.isfinite(claimed) else ceiling * 1.2
    target.bar([0, 1], [shown, lower], color=["C0", "C3" if lower > claimed else "C2"], width=0.6)
    target.axhline(
        ceiling, color="grey", ls="--", lw=0.8, label=f"ceiling ({int(table['n_canaries'][0])} canaries)"
    )
    target.set_xticks([0, 1], ["claimed ε" if np.isfinite(claimed) else "claimed ε = ∞", "lower bound"])
    target.set_ylabel("ε")
    target.set_title(f"One-run audit ({float(table['confidence'][0]):.0%} confidence)", fontsize=9)
    target.legend(fontsize=7, frameon=False)
    return finish(target, show, save)
