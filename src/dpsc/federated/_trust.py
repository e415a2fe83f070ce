r"""What a site caps by itself: its total budget, and its ε should the other summed sites collude.

**Budget.** A site's ledger file composes every run it served. Its cap is the ``budget`` of its
settings (``--budget``) when given; without it, one run's ``epsilon``, or the budget stored in the
ledger file when that is smaller. Whichever cap a ledger file first gets is stored in it, so a
site restarted without ``--budget`` (and a larger ``--epsilon``) never spends more than it was
allowed before. A given ``budget`` above the stored one raises it only with ``raise_budget``
(``--raise-budget``): raising a privacy cap is an explicit act, lowering it is not.

**Fallback ε.** In secure mode (SecAgg+, threshold t) each site adds the share
:math:`\sigma^2/t` of the noise variance and the central ε holds if at least t of the summed sites
added their share and do not collude with the server. If the other :math:`t - 1` sites are the
server's, the server can subtract their (known) sums and shares and sees this site's sum with the
noise :math:`\sigma/\sqrt t` only: the site's ε is then that of the same releases at noise
multiplier :math:`\sigma/\sqrt t` (:func:`fallback_epsilon`). Every release a site books carries
its noise multiplier at that fallback (``fallback_history``; a plain release's is its own), so the
fallback ε composes over every run of the ledger file (:func:`ledger_fallback_epsilon`), and a
site caps that total with ``max_fallback_epsilon`` (default: twice its ε for one run, twice its
budget in total).

**One run's cap, booking by booking.** Before it serves, a site checks the whole run against
these caps. Each booking is checked again against the same per-run caps, composed over the lines
this run has booked so far (:func:`run_cap_refusal`): a second line of defence that holds even if a
plan check had a hole, since what a run books is what it sent.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..privacy import FileLedger
    from ._settings import SiteSettings

#: Without ``max_fallback_epsilon``, a site accepts a secure run whose fallback ε is at most this
#: multiple of its ``epsilon`` (at ε = 8 that allows a threshold of 3, where the fallback is about 15.7).
DEFAULT_FALLBACK_FACTOR = 2.0


class BudgetSettingError(ValueError):
    """A site's settings would raise the budget stored in its ledger file without saying so."""


def resolve_budget(settings: SiteSettings, ledger: FileLedger) -> float | None:
    """Return the site's cap on its ledger's total ε (module docstring); store a given budget.

    Raises :class:`BudgetSettingError` when ``settings.budget`` is above the stored budget and
    ``settings.raise_budget`` is not set. ``None``: a non-private site (no cap needed).
    """
    stored = ledger.budget()
    stored_eps = None if stored is None else float(stored["epsilon"])
    if settings.budget is not None:
        budget = float(settings.budget)
        if stored_eps is not None and budget > stored_eps * (1 + 1e-12) and not settings.raise_budget:
            raise BudgetSettingError(
                f"This site's ledger file {ledger.path} stores a budget of ε = {stored_eps:g}; "
                f"budget={budget:g} would raise it. Raising a site's privacy cap is an explicit act: pass "
                "raise_budget=True (--raise-budget) if the data owner agrees, or give a budget of at most "
                f"{stored_eps:g}."
            )
        if stored_eps is None or budget != stored_eps:
            ledger.set_budget({"epsilon": budget, "delta": -1.0})
        return budget
    if settings.epsilon is None:
        return stored_eps
    if stored_eps is None:  # the first cap of this ledger file is stored: a restart cannot raise it
        ledger.set_budget({"epsilon": float(settings.epsilon), "delta": -1.0})
        return float(settings.epsilon)
    return min(float(settings.epsilon), stored_eps)


def budget_source(settings: SiteSettings, ledger: FileLedger) -> str:
    """Say where the cap comes from, for refusal messages."""
    if settings.budget is not None:
        return "its budget"
    stored = ledger.budget()
    if stored is not None and settings.epsilon is not None and float(stored["epsilon"]) < settings.epsilon:
        return "the budget stored in its ledger file"
    return "one run's epsilon (no budget was set)"


