r"""The unit of privacy: what one "individual" is, a cell or a donor with all of their cells.

Every (ε, δ) dpsc states is with respect to adding or removing one individual. By default that is
one cell. A patient gives hundreds to thousands of cells, and by group privacy a per-cell ε says
nothing useful about whether a patient took part. With ``donor_key`` (an ``obs`` column naming
each cell's donor) the individual is **one donor with all of their cells**.

**How a release protects a donor.** Every proven release of dpsc is a sum over cells of per-cell
contributions :math:`c_i` of L2 norm at most Δ, plus Gaussian noise of scale σΔ. At the donor
level each cell's contribution is weighted by :math:`w_i = 1/m_d`, with :math:`m_d` the number of
cells of its donor :math:`d` (:func:`donor_weights`), so that a donor's weights add up to 1. The
donor's whole contribution to the sum is then
:math:`\lVert\sum_{i \in d} w_i c_i\rVert \le \sum_{i\in d} w_i \lVert c_i\rVert \le \Delta`
(triangle inequality): adding or removing the donor moves the sum by at most Δ, the bound the
noise is calibrated to. Each weight depends on its own donor's cells only, so the other donors'
terms do not change. The same σ, the same accountant and the same ε then hold per donor.

The number of donors and each donor's number of cells are never released exactly: a donor's
size only sets its own weights, and the weighted count of cells (the number of donors) is
released only with noise where a release sums it. What it costs: the sums now carry about as
much signal as there are donors, not cells, so a donor-level release on D donors is about as
noisy as a cell-level release on D cells (:func:`regime_message` says so before any spend).

**One unit per ledger.** The first call that books on an AnnData fixes its unit; a call under
the other unit is refused (:func:`check_unit`), since an ε per cell and an ε per donor do not
compose into one statement.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

#: ``obs`` column names that usually hold a donor's identity (lower-case, whole words).
DONOR_LIKE = ("donor", "patient", "individual", "subject", "sample", "mouse")

#: Columns already told about in this session (the note is said once per column name).
_SAID: set[str] = set()


@dataclass(frozen=True)
class PrivacyUnit:
    """What one individual is: a cell (``donor_key=None``) or a donor with all of their cells."""

    donor_key: str | None = None

    @property
    def name(self) -> str:
        """``"cell"`` or ``"donor"``: what a ledger entry stores."""
        return "cell" if self.donor_key is None else "donor"

    @property
    def plain(self) -> str:
        """The unit in a data manager's words: ``per cell`` or ``per donor (obs['donor'])``."""
        return "per cell" if self.donor_key is None else f"per donor (obs[{self.donor_key!r}])"

    @property
    def weighting(self) -> str:
        """How a donor-level sum weights each cell, as a record's mechanism says it ("" per cell)."""
        if self.donor_key is None:
            return ""
        return (
            ", each cell weighted by 1/(its donor's number of cells) so that a donor's weights add up to 1 "
            "and its whole contribution keeps the per-cell bound"
        )

    def relation(self, n_obs: int) -> str:
        """Return the neighbouring relation, as a record's statement says it."""
        if self.donor_key is None:
            return f"adding or removing one of the {n_obs} cells"
        return (
            f"adding or removing one donor (obs[{self.donor_key!r}]) with all of their cells, of these "
            f"{n_obs} cells"
        )


def unit_of(entry: dict[str, Any]) -> str:
    """Return the unit a ledger entry was booked under (entries before units existed: ``"cell"``)."""
    return str(entry.get("unit", "cell"))


def check_unit(entries: list[dict[str, Any]], unit: str, tool: str) -> None:
    """Refuse a booking under ``unit`` on a ledger whose entries were booked under the other one."""
    booked = {unit_of(entry) for entry in entries}
    if booked and unit not in booked:
        other = booked.pop()
        fix = (
            "pass donor_key= as the earlier calls did (tl.cluster, tl.fit, tl.kmeans, tl.annotate, tl.audit, "
            "tl.cluster_federated, tl.rank_genes_groups and pp.* take it); a call that protects one cell "
            "only would leave each donor's total ε unbounded (a donor's many cells compose only at group "
            "level)"
            if other == "donor"
            else "call without donor_key, as the earlier calls did, or start from a fresh copy of the counts"
        )
        raise ValueError(
            f"{tool}: these cells' ledger is per {other} (its earlier calls protect one {other}); this call "
            f"would spend per {unit}, and an ε per cell and an ε per donor do not compose into one "
            f"statement. {fix[0].upper()}{fix[1:]}. Nothing was spent."
        )


