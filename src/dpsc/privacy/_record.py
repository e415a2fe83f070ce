"""The one privacy record every dpsc tool writes, and the statement it prints.

A record says what was released and what that costs: ε, δ, the mechanisms with their
parameters (the Gaussian history ``(σ, q, steps)`` as Opacus keeps it, and the pure-ε
releases), the accountant, whether the guarantee is ``"proven"``, ``"heuristic"`` (with the
reason) or ``"none"``, what is covered, what is not, and where the noise came from. The
statement is built from those fields by :func:`build_statement`, in one place, so the headline
can never claim more than the ``guarantee`` field.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from ._noise import NoiseSource

Guarantee = Literal["proven", "heuristic", "none"]
GUARANTEES = ("proven", "heuristic", "none")

#: The two neighbouring relations of dpsc's proofs: Gaussian releases and DP-SGD are proven for
#: adding or removing one cell; the Laplace estimators with a known number of rows for replacing one.
ADD_REMOVE = "add/remove"
REPLACE_ONE = "replace-one"
RELATIONS = (ADD_REMOVE, REPLACE_ONE)

#: Said of n in every record: it is released exactly, and σ, q, δ and batch sizes depend on it.
N_PUBLIC = (
    "the number of cells, which is treated as public (it is released exactly, and the noise scale, "
    "sampling rate, batch size and δ are functions of it)"
)

#: Caveats every record carries: a cell is the unit, outputs for the training cells are not releases.
COMMON_NOT_COVERED = (
    "outputs written for the training cells themselves (they are computed from those cells), any "
    "gene selection or preprocessing statistics computed on the private cells before dpsc saw them, "
    f"hyper-parameters chosen by looking at these cells, and {N_PUBLIC}. One cell is the unit of "
    "privacy: a person contributing many cells is protected only at group level"
)


#: What a donor-level record does not cover (in place of :data:`COMMON_NOT_COVERED`).
DONOR_NOT_COVERED = (
    "outputs written for the training cells themselves (they are computed from those cells), any "
    "gene selection or preprocessing statistics computed on the private cells before dpsc saw them, "
    "hyper-parameters chosen by looking at these cells, and the number of cells, which is treated as "
    "public (it sets the default δ and the number of genes the PCA reads; the number of donors and "
    "their sizes are never released). One donor with all of their cells is the unit of privacy: a "
    "person who appears under two donor IDs (or at two sites) is protected only at group level, as "
    "two donors"
)


def not_covered_for(individual: str) -> str:
    """Return the caveats every record of this unit carries (``"cell"`` or ``"donor"``)."""
    return DONOR_NOT_COVERED if individual == "donor" else COMMON_NOT_COVERED


#: What a record adds when the cells were a Dask array: who saw what before the noise.
DASK_BOUNDARY = (
    "the Dask workers that computed the releases saw the cells and un-noised partial sums of them, "
    "so the Dask cluster must be inside the data owner's boundary (encrypt its traffic with "
    "distributed.Security)"
)


def with_storage_note(record: PrivacyRecord, dask: bool) -> PrivacyRecord:
    """Return ``record`` with :data:`DASK_BOUNDARY` in what it does not cover, when ``dask``."""
    if not dask or record.guarantee == "none":
        return record
    note = DASK_BOUNDARY
    return replace(
        record,
        not_covered=f"{record.not_covered}; {note}",
        statement=f"{record.statement} Not covered either: {note}.",
    )


def build_statement(
    *,
    guarantee: Guarantee,
    epsilon: float | None,
    delta: float,
    unit: str,
    mechanism: str,
    covered: str,
    not_covered: str,
    reason: str = "",
    noise: str = "",
) -> str:
    """Plain-language paragraph of what an (ε, δ) claim covers and what it does not.

    Parameters
    ----------
    guarantee
        ``"proven"``: every access to the data is a noisy, accounted release; ``"heuristic"``:
        the ε follows a published analysis that is not a proof here (``reason`` says why);
        ``"none"``: no differential privacy.
    epsilon, delta
        The claim (ignored for ``"none"``).
    unit
        The neighbouring relation, e.g. ``"adding or removing one of the 4271 training cells"``.
    mechanism
        How the noise was added.
    covered, not_covered
        What the claim covers, and what it does not.
    reason
        Why a heuristic guarantee is not a proof.
    noise
        Where the noise came from (:meth:`~dpsc.privacy.NoiseSource.describe`).
    """
    if guarantee not in GUARANTEES:
        raise ValueError(f"guarantee must be one of {GUARANTEES}, got {guarantee!r}.")
    if guarantee == "none":
        return (
            f"No differential privacy: {covered or 'the result'} was computed from the data without "
            f"noise and may reveal information about any of them ({unit}). Do not share it outside "
            "the data owner's control."
        )
    claim = f"({epsilon:.3g}, {delta:.1e})" if delta else f"{epsilon:.3g}"
    if guarantee == "heuristic":
        head = (
            f"HEURISTIC {claim}-DP, not a proof: {reason} The ε follows the method's published "
            f"analysis of {mechanism}, with respect to {unit}."
        )
    else:
        head = f"Proven {claim}-differential privacy with respect to {unit}, by {mechanism}."
    parts = [head, f"Covered: {covered}.", f"Not covered: {not_covered}."]
    if noise:
        parts.append(noise)
    return " ".join(parts)


@dataclass
class PrivacyRecord:
    """What one dpsc call spent and what its guarantee covers.

    Attributes
    ----------
    tool
        The dpsc function that made the release (``"fit"``, ``"fit_federated"``, …).
    epsilon
        ε spent (from the accountant after what actually ran); ``None`` for no privacy.
    delta
        δ of the claim (0 for pure ε-DP).
    guarantee
        ``"proven"``, ``"heuristic"`` or ``"none"``.
    statement
        The plain-language paragraph (:func:`build_statement`).
    covered, not_covered, guarantee_reason
        The pieces the statement was built from.
    target_epsilon
        The ε asked for.
    accountant
        Opacus accountant of the Gaussian releases (``"rdp"``/``"prv"``), or ``""``.
    mechanisms
        One line per mechanism with its parameters.
    history
        Gaussian releases as Opacus keeps them: ``[(σ, q, steps), …]``.
    pure_epsilon
        Sum of the ε of the pure ε-DP (Laplace) releases.
    noise_multiplier, sample_rate, steps, max_grad_norm
        The DP-SGD parameters, when there is one DP-SGD run (0 otherwise); ``max_grad_norm`` is
        the per-cell gradient clip norm C.
    sensitivity
        The L2 sensitivity Δ of a sum release's per-cell contribution (the noise is σΔ), for a
        release that is not DP-SGD (0 otherwise).
    scope
        What was privatised (``"encoder"``, ``"full"``, ``"none"``, or the tool's own word).
    noise
        ``{"secret": bool, "noise_seed": int}`` (``-1`` when secret).
    relation
        The neighbouring relation of the proof: ``"add/remove"`` (one individual added or removed)
        or ``"replace-one"`` (one row replaced, the number of rows fixed).
    individual
        What one individual of the relation is: ``"cell"``, or ``"donor"`` (a donor with all of
        their cells, :class:`dpsc.privacy.PrivacyUnit`).
    details
        Tool-specific fields (curves, per-site values, layer budgets…), written flat.
    """

    tool: str
    epsilon: float | None
    delta: float
    guarantee: Guarantee
    statement: str
    covered: str = ""
    not_covered: str = ""
    guarantee_reason: str = ""
    target_epsilon: float | None = None
    accountant: str = ""
    mechanisms: list[str] = field(default_factory=list)
    history: list[tuple[float, float, int]] = field(default_factory=list)
    pure_epsilon: float = 0.0
    noise_multiplier: float = 0.0
    sample_rate: float = 0.0
    steps: int = 0
    max_grad_norm: float = 0.0
    sensitivity: float = 0.0
    scope: str = "none"
    noise: dict[str, Any] = field(default_factory=lambda: {"secret": True, "noise_seed": -1})
    relation: str = ADD_REMOVE
    individual: str = "cell"
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.guarantee not in GUARANTEES:
            raise ValueError(f"guarantee must be one of {GUARANTEES}, got {self.guarantee!r}.")
        if self.relation not in RELATIONS:
            raise ValueError(f"relation must be one of {RELATIONS}, got {self.relation!r}.")

    @property
    def spent(self) -> float:
        """ε for composition: ``inf`` when nothing is guaranteed."""
        if self.guarantee == "none" or self.epsilon is None:
            return math.inf
        return float(self.epsilon)

    @classmethod
    def stated(
        cls,
        tool: str,
        *,
        guarantee: Guarantee,
        epsilon: float | None,
        delta: float,
        unit: str,
        mechanism: str,
        covered: str,
        not_covered: str = "",
        noise: NoiseSource | None = None,
        reason: str = "",
        **fields_: Any,
    ) -> PrivacyRecord:
        """Build a record whose statement comes (:func:`build_statement`) from the same words it stores.

        ``noise`` is where the release's noise came from (its sentence and its dict); ``reason``
        why a heuristic guarantee is not a proof (kept as ``guarantee_reason`` only then).
        """
        statement = build_statement(
            guarantee=guarantee,
            epsilon=epsilon,
            delta=delta,
            unit=unit,
            mechanism=mechanism,
            covered=covered,
            not_covered=not_covered,
            reason=reason,
            noise=noise.describe() if noise is not None and guarantee != "none" else "",
        )
        if noise is not None:
            fields_["noise"] = noise.to_dict()
        return cls(
            tool=tool,
            epsilon=epsilon,
            delta=delta,
            guarantee=guarantee,
            statement=statement,
            covered=covered,
            not_covered=not_covered,
            guarantee_reason=reason if guarantee == "heuristic" else "",
            **fields_,
        )

    @classmethod
    def message(
        cls,
        tool: str,
        history: list[tuple[float, float, int]],
        delta: float,
        *,
        noise: NoiseSource | None = None,
        epsilon: float | None = None,
        accountant: str = "rdp",
        **fields_: Any,
    ) -> PrivacyRecord:
        r"""Record of one message a site sends: its releases' history at its share of δ, proven.

        A site books each message before it leaves; its ledger composes the messages' histories.
        ``epsilon`` is the history's ε at ``delta`` when the caller has it already (else computed by
        ``accountant``); ``fields`` add the record's other fields (``details``).
        """
        from ._accounting import history_epsilon

        history = [(float(s), float(q), int(n)) for s, q, n in history]
        if epsilon is None:
            epsilon = history_epsilon(history, delta, accountant)
        return cls(
            tool=tool,
            epsilon=float(epsilon),
            delta=float(delta),
            guarantee="proven",
            statement="",
            history=history,
            relation=ADD_REMOVE,
            **({} if noise is None else {"noise": noise.to_dict()}),
            **fields_,
        )

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> PrivacyRecord:
        """Rebuild a record from :meth:`to_dict`'s output (unknown keys go to ``details``)."""
        names = {f.name for f in fields(cls)} - {"details"}
        known = {k: v for k, v in record.items() if k in names}
        for key in ("epsilon", "target_epsilon"):
            value = known.get(key)
            if value is not None and not math.isfinite(float(value)):
                known[key] = None
        known["history"] = [
            (float(s), float(q), int(n))
            for s, q, n in np.asarray(known.get("history", []), float).reshape(-1, 3)
        ]
        known["mechanisms"] = list(known.get("mechanisms", []))
        known["relation"] = str(known.get("relation", ADD_REMOVE))
        return cls(**known, details={k: v for k, v in record.items() if k not in names})

    def restate(self, tool: str, *, unit: str, covered: str, not_covered: str) -> PrivacyRecord:
        """Return this record for another tool's context: same mechanisms, new scope and statement.

        Used when a ``tl`` function wraps an estimator: the ε and the noise are the estimator's,
        what is covered (and the unit of privacy) is what the ``tl`` function releases.
        """
        from ._noise import NoiseSource

        statement = build_statement(
            guarantee=self.guarantee,
            epsilon=self.epsilon,
            delta=self.delta,
            unit=unit,
            mechanism=self.mechanisms[0] if self.mechanisms else "",
            covered=covered,
            not_covered=not_covered,
            noise=NoiseSource.from_dict(self.noise).describe() if self.guarantee != "none" else "",
        )
        return replace(self, tool=tool, covered=covered, not_covered=not_covered, statement=statement)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for ``adata.uns`` and ``.h5ad`` (``None`` → ``nan``, details written flat)."""
        out = asdict(self)
        details = out.pop("details")
        for key in ("epsilon", "target_epsilon"):
            if out[key] is None:
                out[key] = float("nan")
        out["history"] = np.asarray(self.history, dtype=float).reshape(-1, 3)
        out["mechanisms"] = list(self.mechanisms)
        return {**details, **out}


#: What a stand-alone estimator's guarantee never covers.
ESTIMATOR_NOT_COVERED = (
    "the number of rows (treated as public: it is released exactly and the noise may depend on it) "
    "and the feature list (treated as public), any scaling or feature map fitted "
    "on the private rows before this estimator saw them, predictions made for the training rows "
    "themselves, and hyper-parameters chosen by looking at these rows"
)


def estimator_record(
    *,
    tool: str,
    epsilon: float | None,
    delta: float,
    n_rows: int,
    mechanism: str,
    covered: str,
    neighbours: str = "replacing",
    noise_seed: int | None = None,
    history: list[tuple[float, float, int]] | None = None,
    accountant: str = "",
    extra_not_covered: str = "",
    details: dict[str, Any] | None = None,
) -> PrivacyRecord:
    """Record of a stand-alone private estimator (pure ε-DP unless a Gaussian ``history`` is given).

    ``neighbours`` is the relation of the proof: ``"replacing"`` (Laplace mechanisms with a known
    number of rows) or ``"adding or removing"`` (DP-SGD with Poisson sampling).
    """
    from ._noise import NoiseSource

    noise = NoiseSource(noise_seed)
    unit = f"{neighbours} one of the {n_rows} private training rows (features and target)"
    private = epsilon is not None and math.isfinite(epsilon)
    not_covered = ESTIMATOR_NOT_COVERED + (f"; {extra_not_covered}" if extra_not_covered else "")
    guarantee: Guarantee = "proven" if private else "none"
    history = list(history or [])
    return PrivacyRecord.stated(
        tool,
        relation=REPLACE_ONE if neighbours == "replacing" else ADD_REMOVE,
        epsilon=float(epsilon) if private else None,
        delta=float(delta) if private else 0.0,
        guarantee=guarantee,
        unit=unit,
        mechanism=mechanism,
        covered=f"{covered} and anything computed from them on other data" if private else covered,
        not_covered=not_covered,
        noise=noise,
        accountant=accountant,
        mechanisms=[mechanism] if mechanism else [],
        history=history,
        pure_epsilon=float(epsilon) if private and not history else 0.0,
        details=details or {},
    )


def no_guarantee_record(tool: str, *, unit: str, covered: str, **fields_: Any) -> PrivacyRecord:
    """Record of a call that read the cells without any differential privacy (ε = ∞ in the ledger)."""
    return PrivacyRecord.stated(
        tool, guarantee="none", epsilon=None, delta=0.0, unit=unit, mechanism="", covered=covered, **fields_
    )
