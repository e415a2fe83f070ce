"""The site's side of a FedSC run: its own privacy for training, and its part of the final clustering.

A FedSC site enforces its privacy as a clustering site does (:mod:`dpsc.federated._site`): its ε,
δ, budget, noise and the number of rounds it serves come from its own :class:`SiteSettings`. For a
run of ``rounds × local_epochs`` local epochs with the FedSC batch it calibrates, for its own
cells, the DP-SGD noise multiplier of the training and the one of the final DP k-means (the run's ε
split :data:`TRAINING_SHARE` : 1 − :data:`TRAINING_SHARE`, :func:`~dpsc.privacy.split_budget`),
and refuses the run when the server's noise multipliers are smaller, when the server sends a noise
seed or asks for un-noised weights or statistics, when the run has more rounds than it serves, or
when its ledger would pass its budget. It then serves the run's schedule and nothing else: rounds
1 … R in order, each once and of the run's local epochs, then the k-means releases in order, each
once, of the kind and shape the k-means plan fixes (:func:`kmeans_schedule`); a repeated, skipped,
reordered or extra message is refused (:class:`FedSCGuard`). Each round's DP-SGD steps, and each
k-means release, are booked in its ledger file before the reply leaves, checked against the run's
own ε as well as the ledger's budget (:func:`~._trust.run_cap_refusal`).

**The final clustering is federated.** After training, the server runs DP k-means
(:func:`~dpsc.methods.dp_kmeans_centroids`, the plan of :mod:`dpsc.methods.clustering`) on the
global encoder's embeddings: each site adds the k-means table of its own embedded cells with its
full noise (plain aggregation), the server sums the tables and post-processes, and each site labels
its own cells with the released centroids. No central k-means sees anyone's embeddings.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._validation import resolve_delta
from ..methods.cluster_design import CLIP_NORM, KMEANS_PLAN, MAX_PUBLIC_VALUE
from ..methods.kmeans import Assignment, kmeans_points, kmeans_release_steps, kmeans_table, table_release
from ..privacy import (
    NoiseSource,
    PlannedRelease,
    PrivacyRecord,
    ReleasePlan,
    ledger_entry,
    no_guarantee_record,
    plain_entry,
)
from ._guard import SiteGuard, SiteRefusal
from ._settings import SiteSettings

TRAINING_SHARE = 0.9
KMEANS_STEPS = kmeans_release_steps(
    KMEANS_PLAN["n_sketch_steps"], KMEANS_PLAN["n_lloyd_rounds"], KMEANS_PLAN["steps_per_round"]
)


def fedsc_plan(
    epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str = "rdp"
) -> ReleasePlan:
    """One FedSC site's plan: its DP-SGD training and its k-means tables, calibrated to (ε, δ) on its cells.

    The training takes :data:`TRAINING_SHARE` of the budget (``steps`` Poisson steps at rate
    ``sample_rate``), the k-means tables the rest (:data:`KMEANS_STEPS` releases of every cell).
    """
    return ReleasePlan.of(
        PlannedRelease("training", share=TRAINING_SHARE, sample_rate=sample_rate, steps=steps),
        PlannedRelease("kmeans", share=1 - TRAINING_SHARE, steps=KMEANS_STEPS),
        accountant=accountant,
    ).calibrate(epsilon, delta)


def kmeans_schedule(n_clusters: int, d: int) -> list[tuple[str, tuple[int, int]]]:
    """Return the kind and largest matrix shape of each k-means release of a FedSC run, in order.

    :data:`~dpsc.methods.cluster_design.KMEANS_PLAN`'s sketch steps (a ``d × b`` projection, b bits),
    then its Lloyd steps (at most ``m × d`` centroids, m = oversampling × k). Reads no cell.
    """
    plan = KMEANS_PLAN
    m = int(plan["oversampling"]) * int(n_clusters)
    bits = max(int(plan["n_bits"]), math.ceil(math.log2(2 * m)))
    lloyd = KMEANS_STEPS - int(plan["n_sketch_steps"])
    return [("sketch", (d, bits))] * int(plan["n_sketch_steps"]) + [("nearest", (m, d))] * lloyd


def site_sigma(values: str, partition: int | None) -> float:
    """Return a site's noise multiplier from the server's JSON list (one value: every site's).

    A simulation lists one σ per partition id; a deployed site has no partition id, so the server
    sends one value for every site. A list the site cannot read is refused (nothing was sent).
    """
    try:
        sigmas = [float(value) for value in json.loads(values)]
        if len(sigmas) == 1:
            return sigmas[0]
        if partition is None:
            raise SiteRefusal(
                f"The server lists {len(sigmas)} noise multipliers by partition id, which a deployed site "
                "does not have; send one value for every site (--noise-multiplier)."
            )
        return sigmas[partition]
    except (ValueError, TypeError, IndexError) as err:
        if isinstance(err, SiteRefusal):
            raise
        raise SiteRefusal(f"Malformed noise multipliers {values!r} ({err}); nothing was sent.") from None


@dataclass
class FedSCGuard(SiteGuard):
    """One site's checks and ledger for a FedSC run (module docstring).

    Its ledger, budget, caps and refusal words are the one guard of every federated task
    (one class for every federated task).

    ``run`` is the run's state that Flower keeps for this site (JSON-able): the noise multipliers
    and schedule it accepted at its first round, the rounds and k-means releases served so far and
    the ledger lines this run booked. Every check reads the message, the settings, the ledger and
    this state: never a cell.
    """

    settings: SiteSettings
    n_cells: int
    run: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        SiteGuard.__init__(self, self.settings)
        self.adopt(self.run.get("booked", []))  # one ledger copy per simulation worker: this run's lines
        self.delta = resolve_delta(self.settings.delta, self.n_cells)

    def refuse_statistics(self) -> None:
        """Return an exact statistic of the cells (FedSC's pooled gene sums) is refused under DP."""
        if self.private:
            raise SiteRefusal(
                "The server asks for this site's exact per-gene sums; under DP this site sends no un-noised "
                "statistic of its cells."
            )

    def check_run(
        self, run: dict[str, Any], partition: int | None, sample_rate: float, steps: int
    ) -> tuple[float, float]:
        """Check the run's plan and return the ``(σ_training, σ_kmeans)`` this site will use.

        The site uses the server's noise multipliers when they are at least its own (more noise only
        lowers its spend), else refuses. ``partition``: the site's index in the server's lists of
        noise multipliers (a simulation); ``None`` (a deployed site): the lists must hold one value,
        for every site. Called at the first round; the result is kept for the run.
        """
        if self.settings.donor_key is not None:
            raise SiteRefusal(
                "FedSC protects each cell, and this site's settings protect each donor with all their "
                f"cells (donor_key={self.settings.donor_key!r}); FedSC has no donor-level plan, so this "
                "site serves it only without a donor_key."
            )
        if int(run.get("noise-seed", -1)) >= 0:
            raise SiteRefusal(
                "The server sent a noise seed; a site draws its noise from its own secret source."
            )
        rounds = int(run["rounds"]) * int(run["local-epochs"])
        if rounds > self.settings.max_rounds:
            raise SiteRefusal(
                f"The run has {rounds} local epochs of rounds; this site serves at most "
                f"{self.settings.max_rounds}."
            )
        if not self.private:
            return 0.0, 0.0
        if not run.get("noise-multipliers"):
            raise SiteRefusal(
                "The server asks for weights trained without noise; this site's settings give it an epsilon."
            )
        served = site_sigma(run["noise-multipliers"], partition)
        kmeans_served = site_sigma(run["kmeans-noise-multipliers"], partition)
        own = fedsc_plan(
            float(self.settings.epsilon), self.delta, sample_rate, steps, self.settings.accountant
        )
        for name, given, needed in (
            ("training", served, own.sigma("training")),
            ("k-means", kmeans_served, own.sigma("kmeans")),
        ):
            if given < needed * (1 - 1e-9):
                raise SiteRefusal(
                    f"The server's {name} noise multiplier ({given:.4g}) is below this site's own "
                    "calibration "
                    f"({needed:.4g} for epsilon={self.settings.epsilon:g}); it would spend more than "
                    "the site allows."
                )
        served_plan = own.with_sigmas(delta=self.delta, training=float(served), kmeans=float(kmeans_served))
        planned = self._record(served_plan.history(), "run")
        self.check_run_budget(ledger_entry(planned, "run", "planned"))
        return float(served), float(kmeans_served)

    def start(
        self, run: dict[str, Any], partition: int | None, sample_rate: float, steps_per_epoch: int
    ) -> None:
        """Check the run at its first round (:meth:`check_run`) and fix its schedule in :attr:`run`."""
        if "rounds" in self.run:
            return
        rounds, epochs = int(run["rounds"]), int(run["local-epochs"])
        total = rounds * epochs * steps_per_epoch
        sigma, kmeans_sigma = self.check_run(run, partition, sample_rate, total)
        self.run.update(
            {"rounds": rounds, "local-epochs": epochs, "sigma": sigma, "kmeans-sigma": kmeans_sigma},
            steps=total,
            served=0,
            kmeans=0,
            booked=[],
        )

    def check_round(self, server_round: int, local_epochs: int) -> None:
        """Refuse a round that is not the next of the run's schedule, or not of its local epochs."""
        served, rounds = int(self.run["served"]), int(self.run["rounds"])
        if server_round != served + 1 or server_round > rounds:
            raise SiteRefusal(
                f"The server asks for round {server_round}; this site has served {served} of the run's "
                f"{rounds} rounds (each round is served once, in order); nothing was sent."
            )
        if local_epochs != int(self.run["local-epochs"]):
            raise SiteRefusal(
                f"The server asks for {local_epochs} local epochs in round {server_round}; the run's plan "
                f"has {self.run['local-epochs']} per round; nothing was sent."
            )

    def check_kmeans(self, index: int, assignment: Assignment, n_clusters: int, d: int) -> None:
        """Refuse a k-means release that is not the next of :func:`kmeans_schedule`, after every round."""
        if int(self.run.get("served", -1)) != int(self.run.get("rounds", 0)):
            raise SiteRefusal(
                "The server asks for a k-means table before the run's training rounds were all served; "
                "nothing was sent."
            )
        schedule, served = kmeans_schedule(n_clusters, d), int(self.run["kmeans"])
        if index != served or index >= len(schedule):
            raise SiteRefusal(
                f"The server asks for k-means release {index}; the next of the run's {len(schedule)} is "
                f"{served} (each is served once, in order); nothing was sent."
            )
        kind, largest = schedule[index]
        try:
            matrix = np.asarray(assignment.matrix, dtype=np.float64)
        except (TypeError, ValueError):
            raise SiteRefusal(
                "Malformed k-means request: its matrix is not numeric; nothing was sent."
            ) from None
        if kind == "sketch":
            shape_ok = matrix.shape == largest
        else:  # the Lloyd centroids: at most m of them, each of d coordinates
            shape_ok = matrix.ndim == 2 and 1 <= matrix.shape[0] <= largest[0] and matrix.shape[1] == d
        if assignment.kind != kind or not shape_ok:
            raise SiteRefusal(
                f"Malformed k-means request: release {index} is a {kind!r} matrix of at most {largest}, "
                f"got {assignment.kind!r} of shape {matrix.shape}; nothing was sent."
            )
        if not np.isfinite(matrix).all() or np.abs(matrix).max(initial=0.0) > MAX_PUBLIC_VALUE:
            raise SiteRefusal("Malformed k-means request: values not finite or too large; nothing was sent.")

    def _record(self, history: list[tuple[float, float, int]], what: str) -> PrivacyRecord:
        return PrivacyRecord.message(
            f"FedSC ({what})", history, self.delta, noise=self.noise, accountant=self.settings.accountant
        )

    def book(self, history: list[tuple[float, float, int]], key: str, share_of_delta: float) -> None:
        """Book what this reply releases before it leaves: within the run's own ε, then the budget.

        The run's lines with this one must stay within the site's ε for one run
        (:func:`~._trust.run_cap_refusal`); the ledger's total within its budget (atomically).
        """
        if not self.private:
            return
        record = self._record(history, key)
        record.delta = self.delta * share_of_delta
        line = plain_entry(ledger_entry(record, key, "sent"))
        booked = self.run.setdefault("booked", [])
        self.book_line(line, booked, self.delta, f"the {key}")
        booked.append(line)

    def kmeans_table(
        self, embeddings: np.ndarray, assignment: Assignment, index: int, n_clusters: int
    ) -> np.ndarray:
        """Return this site's noisy k-means table of its embedded cells (lattice vector, full noise).

        The request is checked first (:meth:`check_kmeans`); σ is the one this site accepted for the
        run (:meth:`start`), never a value of the message.
        """
        sigma = float(self.run.get("kmeans-sigma", 0.0))
        if self.private and not sigma > 0:
            raise SiteRefusal("The server asks for an un-noised k-means table; this site has an epsilon.")
        self.check_kmeans(index, assignment, n_clusters, embeddings.shape[1])
        total_steps = int(self.run["steps"])
        points = kmeans_points(embeddings, "cosine")
        spec = table_release(assignment.n_rows, points.shape[1], CLIP_NORM, KMEANS_PLAN["count_scale"], sigma)
        vector = spec.encode(kmeans_table(points, assignment, CLIP_NORM, KMEANS_PLAN["count_scale"]))
        if self.private:
            vector = vector + spec.noise(self.noise.stream("fedsc.kmeans", index))
        self.book([(sigma, 1.0, 1)], f"k-means release {index}", 1.0 / (total_steps + KMEANS_STEPS))
        self.run["kmeans"] = index + 1
        return vector


FEDERATED_NOT_COVERED = (
    "the embeddings and clusters written to this AnnData (computed on the cells themselves), the "
    "number of cells per site (treated as public), and site-level privacy (whether a site took part, "
    "or its whole data set)"
)


@dataclass(frozen=True)
class FedSCPrivacy:
    """The privacy options of one ``fit_federated`` run, as the user gave them (ε of each site)."""

    epsilon: float | None
    delta: float
    optimizer: str
    accountant: str
    max_grad_norm: float
    n_obs: int
    noise: NoiseSource
    scale_genes: bool


def federation_plan(plans: dict[str, ReleasePlan] | None) -> ReleasePlan:
    """Return the plan a federated fit books on the pooled cells: its worst site's, or a reading.

    A cell belongs to one site and is protected by its own site's plan, so the federation spends
    the most any site's plan spends (parallel composition, McSherry 2009).
    """
    if plans is None:
        return ReleasePlan.reading("federated fit")
    return max(plans.values(), key=lambda site: site.spent())


def federated_record(plans: dict[str, ReleasePlan] | None, options: FedSCPrivacy) -> PrivacyRecord:
    """Record of a federated fit: per-site DP-SGD and DP k-means (parallel composition), or none.

    A cell belongs to one site, so it is protected by its own site's (ε_k, δ): the ledger entry
    carries the worst site's history, max_k ε_k (parallel composition, McSherry 2009).
    """
    accountant, optimizer = options.accountant, options.optimizer
    n_obs, noise, scale_genes = options.n_obs, options.noise, options.scale_genes
    unit = f"adding or removing one cell of its site ({n_obs} cells in all)"
    if plans is None:
        covered = "the global model, the final clustering and every message a site sent" + (
            ", including each site's per-gene sums" if scale_genes else ""
        )
        return no_guarantee_record("fit_federated", unit=unit, covered=covered)
    per_site = {name: site.spent() for name, site in plans.items()}
    worst = max(per_site, key=per_site.get)
    training = {name: site["training"] for name, site in plans.items()}
    kmeans = {name: site.sigma("kmeans") for name, site in plans.items()}
    covered = (
        "every message a site sends (the weights after each round and its noisy k-means tables, hence "
        "everything the server and the other sites see), the final global model and the centroids "
        "(post-processing); each cell by its own site's ε (per site in 'epsilon_per_site')"
    )
    return plans[worst].record(
        "fit_federated",
        unit=unit,
        mechanism=f"DP-SGD at every site ({optimizer} update on the noisy gradient, Poisson sampling) "
        f"and DP k-means tables with each site's full noise, composed by the Opacus {accountant.upper()} "
        "accountant; each site calibrates its own noise, drawn by each site, never by the server",
        covered=covered,
        not_covered=FEDERATED_NOT_COVERED,
        noise=noise,
        mechanisms=[
            f"site {k}: DP-SGD sigma={t.sigma:.4g}, q={t.sample_rate:.4g}; k-means sigma={kmeans[k]:.4g}"
            for k, t in training.items()
        ],
        noise_multiplier=training[worst].sigma,
        sample_rate=training[worst].sample_rate,
        max_grad_norm=options.max_grad_norm,
        scope="site",
        details={
            "epsilon_per_site": per_site,
            "noise_multiplier_per_site": {k: t.sigma for k, t in training.items()},
            "kmeans_noise_multiplier_per_site": kmeans,
            "sample_rate_per_site": {k: t.sample_rate for k, t in training.items()},
            "steps_per_site": {k: t.steps for k, t in training.items()},
            "optimizer": optimizer,
        },
    )
