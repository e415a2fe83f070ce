r"""A federated site that enforces its own privacy.

A hospital's privacy is the hospital's: its ε, δ, budget, noise and the number of releases it will
serve come from its own :class:`SiteSettings` (a TOML file beside its data, or Flower's
``node_config``), never from the server. The server proposes a run (a public
:class:`~dpsc.privacy._clustering.ClusterPlan`, the aggregation mode and the threshold); the site
checks it against its settings and its ledger (:meth:`Site.check_run`) and answers each release
request with the integer lattice vector of its own sum plus its share of the noise
(:meth:`Site.contribute`). It refuses, with a message that names the reason and sends nothing:

* a run without noise, when the site is configured with an ε;
* any noise multiplier below what the site's own (ε, δ) calls for (the site calibrates the same
  public plan with its own numbers);
* a noise seed from the server (the site draws its noise from its own secret keystreams; a seed,
  for tests, can only come from the site's own settings);
* a secure-aggregation run whose threshold is above the number of honest sites the site assumes,
  or a secure-mode request that did not arrive through SecAgg+ (the share it would send is not
  enough noise on its own);
* a run, or a release, that would take its ledger past its budget, or past ``max_rounds``;
* a malformed request.

**The ledger** is a :class:`~dpsc.privacy.FileLedger` beside the data: it survives restarts, a
second run composes with the first, writes are atomic. Each contribution is booked just before it
is sent (so the ledger never shows less than what left the site; a crash between booking and
sending leaves one booked release that was not sent).

**What a site's ε covers.** In *plain* mode each site adds the full noise σ to its own sum: its
release is (ε, δ)-DP for its cells by itself, whatever the others do. In *secure* mode (SecAgg+,
``threshold`` t) each site adds the discrete Gaussian share :math:`\sigma^2/t` and the server sees
only the sum, which carries the central noise if at least t of the summed sites added their share
and do not collude with the server; SecAgg+ reveals no sum of fewer than t sites. The site's ε is
then the central mechanism's, under that assumption (the record states it).
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np

from .._validation import get_matrix, resolve_delta
from ..privacy import (
    ADD_REMOVE,
    BudgetExceededError,
    FileLedger,
    NoiseSource,
    PrivacyRecord,
    no_guarantee_record,
)
from ..privacy._clustering import MEAN_WEIGHT, ClusterPlan, Request, contribution, plan_clustering
from ..privacy._ledger import _check, ledger_entry

MODES = ("secure", "plain")


def _release_epsilon(sigma: float, delta: float) -> float:
    """ε of one Gaussian release (σ, q = 1) at δ (Opacus RDP), computed once per (σ, δ) per process."""
    key = (float(sigma), float(delta))
    if key not in _EPSILONS:
        from ..privacy import history_epsilon

        _EPSILONS[key] = history_epsilon([(sigma, 1.0, 1)], delta)
    return _EPSILONS[key]


_EPSILONS: dict[tuple[float, float], float] = {}


class SiteRefusal(ValueError):
    """A site refuses a request: the message says why; nothing was sent or booked."""


@dataclass
class SiteSettings:
    """What a site decides for itself.

    Attributes
    ----------
    data
        Path of the site's ``.h5ad`` (raw counts).
    epsilon
        The largest ε the site spends on one run; ``None`` (``epsilon = "none"`` in a file): the
        site takes part in non-private runs only.
    delta
        The site's δ (default: 10⁻⁵, or 1/(10 n) above 10⁴ cells).
    budget
        The largest total ε its ledger may reach over all runs (``None``: no cap besides ``epsilon``).
    max_rounds
        The largest number of releases (or training rounds) it serves in one run.
    honest_sites
        The number of sites (itself included) the site trusts to add their noise and not to collude
        with the server; a secure run whose threshold is larger is refused (``None``: any threshold
        of at least 2).
    layer
        Layer with the counts (``None``: ``X``).
    ledger
        The ledger file (default ``<data>.dpsc-ledger.json``).
    output
        Where the site writes its results (default ``<data stem>.dpsc.h5ad`` beside the data).
    noise_seed, site_index
        Tests only: the site's own noise seed (the guarantee then does not hold against whoever
        knows it) and its index among the sites. A seed sent by the server is always refused.
    """

    data: str
    epsilon: float | None = 8.0
    delta: float | None = None
    budget: float | None = None
    max_rounds: int = 1000
    honest_sites: int | None = None
    layer: str | None = None
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
        if self.honest_sites is not None and int(self.honest_sites) < 1:
            raise ValueError(f"honest_sites must be at least 1, got {self.honest_sites!r}.")
        data = Path(self.data)
        self.ledger = self.ledger or str(data.with_name(data.name + ".dpsc-ledger.json"))
        self.output = self.output or str(data.with_name(data.stem + ".dpsc.h5ad"))

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
        for key in ("data", "ledger", "output"):
            if key in values and not Path(values[key]).is_absolute():
                values[key] = str(path.parent / values[key])
        return cls.from_mapping(values)


def site_record(
    plan: ClusterPlan,
    mode: str,
    threshold: int,
    n_sites: int,
    n_obs: int,
    noise: NoiseSource,
    simulated: bool = False,
) -> PrivacyRecord:
    """Return the site's record of a federated clustering run (what its ε covers, under which assumption).

    ``simulated=True`` words it for one AnnData holding every simulated site's cells
    (:func:`dpsc.tl.cluster_federated`): each site's ε covers its own cells, and so every cell here.
    """
    if simulated:
        unit = (
            f"adding or removing one of these {n_obs} cells (each of the {n_sites} sites' ε covers its own)"
        )
        covered = (
            "every message the sites sent (their noisy sums), hence the released genes, loadings and "
            "centroids"
        )
    else:
        unit = f"adding or removing one of this site's {n_obs} cells"
        covered = (
            "every message this site sent (its noisy sums), hence the released genes, loadings and centroids"
        )
    if plan.epsilon is None:
        return no_guarantee_record("federated clustering", unit=unit, covered=covered)
    spent = plan.spent()
    if mode == "secure":
        assumption = (
            f"secure aggregation (SecAgg+) over {n_sites} sites with threshold {threshold}: each site added "
            f"1/{threshold} of the noise variance; the guarantee holds if at least {threshold} of the summed "
            "sites "
            "added their share and did not collude with the server, which learns only sums of at least "
            f"{threshold} sites"
        )
    else:
        assumption = (
            f"plain aggregation: {'each' if simulated else 'this'} site added the full noise to its own "
            "sums, whatever the others did"
        )
    whose = "these" if simulated else "this site's"
    not_covered = (
        f"the labels and projections written for {whose} cells (computed from each cell), the number of "
        "cells of each site (treated as public), and site-level privacy (whether "
        f"{'a' if simulated else 'this'} site took part)"
    )
    return PrivacyRecord.stated(
        "federated clustering",
        guarantee="proven",
        epsilon=spent,
        delta=plan.delta,
        unit=unit,
        mechanism=f"{plan.n_releases} discrete Gaussian releases of sums, {assumption}",
        covered=covered,
        not_covered=not_covered,
        noise=noise,
        target_epsilon=float(plan.epsilon),
        accountant="rdp",
        history=plan.history(),
        steps=plan.n_releases,
        scope=f"site ({mode})",
        details={"mode": mode, "threshold": threshold, "n_sites": n_sites},
    )


class Site:
    """One site's cells, settings and ledger; answers release requests (module docstring)."""

    def __init__(self, settings: SiteSettings) -> None:
        self.settings = settings
        path = Path(settings.data)
        if not path.is_file():
            raise FileNotFoundError(f"The site's data file {path} does not exist.")
        self.adata = ad.read_h5ad(path)
        self.matrix = get_matrix(self.adata, settings.layer)
        self.ledger = FileLedger(settings.ledger)
        if self._budget() is not None:
            self.ledger.set_budget(self._budget())
        self.noise = NoiseSource(settings.noise_seed)
        self.delta = resolve_delta(settings.delta, self.adata.n_obs)

    @property
    def n_obs(self) -> int:
        """Cells at this site (treated as public)."""
        return self.adata.n_obs

    # -- checks --------------------------------------------------------------------------------
    def check_run(
        self, plan: ClusterPlan, mode: str, threshold: int, n_sites: int, whole_run: bool = True
    ) -> None:
        """Refuse a run this site's settings or budget do not allow (module docstring).

        ``whole_run``: also check that every release of the plan fits the budget (at the first
        release); later releases are checked one by one when they are booked.
        """
        s = self.settings
        if mode not in MODES:
            raise SiteRefusal(f"Unknown aggregation mode {mode!r}; a site serves {MODES}.")
        if plan.n_vars != self.adata.n_vars:
            raise SiteRefusal(
                f"The run is planned for {plan.n_vars} genes; this site has {self.adata.n_vars}. Every site "
                "must hold the same genes in the same order."
            )
        if plan.n_releases > s.max_rounds:
            raise SiteRefusal(
                f"The run has {plan.n_releases} releases; this site serves at most {s.max_rounds}."
            )
        if plan.epsilon is None:
            if s.epsilon is not None:
                raise SiteRefusal(
                    "The server asks for a run without noise, but this site's settings give it an epsilon: "
                    "it does not send un-noised statistics."
                )
            return
        if s.epsilon is None:
            raise SiteRefusal("This site is configured for non-private runs only (epsilon = 'none').")
        try:  # this site's own calibration of the same releases (the plan's genes)
            own = plan_clustering(
                s.epsilon, self.delta, n_vars=plan.n_vars, n_clusters=plan.n_clusters, n_genes=plan.n_genes
            )
        except ValueError as err:
            raise SiteRefusal(f"Malformed plan from the server ({err}); nothing was sent.") from None
        for name, sigma in own.sigmas.items():
            if plan.sigmas[name] < sigma * (1 - 1e-9):
                raise SiteRefusal(
                    f"The server's noise multiplier for {name} ({plan.sigmas[name]:.4g}) is below this "
                    "site's "
                    f"own calibration ({sigma:.4g} for epsilon={s.epsilon:g}, delta={self.delta:.1e}); it "
                    "would spend more than the site allows."
                )
        if plan.delta > self.delta * (1 + 1e-9):
            raise SiteRefusal(f"The run's delta {plan.delta:.1e} is above this site's {self.delta:.1e}.")
        if mode == "secure":
            if not 2 <= threshold <= n_sites:
                raise SiteRefusal(f"A secure run needs a threshold in [2, {n_sites}], got {threshold}.")
            if s.honest_sites is not None and threshold > s.honest_sites:
                raise SiteRefusal(
                    f"The run's threshold {threshold} assumes {threshold} honest sites; this site trusts "
                    "at most "
                    f"{s.honest_sites}. Ask for a threshold of {s.honest_sites} or less (or the plain mode)."
                )
        if not whole_run:
            return
        planned = site_record(plan, mode, threshold, n_sites, self.n_obs, self.noise)
        try:
            _check(self.ledger.entries(), ledger_entry(planned, "run", "planned"), self._budget())
        except BudgetExceededError as err:
            raise SiteRefusal(f"This site's budget refuses the run: {err}") from None

    def _budget(self) -> dict[str, float] | None:
        if self.settings.budget is None:
            return None
        return {"epsilon": float(self.settings.budget), "delta": -1.0}

    # -- a release ---------------------------------------------------------------------------------
    def contribute(
        self,
        plan: ClusterPlan,
        request: Request,
        mode: str,
        threshold: int,
        n_sites: int,
        run_state: dict[str, Any] | None = None,
    ) -> np.ndarray:
        """Return this site's integer lattice vector of the requested sum plus its noise share; booked first.

        ``run_state`` (kept by Flower for this run at this node) remembers that the whole run was
        checked at its first release, and the ledger's size then, so that later releases are booked
        without the accountant when nothing else was booked in between (they are part of the
        spend already checked).
        """
        run_state = {} if run_state is None else run_state
        if not 0 <= request.index < plan.n_releases:
            raise SiteRefusal(
                f"Release {request.index} is not in the run's plan of {plan.n_releases} releases."
            )
        expected = plan.sigmas[request.kind]
        if not math.isclose(request.sigma, expected, rel_tol=1e-12):
            raise SiteRefusal(
                f"The request's noise multiplier {request.sigma} differs from the plan's {expected}."
            )
        _check_genes(plan, request)
        signature = json.dumps(plan.to_config(), sort_keys=True)
        if run_state.get("plan") != signature:
            if run_state.get("plan") is not None:
                raise SiteRefusal("The server changed the plan in the middle of the run.")
            self.check_run(plan, mode, threshold, n_sites, whole_run=True)
            delta = plan.delta / plan.n_releases
            epsilons = {
                repr(sigma): _release_epsilon(sigma, delta) for sigma in plan.sigmas.values() if sigma > 0
            }
            run_state.update(plan=signature, ledger=self.ledger.count(), booked=0, epsilons=epsilons)
        spec = request.release(plan.n_vars)
        shares = threshold if mode == "secure" else 1
        vector = spec.encode(contribution(request, self.matrix))
        if plan.epsilon is not None:
            vector = vector + self._noise(spec, request, shares, n_sites)
        self._book(plan, request, mode, threshold, n_sites, run_state)
        return vector

    def _noise(self, spec, request: Request, shares: int, n_sites: int) -> np.ndarray:
        """Return this site's noise share: secret, or (a seeded test run) its part of the central run's draw.

        With a ``noise_seed`` every site draws the noise the central clustering draws with that seed
        and adds its part of an exact integer split of it, so the sites' sum is the central noise: a
        federated run then reproduces the central run up to the round-off of K rounded sums.
        """
        if self.noise.secret:
            return spec.noise(self.noise.stream(f"site.{request.kind}", request.index), shares)
        if self.settings.site_index is None:
            raise SiteRefusal("A seeded site (tests only) needs its site_index in its settings.")
        central = spec.noise(
            NoiseSource(self.settings.noise_seed).stream(f"tl.cluster.{request.kind}", request.index)
        )
        k = int(self.settings.site_index)
        return np.floor_divide(central, n_sites) + (np.mod(central, n_sites) > k)

    def _book(
        self, plan: ClusterPlan, request: Request, mode: str, threshold: int, n_sites: int, run_state: dict
    ) -> None:
        """Append this release to the ledger (atomically; checked against the budget when needed)."""
        if plan.epsilon is None:
            return
        delta = plan.delta / plan.n_releases
        entry = (request.sigma, 1.0, 1)
        record = PrivacyRecord(
            tool=f"federated clustering ({mode})",
            epsilon=run_state.get("epsilons", {}).get(repr(request.sigma))
            or _release_epsilon(request.sigma, delta),
            delta=delta,
            guarantee="proven",
            statement="",
            history=[entry],
            relation=ADD_REMOVE,
            noise=self.noise.to_dict(),
            details={"threshold": threshold, "n_sites": n_sites},
        )
        line = ledger_entry(record, f"release {request.index}: {request.kind}", "sent")
        expected = int(run_state.get("ledger", -1)) + int(run_state.get("booked", 0))
        if self.ledger.append_if_unchanged(line, expected) is None:
            try:
                self.ledger.reserve(line)
            except BudgetExceededError as err:
                raise SiteRefusal(f"This site's budget refuses the release: {err}") from None
        run_state["booked"] = int(run_state.get("booked", 0)) + 1

    # -- the end of a run ------------------------------------------------------------------------------
    def write_results(self, result, plan: ClusterPlan, mode: str, threshold: int, n_sites: int) -> Path:
        """Label this site's cells with the released centroids; write them, the record and the ledger."""
        from ..privacy import attach_ledger, write_record
        from ..tl._cluster import write_clustering

        out = self.adata.copy()
        write_clustering(out, self.matrix, result, "dp_kmeans", plan.n_clusters)
        record = site_record(plan, mode, threshold, n_sites, self.n_obs, self.noise)
        write_record(
            out,
            "dp_kmeans",
            record,
            {"mode": mode, "threshold": threshold, "n_sites": n_sites, "mean_weight": MEAN_WEIGHT},
            centroids=result.centroids,
        )
        attach_ledger(out, self.settings.ledger)
        out.uns["dpsc"].pop("ledger_file", None)  # the written file carries a copy; the site keeps the file
        path = Path(self.settings.output)
        out.write_h5ad(path)
        return path


def _check_genes(plan: ClusterPlan, request: Request) -> None:
    """Refuse a request past the gene selection that does not name the plan's ``n_genes`` genes.

    A consistency check, not a privacy one: the sensitivity of every release holds for any gene list.
    """
    if request.kind == "genes":
        return
    genes = np.asarray(request.genes if request.genes is not None else [], dtype=np.int64)
    distinct = len(np.unique(genes))
    in_range = len(genes) == 0 or 0 <= int(genes.min()) <= int(genes.max()) < plan.n_vars
    if len(genes) != plan.n_genes or distinct != len(genes) or not in_range:
        raise SiteRefusal(
            f"Malformed request from the server: {len(genes)} gene indices ({distinct} distinct) where "
            f"the plan reads {plan.n_genes} distinct genes of {plan.n_vars}; nothing was sent."
        )
