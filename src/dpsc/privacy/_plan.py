r"""A privacy plan is data: the ordered releases of a call, calibrated once, spent through one context.

Every dpsc call that reads cells makes a fixed sequence of releases, each a (sub)sampled Gaussian
mechanism: a sum over cells (or over a Poisson sample of them, rate :math:`q`) of per-cell
contributions bounded by the release's sensitivity, with noise :math:`\mathcal N(0, \sigma^2\Delta^2)`,
repeated ``steps`` times. A :class:`ReleasePlan` lists them in order (name, share of ε, q, steps).

- :meth:`ReleasePlan.calibrate` is the one place where an (ε, δ) becomes noise multipliers: one
  release is calibrated alone (``calibrate_noise_multiplier``); several share
  (ε, δ) by their shares (``split_budget``: each calibrated once, then one
  common scale so that their composition in one accountant spends at most ε at δ). Without ε
  every σ is 0 (no noise, no guarantee).
- ``calibrate(…, keep=…)`` leaves out a release the call turns out not to need (decided from
  public sizes and a :meth:`ReleasePlan.nominal_sigma`): its share goes to the others, and its σ
  is never searched.
- :meth:`ReleasePlan.with_sigmas` makes a plan whose σ are given (a σ the caller states, or a
  plan a federated site received and checks): no calibration, the history says what it costs.
- :meth:`ReleasePlan.record` writes the call's record from the plan: its ε is the composition of
  the plan's history at δ, the history and σ are the plan's, and the words (what a cell is, the
  mechanism, what is covered) are the tool's. Without noise it is a record with no guarantee.
- :meth:`ReleasePlan.spend` books the call's record in the cells' ledger before anything is
  released (``spending``) and hands out each release's noise stream by its name;
  a name the plan does not hold is refused. It is the one door to the ledger outside
  :mod:`dpsc.privacy`: every call that reads cells books through its plan.
- Two more kinds of release complete the plan, so that every call has one:
  :meth:`ReleasePlan.stated` holds a release whose mechanism accounts for itself, with its (ε, δ)
  as stated: a pure ε-DP release (Laplace, the functional mechanism; δ = 0), a classifier's own
  DP-SGD, an audited fit at group size 2 (its record settles the booking), and
  :meth:`ReleasePlan.reading` a reading of the cells with no noise and no guarantee (a
  non-private baseline, an audit's report, the query cells of a label transfer).

The privacy argument lives with each mechanism; the plan only composes: the history
``[(σ, q, steps), …]`` is what the accountant composes, so the plan's :meth:`spent` is the ε of
the whole call at δ.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._engine import DPSGDSettings
    from ._ledger import Spending
    from ._noise import NoiseSource
    from ._random import SecureRandom
    from ._record import PrivacyRecord


@dataclass(frozen=True)
class PlannedRelease:
    """One release of a plan: its name (also its noise stream's), share of ε, rate, steps and σ."""

    name: str
    share: float = 1.0
    sample_rate: float = 1.0
    steps: int = 1
    sigma: float | None = None  # None until calibrated; 0.0 without noise
    stated: tuple[float, float] | None = None  # (ε, δ) of a release that accounts for itself

    def history(self) -> tuple[float, float, int]:
        """Return ``(σ, q, steps)``, what an accountant composes for this release."""
        if self.stated is not None:
            raise ValueError(f"Release {self.name!r} states its (ε, δ); it has no (σ, q, steps) history.")
        if self.sigma is None:
            raise ValueError(f"Release {self.name!r} is not calibrated; call ReleasePlan.calibrate first.")
        return (float(self.sigma), float(self.sample_rate), int(self.steps))


@dataclass(frozen=True)
class ReleasePlan:
    """The ordered releases of one call and, once calibrated, their noise (module docstring)."""

    releases: tuple[PlannedRelease, ...]
    epsilon: float | None = None
    delta: float | None = None
    accountant: str = "rdp"

    @classmethod
    def of(
        cls,
        *releases: PlannedRelease,
        accountant: str = "rdp",
        epsilon: float | None = None,
        delta: float | None = None,
    ) -> ReleasePlan:
        """Return a plan of these releases, in this order (names must differ).

        Uncalibrated unless every release states its σ; ``epsilon`` and ``delta`` are then the
        target the σ were calibrated for (a plan rebuilt from its σ, e.g. one a site received).
        """
        names = [r.name for r in releases]
        if not releases or len(set(names)) != len(names):
            raise ValueError(f"A plan needs at least one release and distinct names, got {names}.")
        return cls(tuple(releases), epsilon=epsilon, delta=delta, accountant=accountant)

    @classmethod
    def stated(cls, name: str, epsilon: float, delta: float = 0.0) -> ReleasePlan:
        r"""Return the plan of one release ``name`` whose mechanism accounts for itself, at (ε, δ).

        ``delta=0``: a pure ε-DP release. Stated releases compose with the others by basic
        composition (Dwork & Roth 2014, Thm 3.16): :meth:`spent` adds their ε,
        :math:`\sum_i \varepsilon_i`, to the accountant's ε of the Gaussian releases.
        """
        if not float(epsilon) > 0 or not 0 <= float(delta) < 1:
            raise ValueError(
                f"A stated release needs epsilon > 0 and delta in [0, 1), got ({epsilon}, {delta})."
            )
        release = PlannedRelease(name, stated=(float(epsilon), float(delta)))
        return cls((release,), epsilon=float(epsilon), delta=float(delta))

    def reservation(
        self, tool: str, relation: str | None = None, *, cap: float | None = None
    ) -> PrivacyRecord:
        """Return what a plan books before its mechanism runs: its (ε, δ), proven.

        The mechanism's own record settles the booking afterwards. A stated plan books its stated
        (ε, δ); a Gaussian plan whose σ were fixed by the caller books what its planned steps
        compose to at its δ (with that history), at most ``cap`` when the mechanism stops itself
        there. ``relation``: the proof's neighbouring relation (add/remove by default; replace-one
        for a fixed number of rows).
        """
        from ._record import ADD_REMOVE, PrivacyRecord

        stated = [r.stated is not None for r in self.releases]
        spent = self.spent()
        if (any(stated) and not all(stated)) or spent is None:
            raise ValueError(
                "Only a stated plan, or a Gaussian one with every σ set, is booked as a reservation; "
                "a reading without noise writes its record."
            )
        if all(stated):
            delta, history = sum(r.stated[1] for r in self.releases), []
        else:
            delta, history = float(self.delta), self.history()
        epsilon = float(spent) if cap is None else min(float(spent), float(cap))
        return PrivacyRecord(
            tool=tool,
            epsilon=epsilon,
            delta=delta,
            guarantee="proven",
            statement="",
            history=history,
            pure_epsilon=epsilon if delta == 0 and not history else 0.0,
            relation=relation or ADD_REMOVE,
        )

    @classmethod
    def reading(cls, name: str) -> ReleasePlan:
        """Return the plan of one reading of the cells without noise: no guarantee (ε = ∞)."""
        return cls((PlannedRelease(name, sigma=0.0),))

    # -- calibration: the only caller of the σ search -----------------------------------------------
    def calibrate(
        self, epsilon: float | None, delta: float, keep: tuple[str, ...] | None = None
    ) -> ReleasePlan:
        """Return the plan with every σ set so that the whole plan spends at most (ε, δ).

        ``keep``: the releases that run, when some of the plan's do not; the others leave the plan
        unsearched and their shares go to the kept ones (:func:`~dpsc.privacy.split_budget`).
        """
        from ._accounting import calibrate_noise_multiplier, split_budget

        if any(r.stated is not None for r in self.releases):
            raise ValueError("A plan with a stated release has its ε; only Gaussian plans are calibrated.")
        if keep is not None:
            unknown = set(keep) - {r.name for r in self.releases}
            if unknown or not keep:
                raise KeyError(
                    f"keep names releases of the plan, {[r.name for r in self.releases]}; got {keep}."
                )
        if epsilon is None:
            sigmas = {r.name: 0.0 for r in self.releases}
        elif len(self.releases) == 1:
            (only,) = self.releases
            sigma = calibrate_noise_multiplier(
                float(epsilon), delta, only.sample_rate, only.steps, self.accountant
            )
            sigmas = {only.name: sigma}
        else:
            split = split_budget(float(epsilon), delta, self._parts, self.accountant, keep=keep)
            sigmas = {name: sigma for name, (_, sigma) in split.items()}
        kept = (
            self
            if keep is None
            else replace(self, releases=tuple(r for r in self.releases if r.name in keep))
        )
        return kept._set(sigmas, epsilon, delta)

    def nominal_sigma(self, name: str, epsilon: float, delta: float) -> float:
        """Return release ``name``'s σ at its nominal share alone, an upper bound of its calibrated σ.

        One σ search (:func:`~dpsc.privacy.nominal_sigma`); what a plan reads to decide, before the
        other σ are searched, which releases run (``calibrate(…, keep=…)``).
        """
        from ._accounting import nominal_sigma

        self[name]  # a name the plan does not hold is refused with its releases
        return nominal_sigma(epsilon, delta, self._parts, name, self.accountant)

    @property
    def _parts(self) -> dict[str, tuple[float, float, int]]:
        return {r.name: (r.share, r.sample_rate, r.steps) for r in self.releases}

    def with_sigmas(self, delta: float | None = None, **sigmas: float) -> ReleasePlan:
        """Return the plan with the given σ (every release named once; no calibration)."""
        missing = {r.name for r in self.releases} - set(sigmas)
        if missing or set(sigmas) - {r.name for r in self.releases}:
            raise ValueError(f"with_sigmas needs exactly the plan's releases; missing {sorted(missing)}.")
        return self._set(sigmas, None, delta)

    def at_least(self, **sigmas: float) -> ReleasePlan:
        """Return the calibrated plan with each named release's σ raised to at least the one given.

        More noise only: the plan still spends at most its target (ε, δ), which it keeps.
        """
        raised = {r.name: max(r.history()[0], float(sigmas.get(r.name, 0.0))) for r in self.releases}
        return self._set(raised, self.epsilon, self.delta)

    def part(self, *names: str) -> ReleasePlan:
        """Return the releases named, in plan order, with their σ and the whole plan's target (ε, δ)."""
        missing = set(names) - {r.name for r in self.releases}
        if missing or not names:
            raise KeyError(
                f"part names releases of the plan, {[r.name for r in self.releases]}; got {names}."
            )
        return replace(self, releases=tuple(r for r in self.releases if r.name in names))

    def _set(self, sigmas: dict[str, float], epsilon: float | None, delta: float | None) -> ReleasePlan:
        releases = tuple(replace(r, sigma=float(sigmas[r.name])) for r in self.releases)
        return replace(self, releases=releases, epsilon=epsilon, delta=delta)

    # -- reading the plan -----------------------------------------------------------------------------
    def __getitem__(self, name: str) -> PlannedRelease:
        for release in self.releases:
            if release.name == name:
                return release
        raise KeyError(f"Release {name!r} is not in this plan; it holds {[r.name for r in self.releases]}.")

    def __contains__(self, name: object) -> bool:
        return any(r.name == name for r in self.releases)

    def sigma(self, name: str) -> float:
        """Return the calibrated σ of one release."""
        return self[name].history()[0]

    @property
    def sigmas(self) -> dict[str, float]:
        """Every Gaussian release's σ by name, in plan order."""
        return {r.name: r.history()[0] for r in self.releases if r.stated is None}

    def history(self) -> list[tuple[float, float, int]]:
        """Return ``[(σ, q, steps), …]`` of the Gaussian releases in plan order (the accountant's)."""
        return [r.history() for r in self.releases if r.stated is None]

    def spent(self, delta: float | None = None) -> float | None:
        """Return the composed ε of the whole plan at δ (``None`` without noise).

        Gaussian releases compose in the plan's accountant at δ; stated ones add their ε.
        """
        return self._composed(self.history(), self.delta if delta is None else delta)

    def _composed(self, history: list[tuple[float, float, int]], delta: float) -> float | None:
        """ε of the Gaussian releases ``history`` at δ plus the stated releases' ε (``None``: no noise)."""
        from ._accounting import history_epsilon

        if any(sigma == 0 for sigma, _, _ in history):
            return None
        stated = sum(r.stated[0] for r in self.releases if r.stated is not None)
        if not history:
            return float(stated)
        return stated + history_epsilon(history, delta, self.accountant)

    def record(
        self,
        tool: str,
        *,
        unit: str,
        mechanism: str,
        covered: str,
        not_covered: str = "",
        noise: NoiseSource | None = None,
        history: list[tuple[float, float, int]] | None = None,
        guarantee: str = "proven",
        reason: str = "",
        **fields: Any,
    ) -> PrivacyRecord:
        r"""Return the call's record: ε composed from the plan's history at δ, in the tool's words.

        The history :math:`[(\sigma, q, T), \dots]`, the steps, the target ε, the accountant and
        each release's σ (``mechanisms``, ``details["noise_multipliers"]``) come from the plan; the
        tool states what one cell is (``unit``), the mechanism, what the ε covers and what it does
        not. ``history``: the releases that did run, when a call stops before its plan's last step
        (an accountant's history; its ε is what the record states). ``guarantee`` is
        ``"heuristic"`` (with its ``reason``) for a mechanism the composition does not prove.
        ``fields`` add to or replace the record's other fields. A plan with a release without noise
        (σ = 0: no ε was asked) writes a record with no guarantee (ε = ∞ in the ledger).
        """
        from ._accounting import history_epsilon
        from ._record import PrivacyRecord, no_guarantee_record

        planned = self.history()
        if any(sigma == 0 for sigma, _, _ in planned):  # a release without noise: no ε was asked
            return no_guarantee_record(tool, unit=unit, covered=covered)
        if history is None:  # ε composed once, from the one history the record states
            history, spent = planned, self._composed(planned, float(self.delta))
        else:
            history = [(float(s), float(q), int(n)) for s, q, n in history]
            spent = history_epsilon(history, float(self.delta), self.accountant)
        stated: dict[str, Any] = {
            "target_epsilon": None if self.epsilon is None else float(self.epsilon),
            "accountant": self.accountant,
            "mechanisms": [
                f"{r.name}: sigma={r.sigma:.4g}"
                if r.stated is None
                else f"{r.name}: stated epsilon={r.stated[0]:.4g}"
                for r in self.releases
            ],
            "history": history,
            "steps": int(sum(steps for _, _, steps in history)),
            "details": {"noise_multipliers": self.sigmas},
        }
        return PrivacyRecord.stated(
            tool,
            guarantee=guarantee,
            epsilon=spent,
            delta=float(self.delta),
            unit=unit,
            mechanism=mechanism,
            covered=covered,
            not_covered=not_covered,
            noise=noise,
            reason=reason,
            **{**stated, **fields},
        )

    def dpsgd_settings(
        self, name: str, *, n_obs: int, max_grad_norm: float, noise: NoiseSource | None = None
    ) -> DPSGDSettings:
        """Return the DP-SGD settings of a sampled release of this plan (its σ and q; no calibration)."""
        from ._engine import DPSGDSettings

        release = self[name]
        return DPSGDSettings.from_sigma(
            n_obs=n_obs,
            sample_rate=release.sample_rate,
            noise_multiplier=release.history()[0],
            max_grad_norm=max_grad_norm,
            accountant=self.accountant,
            noise=noise,
        )

    # -- spending ------------------------------------------------------------------------------------
    @contextmanager
    def spend(
        self, target: Any, record: PrivacyRecord, key: str, noise: NoiseSource | None = None
    ) -> Iterator[PlanSpending]:
        """Book ``record`` in ``target``'s ledger first, then hand out the plan's noise streams.

        ``target`` is the AnnData whose cells are read. The booking is settled by the caller
        (the result's store); if the body raises first, the reservation stays booked
        (what was released before the error is not known). ``noise=None``: the plan's mechanism
        draws its noise itself (a stated release's estimator or classifier) or adds none.
        """
        from ._ledger import spending

        with spending(target, record, key) as booking:
            yield PlanSpending(self, noise, booking)


class PlanSettings:
    """Base of a method's settings kept beside its one :class:`ReleasePlan` (an attribute ``releases``).

    The target (ε, δ) and the accountant are read from the plan, never stored twice: a
    clustering's or a fit's settings are what the plan does not hold (genes, k, epochs, …).
    """

    releases: ReleasePlan

    @property
    def epsilon(self) -> float | None:
        """The target ε the plan's σ were calibrated for (``None``: no noise, no guarantee)."""
        return self.releases.epsilon

    @property
    def delta(self) -> float:
        """The plan's δ."""
        return float(self.releases.delta)

    @property
    def accountant(self) -> str:
        """The accountant that composes the plan's releases."""
        return self.releases.accountant


@dataclass
class PlanSpending:
    """The releases of a plan being spent: each release's noise stream, by the plan's names only."""

    plan: ReleasePlan
    noise: NoiseSource | None
    booking: Spending

    def stream(self, name: str, *index: int) -> SecureRandom:
        """Return the secure noise stream of release ``name`` (refused when the plan lacks it)."""
        if name not in self.plan:
            raise KeyError(f"Release {name!r} is not in the plan; nothing was released.")
        if self.noise is None:
            raise ValueError(f"This plan was spent without a NoiseSource; release {name!r} draws its own.")
        return self.noise.stream(name, *index)


def gaussian_release_record(
    tool: str,
    *,
    sigma: float,
    target_epsilon: float | None,
    delta: float,
    unit: str,
    mechanism: str,
    covered: str,
    not_covered: str,
    noise: NoiseSource,
    scope: str,
    sample_rate: float = 1.0,
    steps: int = 1,
    max_grad_norm: float = 0.0,
    sensitivity: float = 0.0,
    accountant_name: str = "rdp",
) -> PrivacyRecord:
    """Proven record of ``steps`` Gaussian releases (σ, q): the record of their one-release plan.

    The ε is the plan's (:meth:`ReleasePlan.record`: the named Opacus accountant composes
    the history ``[(σ, q, steps)]`` at δ); the fields say σ, q, steps and, for DP-SGD, the clip
    norm ``max_grad_norm``, for a sum, its ``sensitivity``.
    """
    release = PlannedRelease(tool, sample_rate=sample_rate, steps=steps, sigma=sigma)
    plan = ReleasePlan.of(release, accountant=accountant_name, epsilon=target_epsilon, delta=delta)
    return plan.record(
        tool,
        unit=unit,
        mechanism=mechanism,
        covered=covered,
        not_covered=not_covered,
        noise=noise,
        target_epsilon=None if target_epsilon is None else float(target_epsilon),
        mechanisms=[f"Gaussian, sigma={sigma:.4g} x sensitivity, q={sample_rate:g}, {steps} release(s)"],
        noise_multiplier=sigma,
        sample_rate=sample_rate,
        max_grad_norm=max_grad_norm,
        sensitivity=sensitivity,
        scope=scope,
        details={},
    )