def donor_codes(adata: Any, donor_key: str, tool: str) -> np.ndarray:
    """Return each cell's donor as an integer code ``0 … D-1``; check the column first.

    Refuses, with the fix and before any work: a ``donor_key`` that is not an ``obs`` column, a
    cell without a donor (NaN), and fewer than two donors (a donor-level release about one donor
    protects no one from its result). Reads ``obs[donor_key]`` only; the codes are never released.
    """
    if not isinstance(donor_key, str) or donor_key not in adata.obs:
        columns = ", ".join(repr(c) for c in adata.obs.columns[:12]) or "none"
        raise ValueError(
            f"{tool}: donor_key={donor_key!r} is not a column of adata.obs (its columns: {columns}). "
            "Pass the obs column that names each cell's donor (patient, mouse, …). Nothing was spent."
        )
    donors = adata.obs[donor_key]
    missing = int(pd.isna(donors).sum())
    if missing:
        raise ValueError(
            f"{tool}: {missing} cells have no donor in obs[{donor_key!r}] (NaN). Every cell must name its "
            "donor: fill them, or drop those cells "
            f"(adata = adata[adata.obs[{donor_key!r}].notna()].copy()). Nothing was spent."
        )
    codes, uniques = pd.factorize(donors.astype(str), sort=True)
    if len(uniques) < 2:
        raise ValueError(
            f"{tool}: obs[{donor_key!r}] names one donor only; a donor-level release needs at least two "
            "donors (with one, its result is that donor's). Nothing was spent."
        )
    return codes


def donor_weights(adata: Any, donor_key: str, tool: str) -> np.ndarray:
    r"""Return each cell's weight :math:`1/m_d` (module docstring); :func:`donor_codes` checks the column."""
    codes = donor_codes(adata, donor_key, tool)
    return 1.0 / np.bincount(codes)[codes].astype(np.float64)


@dataclass(frozen=True)
class DonorRows:
    r"""Each donor's rows, to sample donors for DP-SGD (local: read from ``obs``, never released).

    A donor-level Poisson draw includes each donor independently with rate q and, for each donor
    drawn, **one of its cells chosen uniformly at random** (:meth:`one_row_each`, from the
    same secret stream). Adding or removing a donor then adds or removes at most one row of each batch, so
    every per-cell bound of a step (the clipping norm C of DP-SGD, the sensitivity 1 of a sampled
    release) holds per donor, and the sampled Gaussian mechanism's analysis (Mironov et al. 2019)
    applies at the donors' rate q: the same accountant, with q now each donor's probability.
    """

    order: np.ndarray  # the rows, grouped by donor
    starts: np.ndarray  # where each donor's rows begin in ``order``
    sizes: np.ndarray  # each donor's number of rows

    @classmethod
    def of(cls, codes: np.ndarray) -> DonorRows:
        """Group rows by their donor code (``0 … D-1``)."""
        codes = np.asarray(codes)
        sizes = np.bincount(codes)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        return cls(np.argsort(codes, kind="stable"), starts, sizes)

    @property
    def n_rows(self) -> int:
        """Number of rows (cells) the donors hold together."""
        return len(self.order)

    @property
    def n_donors(self) -> int:
        """Number of donors (local: for the sampler, never released)."""
        return len(self.sizes)

    def one_row_each(self, rng: Any, donors: np.ndarray) -> list[int]:
        """Return one row of each donor in ``donors``, chosen uniformly at random from ``rng``."""
        if not len(donors):
            return []
        sizes = self.sizes[donors]
        pick = np.minimum((rng.uniform(len(donors)) * sizes).astype(np.int64), sizes - 1)
        return np.sort(self.order[self.starts[donors] + pick]).tolist()


def n_donors(weights: np.ndarray) -> int:
    """Return the number of donors of these weights (a local figure for warnings; never released)."""
    return round(float(np.sum(weights)))


def unit_and_weights(adata: Any, donor_key: str | None, tool: str) -> tuple[PrivacyUnit, np.ndarray | None]:
    """Return a call's unit of privacy and each cell's donor weight (``None`` per cell), checked first.

    Per cell, says once when ``obs`` has a column that looks like a donor's
    (:func:`note_donor_column`). Reads ``obs`` only.
    """
    if donor_key is None:
        note_donor_column(adata, tool)
        return PrivacyUnit(), None
    return PrivacyUnit(donor_key), donor_weights(adata, donor_key, tool)


def with_unit(record: Any, unit: PrivacyUnit) -> Any:
    """Return ``record`` naming its unit: ``individual="donor"`` and the donors' column, per donor."""
    if unit.donor_key is None:
        return record
    return replace(record, individual=unit.name, details={**record.details, "donor_key": unit.donor_key})


def note_donor_column(adata: Any, tool: str) -> None:
    """Say once, for a per-cell call, that a donor-like ``obs`` column could make its ε per donor."""
    for column in adata.obs.columns:
        name = str(column)
        words = name.lower().replace("-", "_").split("_")
        if name in _SAID or not any(word in DONOR_LIKE for word in words):
            continue
        if adata.obs[column].nunique(dropna=True) < 2:
            continue
        _SAID.add(name)
        warnings.warn(
            f"{tool}: this call's ε is per cell, and obs[{name!r}] looks like a donor (patient) column. "
            "A donor gives many cells, so a per-cell ε bounds little about a donor; pass "
            f"donor_key={name!r} to protect each donor with all of their cells.",
            UserWarning,
            stacklevel=3,
        )
        return
