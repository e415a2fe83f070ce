r"""One privacy ledger per set of cells: everything dpsc released about them, composed.

Every dpsc call that reads the cells of an AnnData goes through :func:`spending`: it checks the
call's *planned* record against the budget before any work, books it as a reservation, and
replaces the reservation by the record of what was actually released when the call ends (a call
that fails half-way keeps its reservation: what it released is not known, so the planned spend
stays booked). The ledger lives in ``adata.uns["dpsc"]["ledger"]``, and, after
:func:`attach_ledger`, in a JSON file beside the data that every copy of the AnnData, and every
process, reads and writes under a file lock with atomic replacement (:class:`FileLedger`; a
federated site keeps its ledger the same way).

:func:`spent` composes the entries into the (ε, δ) that holds for *each cell* against everything
dpsc released about it:

* entries under the add/remove relation: the Gaussian releases (DP-SGD steps, DP k-means, PCA
  and gene statistics, with their :math:`(\sigma, q, T)` histories) are composed in one Opacus RDP
  accountant (Mironov 2017, Prop. 1) and converted at the sum of their δ; where the plain sum
  :math:`\sum_j \varepsilon_j` at the same δ is smaller (basic composition, Dwork & Roth 2014,
  Thm 3.16), that is used; entries without a Gaussian history (pure ε, or an (ε, δ) claim such as
  a group-privacy bound) add their ε and δ;
* entries under the replace-one relation (the Laplace estimators) add their ε;
* when both relations occur, the add/remove total :math:`(\varepsilon, \delta)` is converted to
  replace-one as :math:`(2\varepsilon, (1 + e^{\varepsilon})\delta)` (replacing a cell is removing
  it, then adding another: two steps of group privacy, Dwork & Roth 2014, §2.3) before the
  replace-one entries are added; the result is stated under replace-one;
* a call that read the cells without a guarantee makes the total ``inf``.

The result is never below the largest entry. :func:`spent` returns a :class:`Spent`, which
unpacks as ``(epsilon, delta)`` and also says the relation, the weakest guarantee among the
entries and whether any entry used seeded (non-secret) noise.

**What the ledger is, and is not.** It is bookkeeping that dpsc keeps honestly for the calls that
go through it; it does not stop code outside dpsc from reading the cells, and an AnnData ledger
travels with the object: two independent copies of the cells each start from the same ledger,
and ``anndata.concat`` drops ``uns`` (use :func:`concat`, which composes or refuses). A ledger
file (:func:`attach_ledger`) is shared by every copy that points to it and by concurrent
processes.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import math
import os
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

from ._record import ADD_REMOVE, REPLACE_ONE, PrivacyRecord
from ._unit import check_unit, unit_of

LEDGER_KEY = "ledger"
BUDGET_KEY = "budget"
FILE_KEY = "ledger_file"


class BudgetExceededError(ValueError):
    """A dpsc call would take these cells' privacy spend past their budget."""


class Spent(tuple):
    """``(epsilon, delta)`` of a ledger, with ``relation``, ``guarantee``, ``seeded`` and ``unit``.

    ``unit``: what one individual of the ε is, ``"cell"`` or ``"donor"`` (:class:`~dpsc.privacy.PrivacyUnit`).
    """

    relation: str
    guarantee: str
    seeded: bool
    unit: str

    def __new__(
        cls, epsilon: float, delta: float, relation: str, guarantee: str, seeded: bool, unit: str = "cell"
    ) -> Spent:
        out = super().__new__(cls, (float(epsilon), float(delta)))
        out.relation, out.guarantee, out.seeded, out.unit = relation, guarantee, bool(seeded), unit
        return out

    @property
    def epsilon(self) -> float:
        """Composed ε."""
        return self[0]

    @property
    def delta(self) -> float:
        """Composed δ."""
        return self[1]


