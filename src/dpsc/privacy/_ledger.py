r"""One privacy ledger per AnnData: everything dpsc released about these cells, composed.

Every dpsc call that reads the cells of an AnnData appends an entry to
``adata.uns["dpsc"]["ledger"]`` (tool, result key, guarantee, ε, δ, the Gaussian history and the
pure-ε releases, time). :func:`spent` composes all entries into the (ε, δ) that holds for
*each cell of this AnnData* against everything dpsc has released about it:

* Gaussian releases (DP-SGD steps, DP k-means and frequency releases, with their
  :math:`(\sigma, q, T)` histories) are composed together in one Opacus RDP accountant
  (Mironov 2017, Prop. 1: RDP adds up order by order) and converted at
  :math:`\delta = \sum_j \delta_j`; where the plain sum :math:`\sum_j \varepsilon_j` at the same δ
  (basic composition, Dwork & Roth 2014, Thm 3.16) is smaller, that is used; the result is never
  below the largest entry (raising an ε keeps it valid);
* pure ε-DP releases (Laplace) add their ε (basic composition);
* a call that read the cells without a guarantee (a non-private fit) makes the total ``inf``.

The ledger is plain ``uns`` content, so it survives ``write_h5ad``/``read_h5ad``, and a subset or
a copy of the cells keeps it (they are the same people). Entries made under a heuristic
guarantee are counted like the others and flagged in :func:`ledger_frame`.

A budget (:func:`set_budget`) makes every dpsc call check its planned spend first and refuse
with :class:`BudgetExceededError` before any work, leaving the AnnData unchanged.
"""

from __future__ import annotations

import math
import time
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

from ._accounting import make_accountant
from ._record import PrivacyRecord

LEDGER_KEY = "ledger"
BUDGET_KEY = "budget"


class BudgetExceededError(ValueError):
    """A dpsc call would take this AnnData's privacy spend past its budget."""


def _dpsc_uns(adata: ad.AnnData) -> dict[str, Any]:
    return adata.uns.setdefault("dpsc", {})


def _entries(adata: ad.AnnData) -> list[dict[str, Any]]:
    ledger = adata.uns.get("dpsc", {}).get(LEDGER_KEY, {})
    return [ledger[k] for k in sorted(ledger)]


