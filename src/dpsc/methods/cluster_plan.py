"""The private clustering's plan: every release, its σ and the (ε, δ), fixed before a cell is read.

:func:`plan_clustering` splits the asked (ε, δ) over the releases (:func:`~dpsc.privacy.split_budget`,
shares :data:`~dpsc.methods.cluster_design.SHARES`) and calibrates each σ once; a
:class:`ClusterPlan` is sent to every site and checked there against the site's own.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..privacy import PlannedRelease, PlanSettings, ReleasePlan
from . import cluster_design as design
from . import kmeans as _kmeans
from . import type_gate as _type_gate
from .cluster_design import (
    BRANCHES,
    CLIP_NORM,
    KMEANS_PLAN,
    MIN_GENES,
    genes_for,
    kmeans_plan,
    kmeans_steps,
    marker_kinds,
    release_kinds,
)
from .cluster_requests import ReleaseStep
from .public_basis import PublicBasis
from .release_kinds import REGISTRY


@dataclass(frozen=True)
class ClusterPlan(PlanSettings):
    """A whole private clustering, fixed before any cell is read (public: sent to every site).

    ``releases`` is the plan as the one plan type (:class:`~dpsc.privacy.ReleasePlan`): every release
    the clustering makes, in order, each with its σ (q = 1; the k-means release counts
    :attr:`kmeans_steps` steps), and the (ε, δ) they were calibrated for; the σ live there only.
    The other fields are the clustering's public settings. :func:`plan_clustering` calibrates one;
    :meth:`from_config` reads one a server sent (the one plan built from σ).
    """

    releases: ReleasePlan
    n_vars: int
    n_clusters: int
    n_genes: int  # genes the PCA reads: selected when fewer than n_vars
    n_comps: int
    random_state: int = 0
    kmeans: dict[str, Any] = field(default_factory=lambda: kmeans_plan())
    markers: bool = False  # a last release: each cluster's marker statistics (:mod:`.markers`)
    #: genes and loadings come from a public reference (:mod:`.public_basis`): only the k-means
    #: (and marker) releases read the cells
    public_basis: bool = False
    #: the plan opens with the count that chooses the k-means start (:mod:`.type_gate`); the plan
    #: is one branch (its ``kmeans``), :meth:`branch` gives either, which follow the same count
    gated: bool = False
    #: a gated plan's calibrated releases in each branch, in :data:`BRANCHES` order: their k-means
    #: differ, every other release has the same σ in both (:func:`gated_branches`)
    branches: tuple[ReleasePlan, ...] = ()
    #: what one individual is: ``"cell"``, or ``"donor"`` (each cell's contribution weighted
    #: 1/its donor's cells, :class:`dpsc.privacy.PrivacyUnit`); the same σ serve both
    unit: str = "cell"

    def __post_init__(self) -> None:
        names = tuple(r.name for r in self.releases.releases)
        if names != self.kinds:
            raise ValueError(f"A clustering of these settings makes the releases {self.kinds}, not {names}.")
        if self.releases["kmeans"].steps != self.kmeans_steps:
            raise ValueError(f"The k-means release takes {self.kmeans_steps} steps with these settings.")

    @classmethod
    def of(
        cls,
        releases: ReleasePlan,
        *,
        n_vars: int,
        n_clusters: int,
        n_genes: int,
        n_comps: int | None = None,
        random_state: int = 0,
        kmeans: dict[str, Any] | None = None,
        markers: bool = False,
        public_basis: bool = False,
        branches: tuple[ReleasePlan, ...] = (),
        unit: str = "cell",
    ) -> ClusterPlan:
        """Return the plan of these settings that spends ``releases`` (calibrated, in the plan's order).

        ``n_comps`` defaults to :data:`N_COMPS` (at most ``n_genes - 1``), ``kmeans`` to
        :func:`kmeans_plan`; ``branches`` (a gated plan's, :func:`gated_branches`) makes it gated.
        """
        kmeans = kmeans_plan() if kmeans is None else kmeans
        n_comps = min(design.N_COMPS, n_genes - 1) if n_comps is None else n_comps
        settings = (n_vars, n_clusters, n_genes, n_comps, random_state, kmeans, markers, public_basis)
        return cls(releases, *settings, bool(branches), tuple(branches), unit)

    @property
    def sigmas(self) -> dict[str, float]:
        """σ of every kind a clustering can release, 0 for the kinds this plan does not make."""
        made = self.releases.sigmas
        return {kind: made.get(kind, 0.0) for kind in REGISTRY}

    @property
    def select_genes(self) -> bool:
        """Whether the plan starts with the DP gene selection (it reads fewer genes than there are)."""
        return self.n_genes < self.n_vars and not self.public_basis

    @property
    def kmeans_steps(self) -> int:
        """Releases of the k-means step."""
        return kmeans_steps(self.kmeans)

    @property
    def marker_kinds(self) -> tuple[str, ...]:
        """The marker releases the plan makes: none without markers; without ε no histogram of norms."""
        return marker_kinds(self.markers, self.epsilon is not None, self.public_basis)

    @property
    def n_releases(self) -> int:
        """Every release of the plan, in order."""
        pca = 0 if self.public_basis else 2
        return int(self.gated) + int(self.select_genes) + pca + self.kmeans_steps + len(self.marker_kinds)

    @property
    def most_releases(self) -> int:
        """The releases of the longer branch of a gated plan (:meth:`branch`); else :attr:`n_releases`.

        What a site's ``max_rounds`` is checked against before it serves the first release.
        """
        if not self.gated:
            return self.n_releases
        longest = max(kmeans_steps(kmeans_plan(public_start)) for public_start in (True, False))
        return self.n_releases - self.kmeans_steps + longest

    def release_delta(self, index: int) -> float:
        """Return the δ a site books release ``index`` with: the plan's δ split over its releases.

        A gated plan's count (release 0) is booked before its branch is known, with the share
        :data:`~.type_gate.COUNT_DELTA_SHARE` of δ; the rest of δ is split over the branch's other
        releases, so that the releases of either branch add up to the plan's δ, and the type start's
        single k-means release, which holds nearly all of the ε, is booked at nearly the whole δ (a
        line's own ε at its δ never exceeds the plan's; the ledger composes the lines at their sum).
        """
        if not self.gated:
            return self.delta / self.n_releases
        count = self.delta * _type_gate.COUNT_DELTA_SHARE
        return count if index == 0 else (self.delta - count) / (self.n_releases - 1)

    @property
    def start(self) -> str:
        """The k-means start of a plan on a public basis (:data:`BRANCHES`): ``"types"`` or ``"sketch"``."""
        return "sketch" if self.kmeans["n_sketch_steps"] else "types"

    def branch(self, start: str) -> ClusterPlan:
        """Return the plan a gated clustering follows after its count: ``"types"`` or ``"sketch"``.

        The same releases and σ but the k-means: the type start's single Lloyd release, or the
        sketch's releases (:attr:`branches`, calibrated with the rest to the same (ε, δ)). No
        calibration. Raises for another name, or a plan that is not gated.
        """
        if not self.gated or start not in BRANCHES:
            raise ValueError(f"Only a gated plan has branches, {BRANCHES}; got {start!r}.")
        releases = self.branches[BRANCHES.index(start)]
        return replace(self, releases=releases, kmeans=kmeans_plan(public_start=start == "types"))

    @property
    def branch_sigmas(self) -> tuple[float, ...]:
        """A gated plan's k-means σ in each branch (:data:`BRANCHES` order); (0, 0) when not gated."""
        return tuple(b.sigma("kmeans") for b in self.branches) or (0.0, 0.0)

    def kmeans_signal(self, n_individuals: float) -> tuple[int, float, float]:
        r"""Return the k-means table's rows, the expected weight per row and its count's noise sd.

        Each of the rows (k from a public start, else the :attr:`coreset_size` Lloyd centroids)
        holds about :math:`n/\text{rows}` of the ``n_individuals`` (cells, or donors at the donor
        unit, whose weights add up to 1 each); one release's count carries noise of sd
        :math:`\sigma\Delta/(\kappa R) = \sigma\sqrt{1+\kappa^2}/\kappa`. A row whose expected
        weight is below twice that sd is below the test a released count must pass to be in use
        (:func:`~.kmeans.clusters_above_noise`): the result is then dominated by noise. Reads the
        plan and a number only.
        """
        rows = self.n_clusters if self.start == "types" and self.public_basis else self.coreset_size
        kappa = float(self.kmeans["count_scale"])
        noise_sd = self.sigmas["kmeans"] * _kmeans.table_sensitivity(CLIP_NORM, kappa) / (kappa * CLIP_NORM)
        return rows, float(n_individuals) / rows, float(noise_sd)

    @property
    def releases_in_words(self) -> str:
        """The plan's releases as a record states them: "1 discrete Gaussian release", "5 … releases"."""
        return f"{self.n_releases} discrete Gaussian release{'' if self.n_releases == 1 else 's'}"

    @property
    def coreset_size(self) -> int:
        """m, the centroids of the DP k-means' Lloyd rounds (``oversampling`` × k)."""
        return int(self.kmeans["oversampling"]) * int(self.n_clusters)

    @property
    def sketch_bits(self) -> int:
        r"""Projection bits of the DP k-means sketch (at least :math:`\lceil\log_2 2m\rceil`)."""
        return max(int(self.kmeans["n_bits"]), int(np.ceil(np.log2(2 * self.coreset_size))))

    def schedule(self) -> tuple[ReleaseStep, ...]:
        """Return the plan's releases as the steps they are served in: what each sums, its size and inputs.

        The one definition of the clustering's requests: :func:`run_clustering` checks each request
        it makes against it, and a federated site (:class:`dpsc.federated.Site`) serves exactly
        these steps, each once, in this order, and refuses anything else. Each step is one draw of a
        release of :attr:`releases` (its σ is that release's), and the schedule holds exactly each
        release's planned number of steps, so what a site serves is what the plan accounts for.
        """
        entries = [(kind, *step) for kind in self.kinds for step in REGISTRY[kind].steps(self)]
        steps = tuple(
            ReleaseStep(
                index,
                self.releases[kind],
                size,
                delta,
                assignment,
                rows,
                width,
                self.public_basis and assignment is not None,
            )
            for index, (kind, size, delta, assignment, rows, width) in enumerate(entries)
        )
        served = Counter(step.kind for step in steps)
        if served != {r.name: r.steps for r in self.releases.releases}:  # what is served is what is accounted
            raise ValueError(
                f"The schedule {dict(served)} does not expand the plan's releases {self.releases}."
            )
        return steps

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of release the plan makes, in order (the gene selection only when it selects)."""
        private = self.epsilon is not None
        return release_kinds(self.select_genes, self.markers, private, self.public_basis, self.gated)

    def history(self) -> list[tuple[float, float, int]]:
        """Return the Opacus history of the whole clustering (every release reads all cells: q = 1)."""
        return self.releases.history()

    def spent(self) -> float | None:
        """ε of the whole plan at δ (``None`` without privacy)."""
        return None if self.epsilon is None else self.releases.spent()

    def to_config(self) -> dict[str, Any]:
        """Return the plan as flat scalars (a Flower ConfigRecord)."""
        return {
            "epsilon": -1.0 if self.epsilon is None else float(self.epsilon),
            "delta": float(self.delta),
            "n-vars": int(self.n_vars),
            "n-clusters": int(self.n_clusters),
            "n-genes": int(self.n_genes),
            "n-comps": int(self.n_comps),
            "random-state": int(self.random_state),
            "markers": int(self.markers),
            "public-basis": int(self.public_basis),
            "gated": int(self.gated),
            "donor-unit": int(self.unit == "donor"),
            **{
                f"sigma-kmeans-{name}": sigma
                for name, sigma in zip(BRANCHES, self.branch_sigmas, strict=True)
            },
            "kmeans-sketch-steps": int(self.kmeans["n_sketch_steps"]),
            **{f"sigma-{k}": float(v) for k, v in self.sigmas.items()},
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ClusterPlan:
        """Inverse of :meth:`to_config` (σ of kinds the plan does not make are not part of it).

        The k-means settings are :func:`kmeans_plan`'s; a plan on a public basis may start from
        public centroids and so make no sketch release (``kmeans-sketch-steps`` 0).
        """
        epsilon = None if float(config["epsilon"]) < 0 else float(config["epsilon"])
        public_basis = bool(int(config.get("public-basis", 0)))
        sketch = int(config.get("kmeans-sketch-steps", KMEANS_PLAN["n_sketch_steps"]))
        public_start = public_basis and sketch == 0
        gated = public_basis and bool(int(config.get("gated", 0)))
        n_vars, n_genes, markers = (
            int(config["n-vars"]),
            int(config["n-genes"]),
            bool(int(config.get("markers", 0))),
        )
        kinds = release_kinds(
            n_genes < n_vars and not public_basis, markers, epsilon is not None, public_basis, gated
        )
        sigmas = {k: float(config.get(f"sigma-{k}", 0.0)) for k in kinds}

        def received(start: bool, kmeans_sigma: float) -> ReleasePlan:
            planned = ReleasePlan.of(
                *cluster_releases(kinds, kmeans_steps(kmeans_plan(start))), accountant="rdp"
            )
            return replace(
                planned.with_sigmas(float(config["delta"]), **{**sigmas, "kmeans": kmeans_sigma}),
                epsilon=epsilon,
            )

        branches = (
            tuple(
                received(name == "types", float(config.get(f"sigma-kmeans-{name}", 0.0))) for name in BRANCHES
            )
            if gated
            else ()
        )
        return cls.of(
            branches[0 if public_start else 1] if gated else received(public_start, sigmas["kmeans"]),
            n_vars=n_vars,
            n_clusters=int(config["n-clusters"]),
            n_genes=n_genes,
            n_comps=int(config["n-comps"]),
            random_state=int(config["random-state"]),
            markers=markers,
            kmeans=kmeans_plan(public_start=public_start),
            public_basis=public_basis,
            branches=branches,
            unit="donor" if int(config.get("donor-unit", 0)) else "cell",
        )


def cluster_releases(kinds: tuple[str, ...], kmeans_steps: int, share: float = 1.0) -> list[PlannedRelease]:
    """Return the clustering's releases of these kinds with their shares (scaled to ``share``)."""
    total = sum(REGISTRY[k].share for k in kinds)
    return [
        PlannedRelease(k, share=share * REGISTRY[k].share / total, steps=kmeans_steps if k == "kmeans" else 1)
        for k in kinds
    ]


def calibrate_genes(
    planned: ReleasePlan,
    epsilon: float | None,
    delta: float,
    *,
    n_obs: int,
    n_vars: int,
    n_genes: int | None = None,
) -> tuple[ReleasePlan, int]:
    """Calibrate a plan that may select genes; return it and the genes the PCA reads.

    The genes are :func:`genes_for` at the PCA's σ of the plan calibrated with its gene selection
    (``n_genes`` when given: a site checking a server's plan); when that is every gene, the
    selection does not run, leaves the plan and its share goes to the others. Its σ is searched
    only when it may run: the PCA's nominal σ (:meth:`~dpsc.privacy.ReleasePlan.nominal_sigma`)
    bounds its calibrated σ from above, and :func:`genes_for` does not fall as σ falls, so when
    the nominal σ already keeps every gene, so does the calibrated one. One σ search per release
    that runs (one more only when the nominal σ selects and the calibrated one does not). A
    fit's plan (:func:`dpsc.model._dcan_privacy.start_parts`) is calibrated the same way.
    """
    if "genes" not in planned:
        releases = planned.calibrate(epsilon, delta)
        return releases, genes_for(n_obs, releases.sigma("pca"), n_vars) if n_genes is None else n_genes
    others = tuple(r.name for r in planned.releases if r.name != "genes")
    if n_genes is None and epsilon is None:
        n_genes = genes_for(n_obs, 0.0, n_vars)
    if n_genes is None and genes_for(n_obs, planned.nominal_sigma("pca", epsilon, delta), n_vars) == n_vars:
        n_genes = n_vars
    if n_genes != n_vars:
        releases = planned.calibrate(epsilon, delta)
        n_genes = genes_for(n_obs, releases.sigma("pca"), n_vars) if n_genes is None else n_genes
        if n_genes < n_vars:
            return releases, n_genes
    return planned.calibrate(epsilon, delta, keep=others), n_vars


def gated_branches(splits: list[ReleasePlan]) -> tuple[ReleasePlan, ...]:
    """Return each branch's calibrated plan with every release but its k-means at the larger σ of the two.

    Each branch was calibrated to (ε, δ); raising a σ only adds noise, so either branch then
    spends at most (ε, δ), and the releases before the count's choice (the count itself) carry
    the same σ whichever branch follows (:mod:`.type_gate`).
    """
    shared = {n: max(split.sigma(n) for split in splits) for n in splits[0].sigmas if n != "kmeans"}
    return tuple(split.at_least(**shared) for split in splits)


def plan_clustering(
    epsilon: float | None,
    delta: float,
    *,
    n_vars: int,
    n_clusters: int,
    n_obs: int | None = None,
    n_genes: int | None = None,
    random_state: int = 0,
    accountant: str = "rdp",
    markers: bool = False,
    public_basis: PublicBasis | None = None,
    public_start: bool | None = None,
    gated: bool | None = None,
    unit: str = "cell",
) -> ClusterPlan:
    """Split (ε, δ) over the releases by :data:`SHARES`, calibrate each σ once, choose the genes.

    The number of genes the PCA reads is ``n_genes`` when given (a site checking a server's plan),
    else :func:`genes_for` at the PCA's σ of a plan with gene selection (:func:`calibrate_genes`:
    when it reads every gene, the selection leaves the plan unsearched and its share goes to the
    others). Reads no cell: ``n_obs`` (the number of cells, public) is needed when the matrix has
    more than :data:`MIN_GENES` genes and there is noise. ``markers``: the plan ends with the
    release of each cluster's marker statistics, its share :data:`MARKERS_SHARE` of the same
    (ε, δ). ``public_basis``: genes and components from a public reference (:mod:`.public_basis`);
    the whole ε goes to the k-means (and marker) releases, with no sketch release when the k-means
    starts from public centroids (``public_start``; ``None``: when the basis holds a start).
    ``gated``: the plan opens with the count that chooses between the type start and the sketch
    (:mod:`.type_gate`; ``None``: when the basis holds a start with its types' radii); the plan
    returned is the type start's branch (:meth:`ClusterPlan.branch`). ``unit``: what one
    individual is, ``"cell"`` or ``"donor"``; the calibration is the same (every release keeps its
    bound per donor, :func:`contribution` with weights), the plan states it.
    """
    if unit not in ("cell", "donor"):
        raise ValueError(f"unit must be 'cell' or 'donor', got {unit!r}.")
    if public_basis is not None:
        start = public_basis.start is not None if public_start is None else bool(public_start)
        gate = start and public_basis.start_radii is not None if gated is None else bool(gated)
        shape = (len(public_basis.genes), public_basis.n_comps)
        plan = _plan_on_public_basis(
            epsilon, delta, n_vars, n_clusters, shape, random_state, accountant, markers, start, gate
        )
        return replace(plan, unit=unit)
    if n_vars < 3:
        raise ValueError(f"A clustering needs at least 3 genes, got {n_vars}.")
    if epsilon is not None and n_vars > MIN_GENES and n_genes is None and n_obs is None:
        raise ValueError("plan_clustering needs n_obs (the number of cells) to choose the genes.")
    selecting = n_vars > MIN_GENES or (n_genes is not None and n_genes < n_vars)
    kinds = release_kinds(selecting, markers, epsilon is not None)
    planned = ReleasePlan.of(*cluster_releases(kinds, kmeans_steps(kmeans_plan())), accountant=accountant)
    releases, n_genes = calibrate_genes(
        planned, epsilon, delta, n_obs=n_obs or 0, n_vars=n_vars, n_genes=n_genes
    )
    if not 3 <= n_genes <= n_vars:
        raise ValueError(f"A clustering reads between 3 and {n_vars} genes, got {n_genes}.")
    settings = dict(n_vars=n_vars, n_clusters=n_clusters, n_genes=n_genes, random_state=random_state)
    return ClusterPlan.of(releases, **settings, markers=markers, unit=unit)


def _plan_on_public_basis(
    epsilon: float | None,
    delta: float,
    n_vars: int,
    n_clusters: int,
    shape: tuple[int, int],
    random_state: int,
    accountant: str,
    markers: bool,
    public_start: bool,
    gated: bool = False,
) -> ClusterPlan:
    """Return the plan of a clustering on public genes and loadings (``shape``: genes × components).

    The k-means (and marker) releases only; a ``gated`` plan opens with the count that chooses the
    start: each branch (the type start's k-means, the sketch's) is calibrated with the count and the
    markers to (ε, δ), and every release but the k-means gets the larger of its two σ
    (:func:`gated_branches`: either branch then spends at most (ε, δ)).
    """
    kinds = release_kinds(False, markers, epsilon is not None, True, gated)

    def calibrated(start: bool) -> ReleasePlan:
        planned = cluster_releases(kinds, kmeans_steps(kmeans_plan(start)))
        return ReleasePlan.of(*planned, accountant=accountant).calibrate(epsilon, delta)

    branches = gated_branches([calibrated(b == "types") for b in BRANCHES]) if gated else ()
    return ClusterPlan.of(
        branches[0 if public_start else 1] if gated else calibrated(public_start),
        n_vars=n_vars,
        n_clusters=n_clusters,
        n_genes=shape[0],
        n_comps=shape[1],
        random_state=random_state,
        kmeans=kmeans_plan(public_start),
        markers=markers,
        public_basis=True,
        branches=branches,
    )
