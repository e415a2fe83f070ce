r"""A federated site that enforces its own privacy.

A hospital's privacy is the hospital's: its ε, δ, budget, noise and the number of releases it will
serve come from its own :class:`SiteSettings` (a TOML file beside its data, or Flower's
``node_config``), never from the server. The server proposes a run (a public
``ClusterPlan``, the aggregation mode and the threshold); the site
checks it against its settings and its ledger (:meth:`Site.check_run`) and answers each release
request with the integer lattice vector of its own sum plus its share of the noise
(:meth:`Site.contribute`). It refuses, with a message that names the reason and sends nothing:

* a run without noise, when the site is configured with an ε, and any release of a private run
  with a noise multiplier of 0 or below what the site's own (ε, δ) calls for (the site calibrates
  the same public plan with its own numbers; a gated plan must be the shape its own planner makes,
  and every release of **each** branch the count may choose is checked before the first release);
* anything but the plan's schedule (``schedule``): each
  release is served once, in order, with the kind, σ and sizes the schedule fixes; a release
  served before, a skipped or reordered one, one past the schedule, or a change of the plan or of
  the trust settings (mode, threshold, number of sites) in the middle of a run;
* public inputs outside the bounds the proof assumes: gene lists that are not the plan's number
  of distinct genes, loadings that are not finite or not orthonormal, k-means assignments of the
  wrong kind or shape or with values that are not finite (checked before any cell is read);
* a noise seed from the server (the site draws its noise from its own secret keystreams; a seed,
  for tests, can only come from the site's own settings);
* a secure-aggregation run whose threshold is above the number of honest sites the site assumes,
  or whose fallback ε (the site's trust rules: the site's ε if the other summed sites collude with the
  server) is above the site's ``max_fallback_epsilon``, or a secure-mode request that did not arrive
  through SecAgg+ (the share it would send is not enough noise on its own);
* a run, or a release, that would take its ledger past its budget (``resolve_budget``:
  one run's ε unless a budget is set), or past ``max_rounds``; and, whatever the plan said, a
  release that would take the run's own bookings past the site's ε for one run (or, in secure mode,
  its fallback cap for one run): a second line that holds even if a plan check had a hole
  (``run_cap_refusal``);
* a run on a public reference whose fingerprint is not that of the site's own copy (or when the
  site has none), and a request whose public basis is not the one the site computes from its own
  copy (:meth:`Site.public_basis`);
* a malformed request.

Every refusal depends on the server's message, the site's settings and its ledger, never on the
cells. The contributions are per-cell maps of bounded norm whatever the public inputs are (a cell
whose contribution is not finite contributes zero), and the encoded sum is checked against the
bound :math:`n\Delta` before noise is added.

**The ledger** is a :class:`~dpsc.privacy.FileLedger` beside the data: it survives restarts, a
second run composes with the first, writes are atomic. Each contribution is booked, checked
against the budget, just before it is sent (so the ledger never shows less than what left the
site; a crash between booking and sending leaves one booked release that was not sent). A site
that ``cluster_federated`` simulates holds its cells and its ledger in memory
(:class:`~dpsc.privacy.MemoryLedger`) for the one run, whose record the user's own AnnData
ledger holds: the same checks, and no file. The run's bookings also travel with the run's state
that Flower keeps for the site, so whichever worker process answers a message checks it against
every release of the run.

**What a site's ε covers.** In *plain* mode each site adds the full noise σ to its own sum: its
release is (ε, δ)-DP for its cells by itself, whatever the others do. In *secure* mode (SecAgg+,
``threshold`` t) each site adds the discrete Gaussian share :math:`\sigma^2/t` and the server sees
only the sum, which carries the central noise if at least t of the summed sites added their share
and do not collude with the server; SecAgg+ reveals no sum of fewer than t sites. The site's ε is
then the central mechanism's, under that assumption and a server that follows the SecAgg+
protocol (semi-honest); the record and each ledger entry also carry the fallback ε.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np

from .._prepared_reference import open_reference
from .._public_reference import name_clusters, type_radii, type_start, write_names
from .._validation import get_matrix, resolve_delta
from ..methods.cluster_design import BRANCHES, MEAN_WEIGHT, TYPE_COUNT
from ..methods.cluster_plan import ClusterPlan, plan_clustering
from ..methods.cluster_requests import Request, ScheduleError
from ..methods.clustering import contribution
from ..methods.public_basis import PublicBasis, same_basis
from ..privacy import (
    NoiseSource,
    PrivacyRecord,
    PrivacyUnit,
    donor_weights,
    ledger_entry,
    plain_entry,
)
from ._guard import SiteGuard, SiteRefusal
from ._settings import SiteSettings
from ._simulation import is_shared, resolve_shared
from ._trust import (
    fallback_caps,
    fallback_epsilon,
    fallback_history,
    ledger_fallback_epsilon,
)

MODES = ("secure", "plain")


def _release_epsilon(sigma: float, delta: float) -> float:
    """ε of one Gaussian release (σ, q = 1) at δ (Opacus RDP), computed once per (σ, δ) per process."""
    key = (float(sigma), float(delta))
    if key not in _EPSILONS:
        from ..privacy import history_epsilon

        _EPSILONS[key] = history_epsilon([(sigma, 1.0, 1)], delta)
    return _EPSILONS[key]


_EPSILONS: dict[tuple[float, float], float] = {}


def run_fallback_epsilon(plan: ClusterPlan, mode: str, threshold: int) -> float | None:
    """Return a site's ε for the run should the other sites of the threshold collude."""
    if plan.epsilon is None:
        return None
    return fallback_epsilon(plan.history(), plan.delta, threshold if mode == "secure" else 1)