def fallback_epsilon(history: list[tuple[float, float, int]], delta: float, threshold: int) -> float:
    r"""ε of ``history`` at δ when each σ is divided by :math:`\sqrt t` (module docstring)."""
    from ..privacy import history_epsilon

    if threshold <= 1:
        return history_epsilon(history, delta)
    if any(sigma <= 0 for sigma, _, _ in history):
        return math.inf
    scale = math.sqrt(threshold)
    return history_epsilon([(sigma / scale, q, steps) for sigma, q, steps in history], delta)


def fallback_caps(settings: SiteSettings, budget: float | None) -> tuple[float, float]:
    """Return the largest fallback ε the site accepts for one run, and over its whole ledger.

    ``max_fallback_epsilon`` caps the total (and so each run); without it, twice ``epsilon`` for
    one run and twice the budget (the cap of the ledger's ε) in total.
    """
    if settings.max_fallback_epsilon is not None:
        return float(settings.max_fallback_epsilon), float(settings.max_fallback_epsilon)
    one_run = DEFAULT_FALLBACK_FACTOR * float(settings.epsilon or 0.0)
    return one_run, DEFAULT_FALLBACK_FACTOR * float(budget if budget is not None else settings.epsilon or 0.0)


def fallback_history(sigma: float, threshold: int) -> list[list[float]]:
    r"""Return one release's history at its fallback noise multiplier :math:`\sigma/\sqrt t` (plain: 1)."""
    return [[float(sigma) / math.sqrt(max(int(threshold), 1)), 1.0, 1.0]]


def ledger_fallback_epsilon(
    entries: list[dict], planned: list[tuple[float, float, int]], planned_delta: float, threshold: int
) -> float:
    """Return the fallback ε of every booked release and a planned secure run, composed (Opacus RDP).

    An entry without ``fallback_history`` (booked by another tool, or before dpsc recorded it)
    counts at its own noise multipliers.
    """
    from ..privacy import history_epsilon

    if any(sigma <= 0 for sigma, _, _ in planned):
        return math.inf
    scale = math.sqrt(max(int(threshold), 1))
    history = [(sigma / scale, q, steps) for sigma, q, steps in planned]
    for entry in entries:
        rows = entry.get("fallback_history", entry.get("history", []))
        history += [tuple(float(v) for v in row) for row in rows]
    delta = float(planned_delta) + sum(float(e.get("delta", 0.0)) for e in entries)
    return history_epsilon(history, min(delta, 0.5))


def run_cap_refusal(
    run_lines: list[dict],
    line: dict,
    delta: float,
    epsilon_cap: float | None,
    fallback_cap: float | None = None,
) -> str | None:
    """Return why booking ``line`` would take this run past its own caps (``None``: within them).

    ``run_lines`` are the ledger lines this run has booked. The run's releases so far and ``line``
    are composed at the run's δ (``delta``: the site's own, which a plan's δ never exceeds; Opacus
    RDP), so a run that follows a plan calibrated to (ε, δ) never trips it, and one whose σ are
    too small does at its first booking past the cap: ``epsilon_cap`` the site's ε for one run
    (``None``: no cap), ``fallback_cap`` its fallback ε for one run in secure mode (``None``: plain).
    """
    from ..privacy import history_epsilon

    lines = [*run_lines, line]
    caps = (("history", epsilon_cap, "epsilon", "--epsilon, or epsilon in its settings file"),)
    if fallback_cap is not None:
        caps += (("fallback_history", fallback_cap, "fallback epsilon", "--max-fallback-epsilon"),)
    for field, cap, words, flag in caps:
        if cap is None:
            continue
        history = [tuple(float(v) for v in row) for entry in lines for row in entry[field]]
        spent = history_epsilon(history, delta) if all(h[0] > 0 for h in history) else math.inf
        if not spent <= float(cap) * (1 + 1e-6):
            return (
                f"this run's {words} would be {spent:.3g} with it, above the {float(cap):.3g} this site "
                f"allows for one run ({flag})"
            )
    return None
