"""The one guard of a federated site: its ledger, its budget and its caps, for every federated task.

A site's privacy is its own (its :class:`SiteSettings`), whatever the task. :class:`SiteGuard`
holds what every task's site enforces the same way before anything leaves it, and the clustering's
site (:class:`~dpsc.federated.Site`) and FedSC's are both one:

* its ledger (a file beside the data, or, for cells a simulation shares in memory, one kept per
  run in this process, which adopts the run's lines that other worker processes booked);
* its budget (one run's ε unless the settings or the ledger file set one), checked before a run
  starts (:meth:`SiteGuard.check_run_budget`) and, atomically, at every booking;
* each booking (:meth:`SiteGuard.book_line`): the run's lines with the new one composed at the site's
  δ must stay within the site's ε for one run (in secure mode also its fallback cap for one run)
  whatever a plan said, then the ledger's total within its budget; a release is booked before it
  is sent, and a refusal sends nothing;
* the words of a refusal and of what the ledger has spent, in the data manager's terms.

Every check reads the message, the settings and the ledger, never a cell.
"""

from __future__ import annotations

from typing import Any

from ..privacy import (
    BudgetExceededError,
    FileLedger,
    MemoryLedger,
    NoiseSource,
    check_within_budget,
    compose,
    plain_entry,
)
from ._settings import SiteSettings
from ._simulation import is_shared
from ._trust import budget_source, resolve_budget, run_cap_refusal


class SiteRefusal(ValueError):
    """A site refuses a request: the message says why; nothing was sent or booked."""


#: Simulated sites' ledgers in this process, by the Ray reference of their cells (unique per run).
_MEMORY_LEDGERS: dict[str, MemoryLedger] = {}


def data_identity(value: Any) -> str:
    """Name a site's in-memory cells by the object they are (a Ray reference by its id)."""
    if is_shared(value):
        return f"ray:{value.hex()}"
    return f"{type(value).__name__}@{id(value)}"


def ledger_for(settings: SiteSettings) -> FileLedger:
    """Return the site's ledger: its file, or (cells in memory, no file named) one kept in memory.

    A simulated site's messages may each build a new site object in the same worker process, so
    the ledger of cells shared through Ray is kept by their reference (unique for the run); cells
    held directly get a ledger of their own (an object id can be reused once the object is gone).
    Several worker processes may answer one site's messages: the run's bookings also travel with
    the run's state, and each worker's copy adopts them (:meth:`SiteGuard.adopt`).
    """
    if settings.ledger is not None:
        return FileLedger(settings.ledger)
    if not is_shared(settings.data):
        return MemoryLedger()
    return _MEMORY_LEDGERS.setdefault(data_identity(settings.data), MemoryLedger())


class SiteGuard:
    """A site's ledger, budget and caps (module docstring); every federated task's site is one.

    ``delta`` is the site's δ for one run, set by the task once it knows its number of cells
    (the settings' δ, or :func:`~dpsc._validation.resolve_delta` of them).
    """

    delta: float

    def __init__(self, settings: SiteSettings) -> None:
        self.settings = settings
        self.ledger = ledger_for(settings)
        self.budget = resolve_budget(settings, self.ledger)  # before reading a cell: fails fast
        self.noise = NoiseSource(settings.noise_seed)

    @property
    def private(self) -> bool:
        """Whether this site only serves private runs (it has an ε)."""
        return self.settings.epsilon is not None

    @property
    def cap(self) -> dict[str, float] | None:
        """The ledger's cap: the budget's ε (any δ), or ``None`` without a budget."""
        return None if self.budget is None else {"epsilon": float(self.budget), "delta": -1.0}

    def adopt(self, run_lines: list[dict[str, Any]]) -> None:
        """Take this run's lines booked by other worker processes into an in-memory ledger."""
        if run_lines and isinstance(self.ledger, MemoryLedger):
            self.ledger.adopt(run_lines)

    def check_run_budget(self, planned: dict[str, Any], what: str = "run") -> None:
        """Refuse a run whose planned ledger line would take the ledger past its budget."""
        try:
            check_within_budget(self.ledger.entries(), planned, self.cap)
        except BudgetExceededError:
            raise SiteRefusal(self.budget_message(float(planned["epsilon"]), what)) from None

    def book_line(
        self,
        line: dict[str, Any],
        run_lines: list[dict[str, Any]],
        run_delta: float,
        what: str,
        fallback_cap: float | None = None,
    ) -> None:
        """Book ``line`` before its release is sent: within the run's own caps, then the budget.

        ``run_lines``: this run's lines so far; with ``line``, composed at the site's δ, they must
        stay within the site's ε for one run (and ``fallback_cap`` in secure mode), whatever a plan
        said (:func:`~._trust.run_cap_refusal`). Then the ledger reserves the line atomically
        within its budget, checked at the δ the whole run (``run_delta``) will have booked.
        """
        over = run_cap_refusal(run_lines, plain_entry(line), self.delta, self.settings.epsilon, fallback_cap)
        if over is not None:
            raise SiteRefusal(f"This site refuses {what}: {over}. Nothing was sent.")
        pending = run_delta - sum(float(entry["delta"]) for entry in [*run_lines, line])
        try:
            self.ledger.reserve(line, cap=self.cap, pending_delta=pending)
        except BudgetExceededError:
            raise SiteRefusal(self.budget_message(float(line["epsilon"]), "release")) from None

    def spent_words(self) -> str:
        """Say what this site's ledger has spent and what its budget leaves, in ε."""
        spent = compose(self.ledger.entries()).epsilon
        if self.budget is None:
            return f"This site's ledger has spent epsilon {spent:.3g} (no budget)."
        return (
            f"This site's ledger has spent epsilon {spent:.3g} of its {self.budget:.3g}; "
            f"{max(self.budget - spent, 0.0):.3g} left."
        )

    def budget_message(self, asked: float, what: str) -> str:
        """Word a budget refusal in the data manager's terms: spent, asked, cap and its source."""
        before = compose(self.ledger.entries()).epsilon
        left = max(self.budget - before, 0.0)
        where = self.settings.ledger or "in memory"
        return (
            f"This site's budget refuses the {what}: its ledger ({where}) has spent "
            f"epsilon {before:.3g}, the {what} asks for {asked:.3g}, and the cap is {self.budget:.3g} "
            f"({budget_source(self.settings, self.ledger)}); epsilon left: {left:.3g}. "
            "Nothing was sent. Ask the server for a smaller epsilon, or raise the site's budget (budget in "
            "its settings file, --budget with --raise-budget on the command line) if its data owner agrees. "
            "A new study or a trial run starts from a new ledger file (ledger in the settings file, --ledger "
            "on the command line); the old one keeps what was spent."
        )