def ledger_entry(record: PrivacyRecord, key: str) -> dict[str, Any]:
    """Return the ledger entry of one record (what composition needs, plus what a reader needs)."""
    return {
        "tool": record.tool,
        "key": key,
        "guarantee": record.guarantee,
        "epsilon": record.spent,
        "delta": float(record.delta),
        "history": np.asarray(record.history, dtype=float).reshape(-1, 3),
        "pure_epsilon": float(record.pure_epsilon),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def compose(entries: list[dict[str, Any]]) -> tuple[float, float]:
    """(ε, δ) of a list of ledger entries (module docstring)."""
    if not entries:
        return 0.0, 0.0
    if any(not math.isfinite(float(e["epsilon"])) for e in entries):
        return math.inf, float(sum(e["delta"] for e in entries))
    gaussian = [e for e in entries if np.asarray(e["history"]).size]
    pure = float(sum(e["pure_epsilon"] for e in entries))
    delta = float(sum(e["delta"] for e in gaussian))
    eps_gauss = 0.0
    if gaussian:
        plain = float(sum(e["epsilon"] - e["pure_epsilon"] for e in gaussian))
        accountant = make_accountant("rdp")
        accountant.history = [
            (float(s), float(q), int(n))
            for e in gaussian
            for s, q, n in np.asarray(e["history"]).reshape(-1, 3)
        ]
        eps_gauss = min(float(accountant.get_epsilon(delta=delta)), plain)
    total = eps_gauss + pure
    return max(total, max(float(e["epsilon"]) for e in entries)), delta


def spent(adata: ad.AnnData) -> tuple[float, float]:
    """(ε, δ) that holds for each cell of ``adata`` against everything dpsc released about it.

    Composed from ``adata.uns["dpsc"]["ledger"]`` as tightly as the maintained accountants allow
    (module docstring); ``(0.0, 0.0)`` for an AnnData dpsc never read, ``inf`` once a call read
    the cells without a guarantee.
    """
    return compose(_entries(adata))


def set_budget(adata: ad.AnnData, epsilon: float, delta: float | None = None) -> None:
    """Cap what dpsc may spend on these cells; later calls that would exceed it are refused.

    Parameters
    ----------
    adata
        The cells.
    epsilon
        Largest total ε (as :func:`spent` composes it).
    delta
        Largest total δ; ``None`` leaves δ uncapped.
    """
    if not epsilon > 0:
        raise ValueError(f"The budget's epsilon must be > 0, got {epsilon}.")
    if delta is not None and not 0 <= delta < 1:
        raise ValueError(f"The budget's delta must be in [0, 1), got {delta}.")
    _dpsc_uns(adata)[BUDGET_KEY] = {
        "epsilon": float(epsilon),
        "delta": -1.0 if delta is None else float(delta),
    }


def check_budget(adata: ad.AnnData, planned: PrivacyRecord, key: str) -> None:
    """Refuse (before any work) a call whose planned record would exceed the budget."""
    budget = adata.uns.get("dpsc", {}).get(BUDGET_KEY)
    if budget is None:
        return
    before, _ = spent(adata)
    after, delta_after = compose([*_entries(adata), ledger_entry(planned, key)])
    cap_eps, cap_delta = float(budget["epsilon"]), float(budget["delta"])
    over_delta = cap_delta >= 0 and delta_after > cap_delta * (1 + 1e-9)
    if after > cap_eps * (1 + 1e-9) or over_delta:
        raise BudgetExceededError(
            f"Privacy budget exceeded: these cells have spent ε = {before:.3g}; this "
            f"{planned.tool} call asks for ε = {planned.spent:.3g} (δ = {planned.delta:.1e}), which "
            f"would make ε = {after:.3g} (δ = {delta_after:.1e}) against a budget of ε = {cap_eps:.3g}"
            + (f", δ = {cap_delta:.1e}" if cap_delta >= 0 else "")
            + f"; ε left: {max(cap_eps - before, 0.0):.3g}. Ask for less (a smaller epsilon), or raise "
            "the budget with dpsc.privacy.set_budget if the data owner agrees. Nothing was changed."
        )


def append(adata: ad.AnnData, record: PrivacyRecord, key: str) -> None:
    """Add the entry of ``record`` (made under result key ``key``) to the ledger."""
    ledger = _dpsc_uns(adata).setdefault(LEDGER_KEY, {})
    ledger[f"{len(ledger):04d}"] = ledger_entry(record, key)


def ledger_frame(adata: ad.AnnData) -> pd.DataFrame:
    """Return the ledger as a table, with the cumulative composed ε after each entry."""
    entries = _entries(adata)
    rows = []
    for i, e in enumerate(entries):
        history = np.asarray(e["history"]).reshape(-1, 3)
        rows.append(
            {
                "tool": e["tool"],
                "key": e["key"],
                "guarantee": e["guarantee"],
                "epsilon": float(e["epsilon"]),
                "delta": float(e["delta"]),
                "gaussian_steps": int(history[:, 2].sum()),
                "pure_epsilon": float(e["pure_epsilon"]),
                "cumulative_epsilon": compose(entries[: i + 1])[0],
                "time": e["time"],
            }
        )
    return pd.DataFrame(rows)


def write_result(
    adata: ad.AnnData, key: str, record: PrivacyRecord, params: dict[str, Any] | None = None, **extra: Any
) -> None:
    """Write a result's record (and parameters) under its own key and append it to the ledger.

    ``adata.uns["dpsc"][key]`` gets ``{"privacy": record, "params": params, **extra}``, so a
    second call with another key never overwrites the first's record.
    """
    entry: dict[str, Any] = {"privacy": record.to_dict(), **extra}
    if params is not None:
        entry["params"] = {k: ("None" if v is None else v) for k, v in params.items()}
    _dpsc_uns(adata)[key] = entry
    append(adata, record, key)


def get_record(adata: ad.AnnData, key: str) -> dict[str, Any]:
    """Return the privacy record of the result written under ``key``."""
    try:
        return adata.uns["dpsc"][key]["privacy"]
    except KeyError:
        known = [k for k, v in adata.uns.get("dpsc", {}).items() if isinstance(v, dict) and "privacy" in v]
        raise KeyError(
            f"No dpsc result under key {key!r} (results with a privacy record: {known or 'none'}); "
            "run dpsc.tl.fit (or the tool that writes that key) first."
        ) from None