def site_record(
    plan: ClusterPlan,
    mode: str,
    threshold: int,
    n_sites: int,
    n_obs: int,
    noise: NoiseSource,
    simulated: bool = False,
    reference: dict[str, Any] | None = None,
) -> PrivacyRecord:
    """Return the site's record of a federated clustering run (what its ε covers, under which assumption).

    ``simulated=True`` words it for one AnnData holding every simulated site's cells
    (``cluster_federated``): each site's ε covers its own cells, and so every cell here.
    ``reference``: the public reference's summary of a run on one (``details["reference"]``).
    """
    one = "one donor with all of their cells" if plan.unit == "donor" else "one cell"
    if simulated:
        unit = (
            f"adding or removing {one} of these {n_obs} cells (each of the {n_sites} sites' ε covers its own)"
        )
        covered = (
            "every message the sites sent (their noisy sums), hence the released genes, loadings and "
            "centroids"
        )
    else:
        unit = f"adding or removing {one} of this site's {n_obs} cells"
        covered = (
            "every message this site sent (its noisy sums), hence the released genes, loadings and centroids"
        )
    if reference is not None:  # the genes and loadings are the public reference's, not released
        covered = covered.replace("the released genes, loadings and centroids", "the released centroids")
    if plan.epsilon is None:
        return plan.releases.record("federated clustering", unit=unit, mechanism="", covered=covered)
    fallback = run_fallback_epsilon(plan, mode, threshold)
    if mode == "secure":
        assumption = (
            f"secure aggregation (SecAgg+) over {n_sites} sites with threshold {threshold}: each site added "
            f"1/{threshold} of the noise variance; the guarantee holds if the server follows the SecAgg+ "
            f"protocol (semi-honest) and at least {threshold} of the summed sites added their share and did "
            f"not collude with it, as the server learns only sums of at least {threshold} sites; should the "
            f"other {threshold - 1} sites of a sum collude with the server, each site's ε is "
            f"{fallback:.3g} (its fallback ε)"
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
    if plan.unit == "donor":  # each cell weighted 1/(its donor's cells at its site)
        not_covered += (
            "; a donor whose cells are at two sites is protected as two donors (group privacy): give each "
            "person one site"
        )
    details = {"mode": mode, "threshold": threshold, "n_sites": n_sites, "fallback_epsilon": fallback}
    mechanism = f"{plan.releases_in_words} of sums, {assumption}"
    if reference is not None:
        mechanism += (
            f"; each cell read as its point in the public reference's basis ({plan.n_genes} genes, their "
            f"scales and {plan.n_comps} components), which each site computed from its own copy"
        )
        not_covered = (
            f"the public reference {reference['name']!r} (sha256 {reference['fingerprint'][:16]}…, "
            f"{reference['n_obs']} cells): it is assumed public and must not contain the sites' cells, and "
            "no epsilon is spent on it; " + not_covered
        )
        details["reference"] = reference
    if plan.unit == "donor":
        mechanism += "; each cell's contribution weighted by 1/(its donor's number of cells at its site)"
    return plan.releases.record(
        "federated clustering",
        unit=unit,
        mechanism=mechanism,
        covered=covered,
        not_covered=not_covered,
        noise=noise,
        scope=f"site ({mode})",
        details=details,
        individual=plan.unit,
    )


def run_signature(plan: ClusterPlan, mode: str, threshold: int, n_sites: int, reference: str = "") -> str:
    """Return the plan, trust settings and reference of a run as one string: none may change mid-run."""
    trust = {"mode": mode, "threshold": int(threshold), "n-sites": int(n_sites), "reference": reference}
    return json.dumps({**plan.to_config(), **trust}, sort_keys=True)


class Site(SiteGuard):
    """One site's cells, settings and ledger; answers release requests (module docstring).

    Its ledger, budget, caps and refusal words are the one guard of every federated task
    (one class for every federated task).
    """

    def __init__(self, settings: SiteSettings) -> None:
        if not settings.in_memory:
            path = Path(settings.data)
            if not path.is_file():
                raise FileNotFoundError(f"The site's data file {path} does not exist.")
        super().__init__(settings)  # the ledger and its budget, before reading a cell: fails fast
        self.adata = resolve_shared(settings.data) if settings.in_memory else ad.read_h5ad(path)
        self.matrix = get_matrix(self.adata, settings.layer)
        # the donor unit: each cell's weight 1/(its donor's cells here); local, never sent
        self.unit = PrivacyUnit(settings.donor_key)
        self.weights = (
            None if settings.donor_key is None else donor_weights(self.adata, settings.donor_key, "site")
        )
        self.delta = resolve_delta(settings.delta, self.adata.n_obs)
        self._bases: dict[str, tuple[PublicBasis, PublicBasis]] = {}
        self._publics: dict[str, Any] = {}  # the site's own copy of each reference (records, names)

    @property
    def n_obs(self) -> int:
        """Cells at this site (treated as public)."""
        return self.adata.n_obs

    def public_basis(self, fingerprint: str) -> tuple[PublicBasis, PublicBasis]:
        """Return the basis of this site's own copy of the public reference the run names by ``fingerprint``.

        The basis in this site's columns and the same basis in the reference's own columns (what
        the server needs to map the reference's cells). Computed from the site's copy alone (no
        cell of the site is read); refused unless that copy has the run's fingerprint.
        """
        if fingerprint not in self._bases:
            reference = self.settings.reference
            if reference is None:
                raise SiteRefusal(
                    "The server asks for a run on a public reference, but this site has none; start it "
                    "with its own copy of the reference (--reference FILE, or reference in its settings)."
                )
            if is_shared(reference):
                reference = resolve_shared(reference)
            try:
                public = open_reference(reference, self.adata, self.settings.reference_key, "this site")
            except (ValueError, TypeError) as err:
                raise SiteRefusal(f"This site's public reference cannot be used: {err}") from None
            if public.fingerprint != fingerprint:
                raise SiteRefusal(
                    f"The run's public reference has fingerprint {fingerprint[:16]}…; this site's own copy "
                    f"({public.name}) has {public.fingerprint[:16]}…: another reference or another version "
                    "of it. Nothing was sent."
                )
            basis = public.basis()
            self._bases[fingerprint] = (basis, public.own_basis(basis))
            self._publics[fingerprint] = public
        return self._bases[fingerprint]

    def basis_and_start(
        self, fingerprint: str, n_clusters: int
    ) -> tuple[PublicBasis, PublicBasis, np.ndarray | None, np.ndarray | None]:
        """Return :meth:`public_basis`, the DP k-means' public start this site describes and its radii.

        The start is the means of its copy's types (``reference_key`` in its settings; ``None``
        without), the radii those types' spreads (``type_radii``),
        computed from that copy alone; no cell of the site is read.
        """
        own, in_reference = self.public_basis(fingerprint)
        public = self._publics[fingerprint]
        return own, in_reference, type_start(public, own, n_clusters), type_radii(public, own, n_clusters)

    def check_basis(self, request: Request, fingerprint: str) -> None:
        """Refuse a request whose public basis is not the one this site computes from its own copy."""
        own, _ = self.public_basis(fingerprint)
        if not same_basis(request.basis, own):
            raise SiteRefusal(
                "The server's public basis (genes, gene scales, components) is not the one this site "
                "computes from its own copy of the reference; nothing was sent."
            )

    # -- checks --------------------------------------------------------------------------------
    def check_run(
        self, plan: ClusterPlan, mode: str, threshold: int, n_sites: int, reference: str = ""
    ) -> None:
        """Refuse a run this site's settings or budget do not allow (module docstring).

        Checks the plan against the site's own calibration of the same releases, the trust
        settings, and that the whole run fits the budget (so that no run stops half served for
        want of budget). Reads the plan, the settings and the ledger: never a cell.
        """
        s = self.settings
        if mode not in MODES:
            raise SiteRefusal(f"Unknown aggregation mode {mode!r}; a site serves {MODES}.")
        if plan.n_vars != self.adata.n_vars:
            raise SiteRefusal(
                f"The run is planned for {plan.n_vars} genes; this site has {self.adata.n_vars}. Every site "
                "must hold the same genes in the same order."
            )
        if plan.most_releases > s.max_rounds:
            raise SiteRefusal(
                f"The run has {plan.most_releases} releases; this site serves at most {s.max_rounds}."
            )
        if plan.public_basis != bool(reference):
            raise SiteRefusal(
                "Malformed plan from the server: a plan on a public basis names its reference's "
                "fingerprint, and only such a plan does; nothing was sent."
            )
        if plan.unit != self.unit.name:
            fix = (
                "start it with --donor-key (donor_key in its settings) naming its donors' obs column"
                if plan.unit == "donor"
                else "a run of donor-level plans (dpsc federate server --donor-unit)"
            )
            raise SiteRefusal(
                f"The run protects one {plan.unit}; this site serves runs that protect one {self.unit.name} "
                f"({self.unit.plain}). Nothing was sent. For this run, {fix}."
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
        self._check_calibration(plan, reference)
        planned = site_record(plan, mode, threshold, n_sites, self.n_obs, self.noise)
        # the budget first: a spent budget is the simplest true reason to refuse
        self.check_run_budget(ledger_entry(planned, "run", "planned"))
        if mode == "secure":
            self._check_trust(plan, threshold, n_sites)

    def _check_calibration(self, plan: ClusterPlan, reference: str = "") -> None:
        """Refuse a plan whose releases carry less noise than this site's own calibration of them."""
        s = self.settings
        basis = self.public_basis(reference)[0] if plan.public_basis else None
        try:  # this site's own calibration of the same releases (the plan's genes, or its own basis)
            own = plan_clustering(
                s.epsilon,
                self.delta,
                n_vars=plan.n_vars,
                n_clusters=plan.n_clusters,
                n_genes=plan.n_genes,
                markers=plan.markers,
                public_basis=basis,
                # a public start: no sketch release; a gated plan is its type start's branch
                public_start=plan.gated or plan.kmeans["n_sketch_steps"] == 0,
                gated=plan.gated,  # the count that chooses the start: every branch checked below
                unit=plan.unit,
            )
        except ValueError as err:
            raise SiteRefusal(f"Malformed plan from the server ({err}); nothing was sent.") from None
        if plan.n_genes != own.n_genes or plan.n_comps != own.n_comps:
            raise SiteRefusal(
                f"Malformed plan from the server: {plan.n_comps} components where a plan of {plan.n_genes} "
                f"genes has {own.n_comps}; nothing was sent."
            )
        if plan.kmeans != own.kmeans:
            raise SiteRefusal(
                "Malformed plan from the server: its k-means settings are not those this site's own "
                f"planner makes for {'a gated plan (the type start)' if plan.gated else 'this start'}; "
                "nothing was sent."
            )
        # every release of every branch the run may follow, at least at this site's own σ of it
        pairs = [(plan.branch(b), own.branch(b)) for b in BRANCHES] if plan.gated else [(plan, own)]
        if any(theirs.kinds != mine.kinds for theirs, mine in pairs):
            raise SiteRefusal(
                "Malformed plan from the server: its releases are not those of this site's own plan; "
                "nothing was sent."
            )
        for release, needed in (
            (release, mine.sigmas[release.kind]) for theirs, mine in pairs for release in theirs.schedule()
        ):
            if not release.sigma > 0 or release.sigma < needed * (1 - 1e-9):
                asked = plan.spent()  # None: a release without noise, an unbounded ε
                asked_words = "an unbounded epsilon" if asked is None else f"epsilon {asked:.3g}"
                raise SiteRefusal(
                    f"The server's noise multiplier for {release.kind} ({release.sigma:.4g}) is below this "
                    f"site's own calibration ({needed:.4g} for epsilon={s.epsilon:g}, "
                    f"delta={self.delta:.1e}); it would spend more than the site allows: the run asks "
                    f"{asked_words} of this site, which allows {s.epsilon:g} per run (--epsilon, or "
                    "epsilon in its settings file). Ask the server for a run of that epsilon."
                )
        if not 0 < plan.delta <= self.delta * (1 + 1e-9):
            raise SiteRefusal(
                f"The run's delta {plan.delta:.1e} is not in (0, {self.delta:.1e}] (this site's delta)."
            )

    def _check_trust(self, plan: ClusterPlan, threshold: int, n_sites: int) -> None:
        """Refuse a secure run whose threshold this site does not trust (honest sites, fallback ε)."""
        s = self.settings
        if not 2 <= threshold <= n_sites:
            raise SiteRefusal(f"A secure run needs a threshold in [2, {n_sites}], got {threshold}.")
        if s.honest_sites is not None and threshold > s.honest_sites:
            raise SiteRefusal(
                f"The run's threshold {threshold} assumes {threshold} honest sites; this site trusts at "
                f"most {s.honest_sites}. Ask for a threshold of {s.honest_sites} or less (or the plain mode)."
            )
        run_cap, total_cap = fallback_caps(s, self.budget)
        fallback = run_fallback_epsilon(plan, "secure", threshold)
        total = ledger_fallback_epsilon(self.ledger.entries(), plan.history(), plan.delta, threshold)
        if fallback > run_cap * (1 + 1e-9) or total > total_cap * (1 + 1e-9):
            over = (
                f"above its cap of {run_cap:.3g} for one run"
                if fallback > run_cap * (1 + 1e-9)
                else f"and {total:.3g} with every earlier run of its ledger, above its cap of "
                f"{total_cap:.3g} in total"
            )
            raise SiteRefusal(
                f"The run's threshold {threshold} gives this site a fallback epsilon of {fallback:.3g} (its "
                f"epsilon should the other {threshold - 1} sites of a sum collude with the server), {over} "
                "(max_fallback_epsilon). Nothing was sent. Ask the server for a smaller threshold or the "
                "plain mode, or raise max_fallback_epsilon (--max-fallback-epsilon) if the data owner agrees."
            )

    # -- a release ---------------------------------------------------------------------------------
    def contribute(
        self,
        plan: ClusterPlan,
        request: Request,
        mode: str,
        threshold: int,
        n_sites: int,
        run_state: dict[str, Any] | None = None,
        reference: str = "",
    ) -> np.ndarray:
        """Return this site's integer lattice vector of the requested sum plus its noise share; booked first.

        ``run_state`` (kept by Flower for this run at this node) holds the run's signature (plan
        and trust settings, checked whole at the first release) and how many of the schedule's
        releases were served. The request must be the next one of the schedule; every check
        reads the message, the settings and the ledger only, and happens before any cell is read.
        """
        run_state = {} if run_state is None else run_state
        booked = run_state.setdefault("booked", [])  # this run's lines: its per-run caps compose them
        self.adopt(booked)  # one ledger copy per worker process: this run's lines booked elsewhere
        signature = run_signature(plan, mode, threshold, n_sites, reference)
        if run_state.get("signature", signature) != signature:
            raise SiteRefusal(
                "The server changed the plan or the trust settings (mode, threshold, number of sites) in "
                "the middle of the run; nothing was sent."
            )
        if "signature" not in run_state:
            self.check_run(plan, mode, threshold, n_sites, reference)
            run_state.update(signature=signature, served=0)
        served = int(run_state["served"])
        plan = self._branch_served(plan, request, served, run_state)
        schedule = plan.schedule()
        if served >= len(schedule):
            raise SiteRefusal(
                f"Release {request.index} is past the run's plan: this site served all its "
                f"{len(schedule)} releases; nothing was sent."
            )
        if request.index != served:
            raise SiteRefusal(
                f"The server asks for release {request.index}; the next release of the run's plan is "
                f"{served} (each release is served once, in order); nothing was sent."
            )
        scheduled = schedule[served]
        try:
            scheduled.check(request, plan.n_vars, plan.n_genes)
        except ScheduleError as err:
            raise SiteRefusal(f"Malformed request from the server: {err}; nothing was sent.") from None
        if request.basis is not None:
            self.check_basis(request, reference)
        if request.kind == TYPE_COUNT:  # counted against this site's own start and its types' radii
            own, _, start, radii = self.basis_and_start(reference, plan.n_clusters)
            if start is None or radii is None:
                raise SiteRefusal(
                    "The server asks which cells lie within the reference's types, but this site's copy "
                    "has no types (reference_key in its settings); nothing was sent."
                )
            request = replace(request, basis=own.with_start(start, radii))
        spec = scheduled.release(request.columns)
        vector = spec.encode(contribution(request, self.matrix, weights=self.weights))
        _check_bound(vector, spec, self.n_obs)
        if plan.epsilon is not None:
            vector = vector + self._noise(spec, request, threshold if mode == "secure" else 1, n_sites)
        line = self._book(plan, request, mode, threshold, n_sites, booked)
        if line is not None:
            booked.append(plain_entry(line))
        run_state["served"] = served + 1
        return vector

    @staticmethod
    def _branch_served(
        plan: ClusterPlan, request: Request, served: int, run_state: dict[str, Any]
    ) -> ClusterPlan:
        """Return the branch of a gated plan this run follows (the plan itself when not gated).

        The count is release 0 of both branches. The server names the branch with the first request
        after it (the start its released count chose), and this site holds the run to that branch:
        a request of another branch, or none named, is refused. Reads the message and the run state.
        """
        if not plan.gated or served == 0:
            return plan
        branch = run_state.setdefault("branch", request.branch)
        if request.branch != branch or branch not in BRANCHES:
            raise SiteRefusal(
                f"The server asks for release {request.index} of the {request.branch or 'unnamed'} start, "
                f"where this run follows the {branch or 'unnamed'} one (a gated run follows one start, "
                f"{' or '.join(BRANCHES)}, chosen by its first release); nothing was sent."
            )
        return plan.branch(branch)

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
        self,
        plan: ClusterPlan,
        request: Request,
        mode: str,
        threshold: int,
        n_sites: int,
        run_lines: list[dict[str, Any]],
    ) -> dict[str, Any] | None:
        """Append this release to the ledger, atomically and checked against the caps, before it is sent.

        Two lines of defence: the run's lines so far (``run_lines``) with this one must stay within
        the site's ε for one run (and, in secure mode, its fallback cap for one run), whatever the
        plan said (``run_cap_refusal``); and the ledger within its total budget.
        Returns the ledger line booked (``None`` for a run without noise, which books nothing).
        """
        if plan.epsilon is None:
            return None
        delta = plan.release_delta(request.index)  # the releases of the branch served add up to δ
        epsilon = _release_epsilon(request.sigma, delta)
        if not math.isfinite(epsilon):
            raise SiteRefusal(f"Release {request.index} would spend an unbounded epsilon; nothing was sent.")
        fallback = fallback_epsilon([(request.sigma, 1.0, 1)], delta, threshold if mode == "secure" else 1)
        record = PrivacyRecord.message(
            f"federated clustering ({mode})",
            [(request.sigma, 1.0, 1)],
            delta,
            noise=self.noise,
            epsilon=epsilon,
            details={"threshold": threshold, "n_sites": n_sites, "fallback_epsilon": fallback},
        )
        line = ledger_entry(record, f"release {request.index}: {request.kind}", "sent")
        line["fallback_history"] = fallback_history(request.sigma, threshold if mode == "secure" else 1)
        fallback_cap = fallback_caps(self.settings, self.budget)[0] if mode == "secure" else None
        self.book_line(line, run_lines, plan.delta, f"release {request.index} ({request.kind})", fallback_cap)
        return line

    # -- the end of a run ------------------------------------------------------------------------------
    def finish(
        self,
        result,
        plan: ClusterPlan,
        mode: str,
        threshold: int,
        n_sites: int,
        run_state: dict[str, Any],
        reference: str = "",
    ) -> Path | None:
        """Write the run's results, once, for the run this site served to its end, with its plan.

        Refuses (:class:`SiteRefusal`) a ``finish`` without a run, before the run's last release,
        with another plan or trust settings than the run was served under, or a second time: the
        record a site writes is that of the releases it sent, and no message of the server's makes
        it write (or overwrite) its output otherwise.
        """
        if "signature" not in run_state:
            raise SiteRefusal("The server asks this site to write results of a run it did not serve.")
        if run_state["signature"] != run_signature(plan, mode, threshold, n_sites, reference):
            raise SiteRefusal(
                "The server's results name another plan or trust settings than the run this site served; "
                "nothing was written."
            )
        if plan.gated and run_state.get("branch") in BRANCHES:  # the start this run followed
            plan = plan.branch(run_state["branch"])
        if int(run_state.get("served", 0)) != len(plan.schedule()):
            raise SiteRefusal(
                f"The server asks for the results after {run_state.get('served', 0)} of the run's "
                f"{len(plan.schedule())} releases; nothing was written."
            )
        if run_state.get("finished"):
            raise SiteRefusal("This site already wrote this run's results; it writes them once.")
        run_state["finished"] = True
        if plan.public_basis:  # the cells' points in this site's own (checked) basis
            result.basis = self.public_basis(reference)[0]
        names = summary = None
        public = self._publics.get(reference)
        if public is not None:
            summary = public.summary(self._bases[reference][0])
            if plan.public_basis and public.labels is not None:
                names = name_clusters(result.centroids, public, result.basis, result.centroid_noise)  # no ε
        return self.write_results(result, plan, mode, threshold, n_sites, summary, names)

    def write_results(
        self,
        result,
        plan: ClusterPlan,
        mode: str,
        threshold: int,
        n_sites: int,
        reference: dict[str, Any] | None = None,
        names: Any = None,
    ) -> Path | None:
        """Label this site's cells with the released centroids; write them, the record and the ledger.

        ``names``: each cluster's name from the site's own copy of the reference
        (``name_clusters``), written to ``obs["dp_cluster_names"]``. A site
        simulated in memory writes nothing (``None``): the simulation labels every cell from the
        same released centroids in the user's own AnnData.
        """
        from .._outputs import write_cluster_markers, write_clustering
        from ..privacy import attach_ledger, write_record

        if self.settings.output is None:
            return None

        out = self.adata.copy()
        write_clustering(out, self.matrix, result, "dp_cluster", plan.n_clusters)
        named = {}
        if names is not None:  # each cell named from its own point in this site's basis
            named["cluster_names"] = write_names(out, "dp_cluster", names, result.basis.points(self.matrix))
        record = site_record(plan, mode, threshold, n_sites, self.n_obs, self.noise, reference=reference)
        write_record(
            out,
            "dp_cluster",
            record,
            {"mode": mode, "threshold": threshold, "n_sites": n_sites, "mean_weight": MEAN_WEIGHT},
            centroids=result.centroids,
            **(
                {"markers": write_cluster_markers(out, result, plan, "dp_cluster")}
                if result.marker_table is not None
                else {}
            ),
            **named,
        )
        attach_ledger(out, self.settings.ledger)
        out.uns["dpsc"].pop("ledger_file", None)  # the written file carries a copy; the site keeps the file
        path = Path(self.settings.output)
        out.write_h5ad(path)
        return path


def _check_bound(vector: np.ndarray, spec, n_obs: int) -> None:
    r"""Raise unless the encoded sum is within :math:`n\Delta` (lattice units, round-off included).

    Every contribution is a per-cell map of norm at most Δ whatever the public inputs are, so this
    never fails on any data: a check of the code, made before noise is added and anything is sent.
    """
    bound = n_obs * spec.sensitivity / spec.lattice + 0.5 * math.sqrt(spec.size)
    norm = float(np.linalg.norm(vector.astype(np.float64)))
    if not norm <= bound * (1 + 1e-9):
        raise RuntimeError(
            f"This site's {spec.name} sum has norm {norm:.4g} above its bound {bound:.4g}: a defect of dpsc, "
            "not of the data; nothing was sent."
        )