# -- entries and composition -----------------------------------------------------------------
def ledger_entry(record: PrivacyRecord, key: str, status: str = "released") -> dict[str, Any]:
    """Return the ledger entry of one record (what composition needs, plus what a reader needs)."""
    return {
        "tool": record.tool,
        "key": key,
        "guarantee": record.guarantee,
        "relation": record.relation,
        "unit": record.individual,
        "epsilon": record.spent,
        "delta": float(record.delta),
        "history": np.asarray(record.history, dtype=float).reshape(-1, 3),
        "pure_epsilon": float(record.pure_epsilon),
        "seeded": not bool(record.noise.get("secret", True)),
        "status": status,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _compose_one_relation(entries: list[dict[str, Any]]) -> tuple[float, float]:
    from ._accounting import history_epsilon

    gaussian = [e for e in entries if np.asarray(e["history"]).size]
    other = [e for e in entries if not np.asarray(e["history"]).size]
    delta_gauss = float(sum(float(e["delta"]) for e in gaussian))
    eps_gauss = 0.0
    if gaussian:
        plain = float(sum(float(e["epsilon"]) - float(e["pure_epsilon"]) for e in gaussian))
        history = [tuple(h) for e in gaussian for h in np.asarray(e["history"], float).reshape(-1, 3)]
        eps_gauss = min(history_epsilon(history, delta_gauss), plain)
        eps_gauss += float(sum(float(e["pure_epsilon"]) for e in gaussian))
    # pure-ε and other (ε, δ) entries: basic composition
    eps_other = float(sum(float(e["epsilon"]) for e in other))
    delta = delta_gauss + float(sum(float(e["delta"]) for e in other))
    return max(eps_gauss + eps_other, max(float(e["epsilon"]) for e in entries)), delta


def compose(entries: list[dict[str, Any]]) -> Spent:
    """Composed :class:`Spent` of a list of ledger entries (module docstring)."""
    if not entries:
        return Spent(0.0, 0.0, ADD_REMOVE, "none", False)
    units = {unit_of(e) for e in entries}
    if len(units) > 1:
        raise ValueError(
            "This ledger mixes entries per cell and per donor, which do not compose into one ε; "
            "keep each unit's releases on their own copy of the cells."
        )
    unit = units.pop()
    guarantees = {str(e["guarantee"]) for e in entries}
    weakest = next(g for g in ("none", "heuristic", "proven") if g in guarantees)
    seeded = any(bool(e.get("seeded", False)) for e in entries)
    relations = {str(e.get("relation", ADD_REMOVE)) for e in entries}
    relation = REPLACE_ONE if REPLACE_ONE in relations else ADD_REMOVE
    total_delta = float(sum(float(e["delta"]) for e in entries))
    if any(not math.isfinite(float(e["epsilon"])) for e in entries):
        return Spent(math.inf, total_delta, relation, weakest, seeded, unit)
    by_relation = {r: [e for e in entries if str(e.get("relation", ADD_REMOVE)) == r] for r in relations}
    if len(relations) == 1:
        eps, delta = _compose_one_relation(entries)
        return Spent(eps, delta, relation, weakest, seeded, unit)
    eps_a, delta_a = _compose_one_relation(by_relation[ADD_REMOVE])
    eps_r, delta_r = _compose_one_relation(by_relation[REPLACE_ONE])
    eps = 2.0 * eps_a + eps_r
    delta = (1.0 + math.exp(min(eps_a, 700.0))) * delta_a + delta_r
    return Spent(eps, delta, REPLACE_ONE, weakest, seeded, unit)


# -- where entries live ------------------------------------------------------------------------
class FileLedger:
    """A ledger in a JSON file: read and written under an exclusive lock, replaced atomically.

    The file holds ``{"budget": {...} | null, "entries": {id: entry}}``. Every change is a
    read-modify-write of the whole file under ``fcntl.flock`` on ``<path>.lock``, written to a
    temporary file in the same directory, flushed to disk and renamed over the old one
    (``os.replace`` is atomic on POSIX), so a crash leaves either the old ledger or the new one.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{self.path}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = self._read()
                before = json.dumps(state, sort_keys=True)
                yield state
                if json.dumps(state, sort_keys=True) != before:
                    self._write(state)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"budget": None, "entries": {}}
        try:
            state = json.loads(self.path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(
                f"The privacy ledger {self.path} is not valid JSON ({err}); restore it from a backup. "
                "dpsc refuses to spend from a ledger it cannot read."
            ) from None
        state.setdefault("budget", None)
        state.setdefault("entries", {})
        return state

    def _write(self, state: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(state, handle, indent=1, default=_json_default)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def entries(self) -> list[dict[str, Any]]:
        """Return the entries, in the order they were made."""
        state = self._read()
        return [state["entries"][k] for k in sorted(state["entries"])]

    def budget(self) -> dict[str, float] | None:
        """``{"epsilon": ..., "delta": ...}`` or ``None``."""
        return self._read()["budget"]

    def set_budget(self, budget: dict[str, float]) -> None:
        """Store the budget."""
        with self._locked() as state:
            state["budget"] = budget

    def reserve(
        self, entry: dict[str, Any], cap: dict[str, float] | None = None, pending_delta: float = 0.0
    ) -> str:
        """Check ``entry`` against the budget (and ``cap``, if given), book it atomically; return its id.

        ``pending_delta``: the δ that the rest of the run ``entry`` belongs to will book (a site books a
        run release by release, each with its share of the run's δ). The budget is checked at the δ
        the ledger will hold once the run is whole, so a partial run is judged as the run it is part
        of (at a smaller δ the same releases compose to a larger ε); ``entry`` is booked with its own δ.
        """
        checked = {**entry, "delta": float(entry["delta"]) + max(float(pending_delta), 0.0)}
        with self._locked() as state:
            entries = [state["entries"][k] for k in sorted(state["entries"])]
            check_within_budget(entries, checked, state["budget"])
            check_within_budget(entries, checked, cap)
            key = _next_key(state["entries"])
            state["entries"][key] = plain_entry(entry)
        return key

    def count(self) -> int:
        """Return number of entries."""
        return len(self._read()["entries"])

    def cancel(self, key: str) -> None:
        """Remove the reservation ``key`` (a call that failed before it released anything)."""
        with self._locked() as state:
            state["entries"].pop(key, None)

    def settle(self, key: str, entry: dict[str, Any]) -> None:
        """Replace the reservation ``key`` by the entry of what was released."""
        with self._locked() as state:
            state["entries"][key] = plain_entry(entry)


class MemoryLedger(FileLedger):
    """A ledger held in memory: the same checks and bookings as :class:`FileLedger`, nothing on disk.

    For a site simulated inside one process for one run (``dpsc.tl.cluster_federated``): the run's
    record is booked in the user's own AnnData ledger first, so a ledger that outlives the run
    would hold a second copy of it. ``path`` is ``None``.
    """

    def __init__(self) -> None:
        self.path = None
        self._state: dict[str, Any] = {"budget": None, "entries": {}}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        with self._lock:
            yield self._state

    def _read(self) -> dict[str, Any]:
        return self._state

    def adopt(self, entries: list[dict[str, Any]]) -> None:
        """Add entries booked (and checked) by another copy of this ledger, each once.

        A simulated site's messages may be answered by several worker processes, each with its own
        copy of the site's ledger; the run's bookings travel with the run's state, and each copy
        adopts those it lacks before it checks anything. No budget check: each was checked where
        it was booked, and refusing one here would hide it.
        """
        with self._locked() as state:
            known = {json.dumps(e, sort_keys=True) for e in state["entries"].values()}
            for entry in entries:
                plain = plain_entry(entry)
                if json.dumps(plain, sort_keys=True) not in known:
                    state["entries"][f"{len(state['entries']):04d}"] = plain
                    known.add(json.dumps(plain, sort_keys=True))


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"Cannot write {type(value).__name__} to a ledger file.")


def plain_entry(entry: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(entry, default=_json_default))


def _next_key(entries: dict[str, Any]) -> str:
    """Return the key after the largest of ``entries`` (a cancelled reservation leaves a gap)."""
    numbers = [int(k) for k in entries if str(k).isdigit()]
    return f"{(max(numbers) + 1 if numbers else 0):04d}"


def _dpsc_uns(adata: ad.AnnData) -> dict[str, Any]:
    return adata.uns.setdefault("dpsc", {})


def _file(adata: ad.AnnData) -> FileLedger | None:
    path = adata.uns.get("dpsc", {}).get(FILE_KEY)
    return FileLedger(path) if path else None


def _uns_entries(adata: ad.AnnData) -> list[dict[str, Any]]:
    ledger = adata.uns.get("dpsc", {}).get(LEDGER_KEY, {})
    return [ledger[k] for k in sorted(ledger)]


def _entries(adata: ad.AnnData) -> list[dict[str, Any]]:
    file = _file(adata)
    return file.entries() if file is not None else _uns_entries(adata)


def _budget(adata: ad.AnnData) -> dict[str, float] | None:
    file = _file(adata)
    if file is not None and file.budget() is not None:
        return file.budget()
    return adata.uns.get("dpsc", {}).get(BUDGET_KEY)


def check_within_budget(
    entries: list[dict[str, Any]], planned: dict[str, Any], budget: dict[str, float] | None
) -> None:
    if budget is None:
        return
    before = compose(entries)
    after = compose([*entries, planned])
    cap_eps, cap_delta = float(budget["epsilon"]), float(budget["delta"])
    over_delta = cap_delta >= 0 and after.delta > cap_delta * (1 + 1e-9)
    if after.epsilon > cap_eps * (1 + 1e-9) or over_delta:
        raise BudgetExceededError(
            f"Privacy budget exceeded: these cells have spent ε = {before.epsilon:.3g}; this "
            f"{planned['tool']} call asks for ε = {float(planned['epsilon']):.3g} (δ = "
            f"{float(planned['delta']):.1e}), which would make ε = {after.epsilon:.3g} (δ = "
            f"{after.delta:.1e}, {after.relation}) against a budget of ε = {cap_eps:.3g}"
            + (f", δ = {cap_delta:.1e}" if cap_delta >= 0 else "")
            + f"; ε left: {max(cap_eps - before.epsilon, 0.0):.3g}. Ask for less (a smaller epsilon), "
            "or raise the budget with dpsc.privacy.set_budget if the data owner agrees. Nothing was "
            "changed."
        )


# -- the public API ------------------------------------------------------------------------------
def spent(adata: ad.AnnData) -> Spent:
    """(ε, δ) that holds for each cell of ``adata`` against everything dpsc released about it.

    Composed from the ledger (module docstring); ``(0.0, 0.0)`` for an AnnData dpsc never read,
    ``inf`` once a call read the cells without a guarantee. The composition is at the entries'
    summed δ, so a further call can lower the ε shown while δ grows (the same releases at a larger
    δ cost a smaller ε): read the two together. The result also carries
    ``.relation``, ``.guarantee`` (the weakest among the entries: ``"none"``, ``"heuristic"`` or
    ``"proven"``), ``.seeded`` (some entry used a known noise seed) and ``.unit`` (what one
    individual is: ``"cell"``, or ``"donor"`` for a ledger of donor-level calls).
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
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float) or not epsilon > 0:
        raise ValueError(f"The budget's epsilon must be a number > 0, got {epsilon!r}.")
    if delta is not None and not 0 <= delta < 1:
        raise ValueError(f"The budget's delta must be in [0, 1), got {delta}.")
    budget = {"epsilon": float(epsilon), "delta": -1.0 if delta is None else float(delta)}
    _dpsc_uns(adata)[BUDGET_KEY] = budget
    file = _file(adata)
    if file is not None:
        file.set_budget(budget)


def attach_ledger(adata: ad.AnnData, path: str | os.PathLike) -> None:
    """Keep this AnnData's ledger in the file ``path`` (created if missing), beside the data.

    The file then holds the entries and the budget for every copy of the AnnData that points to
    it and for concurrent processes (reads and writes are locked and atomic). Entries already in
    ``uns`` are added to a new file; an existing file's entries are kept and become this
    AnnData's ledger.
    """
    file = FileLedger(path)
    existing = file.entries()
    if not existing:
        for entry in _uns_entries(adata):
            file.reserve({**entry, "status": entry.get("status", "released")})
        budget = adata.uns.get("dpsc", {}).get(BUDGET_KEY)
        if budget is not None:
            file.set_budget(dict(budget))
    _dpsc_uns(adata)[FILE_KEY] = str(Path(path).resolve())
    _sync_uns(adata)


def _sync_uns(adata: ad.AnnData) -> None:
    """Mirror a file ledger into ``uns`` (so that a written ``.h5ad`` carries it too)."""
    file = _file(adata)
    if file is None:
        return
    _dpsc_uns(adata)[LEDGER_KEY] = {f"{i:04d}": _from_plain(e) for i, e in enumerate(file.entries())}
    if file.budget() is not None:
        _dpsc_uns(adata)[BUDGET_KEY] = dict(file.budget())


def _from_plain(entry: dict[str, Any]) -> dict[str, Any]:
    return {**entry, "history": np.asarray(entry.get("history", []), dtype=float).reshape(-1, 3)}


def check_budget(adata: ad.AnnData, planned: PrivacyRecord, key: str) -> None:
    """Refuse (before any work) a call whose planned record would exceed the budget."""
    check_within_budget(_entries(adata), ledger_entry(planned, key, "planned"), _budget(adata))


class Spending:
    """The booking of one call: made by :func:`spending`; :meth:`settle` records what was released."""

    def __init__(self, adata: ad.AnnData, key: str, entry_id: str) -> None:
        self.adata, self.key, self.entry_id = adata, key, entry_id
        self.settled = False

    def settle(self, record: PrivacyRecord, *copies: ad.AnnData) -> None:
        """Replace the reservation by ``record``'s entry, here and in ``copies`` (a ``copy=True`` result)."""
        entry = ledger_entry(record, self.key)
        file = _file(self.adata)
        if file is not None:
            file.settle(self.entry_id, entry)
        for target in (self.adata, *copies):
            ledger = _dpsc_uns(target).setdefault(LEDGER_KEY, {})
            ledger[self.entry_id] = entry
        self.settled = True


def _outside_dpsc() -> int:
    """Return the ``stacklevel`` of the first frame outside dpsc and contextlib: the user's call."""
    package = str(Path(__file__).resolve().parent.parent)
    frame, level = sys._getframe(1), 1
    while frame is not None and (
        frame.f_code.co_filename.startswith(package) or frame.f_code.co_filename == contextlib.__file__
    ):
        frame, level = frame.f_back, level + 1
    return level


@contextlib.contextmanager
def spending(adata: ad.AnnData, planned: PrivacyRecord, key: str) -> Iterator[Spending]:
    """Check the budget, reserve the planned spend, run the call, settle what it released.

    Use it around all the work of a call that reads the cells, after its input checks::

        with spending(adata, planned_record, key) as booking:
            ...  # read the cells, release
            booking.settle(actual_record)

    Refuses with :class:`BudgetExceededError` before anything is written. If the body raises
    before :meth:`Spending.settle`: a call that drew no noise and no sample yet (no keystream was
    read, ``draws``) released nothing, so its reservation is removed and
    ``adata.uns`` is put back as it was; otherwise the reservation stays (marked
    ``"interrupted"``): what the call released before failing is not known, so the planned spend
    stays booked.
    """
    from ._random import draws

    earlier = adata.uns.get("dpsc", {}).get(key)
    if isinstance(earlier, dict) and "privacy" in earlier:
        warnings.warn(
            f"A result is already stored under key {key!r}; this call replaces it (the ledger keeps what "
            "both spent). Pass another key_added to keep both.",
            UserWarning,
            stacklevel=_outside_dpsc(),
        )
    entry = ledger_entry(planned, key, "reserved")
    check_unit(_entries(adata), entry["unit"], planned.tool)
    uns_before = {k: adata.uns[k] for k in adata.uns.keys()}
    dpsc_before = copy.deepcopy(adata.uns.get("dpsc")) if "dpsc" in adata.uns else None
    drawn = draws()
    file = _file(adata)
    if file is not None:
        entry_id = file.reserve(entry)
        _sync_uns(adata)
    else:
        check_within_budget(_uns_entries(adata), entry, _budget(adata))
        ledger = _dpsc_uns(adata).setdefault(LEDGER_KEY, {})
        entry_id = _next_key(ledger)
        ledger[entry_id] = entry
    booking = Spending(adata, key, entry_id)
    try:
        yield booking
    finally:
        if not booking.settled and draws() == drawn:  # nothing released: nothing booked
            if file is not None:
                file.cancel(entry_id)
            for name in [k for k in adata.uns.keys() if k not in uns_before]:
                del adata.uns[name]
            if dpsc_before is None:
                adata.uns.pop("dpsc", None)
            else:
                adata.uns["dpsc"] = dpsc_before
        elif not booking.settled:
            interrupted = {**entry, "status": "interrupted"}
            if file is not None:
                file.settle(entry_id, interrupted)
            _dpsc_uns(adata)[LEDGER_KEY][entry_id] = interrupted


def book(adata: ad.AnnData, record: PrivacyRecord, key: str) -> None:
    """Check, reserve and settle ``record`` at once: for a release whose record is final before it runs."""
    with spending(adata, record, key) as booking:
        booking.settle(record)


def ledger_frame(adata: ad.AnnData) -> pd.DataFrame:
    """Return the ledger as a table, with the cumulative composed ε after each entry."""
    entries = _entries(adata)
    rows = []
    for i, e in enumerate(entries):
        history = np.asarray(e["history"], dtype=float).reshape(-1, 3)
        rows.append(
            {
                "tool": e["tool"],
                "key": e["key"],
                "guarantee": e["guarantee"],
                "relation": e.get("relation", ADD_REMOVE),
                "unit": unit_of(e),
                "epsilon": float(e["epsilon"]),
                "delta": float(e["delta"]),
                "gaussian_steps": int(history[:, 2].sum()),
                "pure_epsilon": float(e["pure_epsilon"]),
                "seeded": bool(e.get("seeded", False)),
                "status": e.get("status", "released"),
                "cumulative_epsilon": compose(entries[: i + 1]).epsilon,
                "time": e["time"],
            }
        )
    return pd.DataFrame(rows)


def write_record(
    adata: ad.AnnData, key: str, record: PrivacyRecord, params: dict[str, Any] | None = None, **extra: Any
) -> None:
    """Write a result's record (and parameters) under its own key, without touching the ledger.

    ``adata.uns["dpsc"][key]`` gets ``{"privacy": record, "params": params, **extra}``, so a second
    call with another key never overwrites the first's record.
    """
    entry: dict[str, Any] = {"privacy": record.to_dict(), **{k: _h5ad_safe(v) for k, v in extra.items()}}
    if params is not None:
        entry["params"] = {k: _h5ad_safe(v) for k, v in params.items()}
    _dpsc_uns(adata)[key] = entry


def _h5ad_safe(value: Any) -> Any:
    """Return a value ``write_h5ad`` can store: tuples become lists, lists of dicts a dict of columns."""
    if value is None:
        return "None"
    if isinstance(value, tuple | list) and value and all(isinstance(v, dict) for v in value):
        keys = list(value[0])  # a table given as rows: stored as columns
        return {str(k): _h5ad_safe([row.get(k) for row in value]) for k in keys}
    if isinstance(value, tuple | list):
        return [_h5ad_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _h5ad_safe(v) for k, v in value.items()}
    return value


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


def concat(adatas: list[ad.AnnData], *, disjoint: bool, **kwargs: Any) -> ad.AnnData:
    """``anndata.concat`` that keeps the privacy ledgers (``anndata.concat`` alone drops ``uns``).

    Parameters
    ----------
    adatas
        The AnnData objects, along the cells axis.
    disjoint
        ``True``: the objects hold different cells (different people), so each cell of the result
        is covered by its own object's ledger: the result's ledger is the one of the part that
        spent most (parallel composition, McSherry 2009), and its budget the smallest. ``False``:
        the cells may overlap, so the result carries every entry of every part (sequential
        composition).
    **kwargs
        Passed to :func:`anndata.concat`.
    """
    if any(_file(a) is not None for a in adatas):
        raise ValueError(
            "concat does not merge ledger files; detach them (or keep the parts separate) and "
            "combine the files by hand, so that no spend is lost."
        )
    out = ad.concat(adatas, **kwargs)
    if disjoint:
        worst = max(adatas, key=lambda a: spent(a).epsilon)
        entries = _uns_entries(worst)
    else:
        entries = [e for a in adatas for e in _uns_entries(a)]
    _dpsc_uns(out)[LEDGER_KEY] = {f"{i:04d}": e for i, e in enumerate(entries)}
    budgets = [a.uns["dpsc"][BUDGET_KEY] for a in adatas if BUDGET_KEY in a.uns.get("dpsc", {})]
    if budgets:
        _dpsc_uns(out)[BUDGET_KEY] = min(budgets, key=lambda b: float(b["epsilon"]))
    return out
