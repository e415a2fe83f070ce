"""What a site decides for itself: its settings, from a TOML file or Flower's ``node_config``."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any


@dataclass
class SiteSettings:
    """What a site decides for itself.

    Attributes
    ----------
    data
        Path of the site's ``.h5ad`` (raw counts); in a simulation inside one process
        (``cluster_federated``), the site's cells themselves: an AnnData, or a Ray
        reference to one (``shared``). Such a site keeps its ledger in memory
        (:class:`~dpsc.privacy.MemoryLedger`) and writes no file.
    epsilon
        The largest ε the site spends on one run; ``None`` (``epsilon = "none"`` in a file): the
        site takes part in non-private runs only.
    delta
        The site's δ (default: 10⁻⁵, or 1/(10 n) above 10⁴ cells).
    budget
        The largest total ε its ledger may reach over all runs (``None``: one run's ``epsilon``, or
        the budget stored in the ledger file when smaller; the site's trust rules).
    raise_budget
        Allow ``budget`` to raise the budget stored in the ledger file (an explicit act).
    max_fallback_epsilon
        The largest ε the site accepts, over every run of its ledger composed, should the other
        sites of a secure sum collude with the server (``None``: twice ``epsilon`` for one run and
        twice its budget in total; ``ledger_fallback_epsilon``).
    max_rounds
        The largest number of releases (or training rounds) it serves in one run.
    honest_sites
        The number of sites (itself included) the site trusts to add their noise and not to collude
        with the server; a secure run whose threshold is larger is refused (``None``: any threshold
        of at least 2).
    layer
        Layer with the counts (``None``: ``X``).
    accountant
        The Opacus accountant (``"rdp"`` or ``"prv"``) the site calibrates its own noise with in a
        FedSC run; the server's σ is checked against that calibration, whatever accountant the
        server planned with.
    reference
        Path of the site's own copy of a public reference (``.h5ad`` of raw counts; in a simulation,
        the AnnData or a Ray reference to it). A run on a public reference names the reference's
        sha256 fingerprint; the site serves it only when its own copy has that fingerprint, computes
        the basis from its own copy, and refuses a request whose basis is not that one. ``None``: the
        site serves no run on a public reference.
    reference_key
        ``obs`` column of the cell types in the site's copy of the reference: the site tells the
        server its types' mean points and spreads (public), from which the k-means starts when every
        site told the same and the released count of cells within them chooses that start
        (:mod:`dpsc.methods.type_gate`), and names each released cluster after the reference type
        whose spread holds its centroid (post-processing, no ε) in ``obs["dp_cluster_names"]`` of
        its output (a cell outside its cluster's named type: ``"unmatched"``). ``None``: no names,
        and the k-means starts from its sketch.
    donor_key
        ``obs`` column of the site's data naming each cell's donor: the site then serves only
        donor-level plans, weighting each cell 1/(its donor's cells at this site), and its ε is
        per donor with all of their cells (:class:`dpsc.privacy.PrivacyUnit`). ``None``: per cell. A donor
        whose cells are at two sites is protected as two donors.
    ledger
        The ledger file (default ``<data>.dpsc-ledger.json``).
    output
        Where the site writes its results (default ``<data stem>.dpsc.h5ad`` beside the data).
    noise_seed, site_index
        Tests only: the site's own noise seed (the guarantee then does not hold against whoever
        knows it) and its index among the sites. A seed sent by the server is always refused.
    """

    data: str | Any
    epsilon: float | None = 8.0
    delta: float | None = None
    budget: float | None = None
    raise_budget: bool = False
    max_fallback_epsilon: float | None = None
    max_rounds: int = 1000
    honest_sites: int | None = None
    layer: str | None = None
    accountant: str = "rdp"
    reference: str | Any | None = None
    reference_key: str | None = None
    donor_key: str | None = None
    ledger: str | None = None
    output: str | None = None
    noise_seed: int | None = None
    site_index: int | None = None

    def __post_init__(self) -> None:
        if self.epsilon in ("none", "None"):
            self.epsilon = None
        if self.epsilon is not None and not (isinstance(self.epsilon, int | float) and self.epsilon > 0):
            raise ValueError(f"The site's epsilon must be a positive number or 'none', got {self.epsilon!r}.")
        if self.budget is not None and not self.budget > 0:
            raise ValueError(f"The site's budget must be a positive number, got {self.budget!r}.")
        if self.max_fallback_epsilon is not None and not self.max_fallback_epsilon > 0:
            raise ValueError(
                "The site's max_fallback_epsilon must be a positive number, got "
                f"{self.max_fallback_epsilon!r}."
            )
        if self.accountant not in ("rdp", "prv"):  # Opacus's accountants dpsc composes with
            raise ValueError(f"The site's accountant must be 'rdp' or 'prv', got {self.accountant!r}.")
        if self.honest_sites is not None and int(self.honest_sites) < 1:
            raise ValueError(f"honest_sites must be at least 1, got {self.honest_sites!r}.")
        if isinstance(self.reference, str | Path) and not Path(self.reference).exists():
            raise FileNotFoundError(
                f"The site's reference {self.reference} does not exist; give its own copy of the public "
                "reference (--reference FILE or prepared folder, or reference in its settings file)."
            )
        if self.reference_key is not None and self.reference is None:
            raise ValueError(
                "reference_key names a column of the site's reference; give the reference too "
                "(--reference FILE, or reference in its settings file)."
            )
        if not self.in_memory:
            data = Path(self.data)
            self.ledger = self.ledger or str(data.with_name(data.name + ".dpsc-ledger.json"))
            self.output = self.output or str(data.with_name(data.stem + ".dpsc.h5ad"))

    @property
    def in_memory(self) -> bool:
        """Whether the site's cells are held in memory (a simulation) rather than in a file."""
        return not isinstance(self.data, str | Path)

    @property
    def refusal_file(self) -> Path | None:
        """Where the site writes the reason of its last refusal (read by ``dpsc federate site``)."""
        return None if self.ledger is None else Path(str(self.ledger) + ".refusal")

    def record_refusal(self, reason: str) -> None:
        """Write ``reason`` to :attr:`refusal_file` whole: to a sibling first, then renamed over it.

        ``dpsc federate site`` acts on the file's existence, so the file appears only once its
        text is complete (``os.replace`` is atomic on one file system); a file created empty and
        then written could be read in between, and the data manager would see no reason.
        """
        target = self.refusal_file
        if target is None:
            return
        partial = target.with_name(target.name + ".partial")
        partial.write_text(reason)
        os.replace(partial, target)

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> SiteSettings:
        """Return settings from a mapping (a TOML table, or Flower's ``node_config``)."""
        known = {f.name for f in fields(cls)}
        given = {str(k).replace("-", "_"): v for k, v in values.items()}
        unknown = sorted(set(given) - known - {"partition_id", "num_partitions", "settings"})
        if unknown:
            raise ValueError(f"Unknown site settings {unknown}; a site takes {sorted(known)}.")
        return cls(**{k: v for k, v in given.items() if k in known})

    @classmethod
    def from_file(cls, path: str | Path) -> SiteSettings:
        """Return settings from a TOML file (relative paths are taken from the file's folder)."""
        path = Path(path)
        values = tomllib.loads(path.read_text())
        values = values.get("site", values)
        for key in ("data", "ledger", "output", "reference"):
            if key in values and not Path(values[key]).is_absolute():
                values[key] = str(path.parent / values[key])
        return cls.from_mapping(values)
