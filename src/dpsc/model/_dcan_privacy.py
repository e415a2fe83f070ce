r"""What a DP-DCAN fit will spend (planned once, before any work) and what it did spend (its record).

A fit is a sequence of sampled-Gaussian steps, all with the same :math:`(\sigma, q)`: the
DP-SGD steps of both stages, the DP k-means releases of the centroid start and the DEC
frequency releases. :func:`plan_fit` checks every option, counts the planned steps :math:`T`
(:func:`planned_step_counts`) and calibrates σ once so that they spend at most the target ε
(:func:`~dpsc.privacy.calibrate_noise_multiplier`). The :class:`FitPlan` it returns is used for
the budget check *and* handed to :meth:`~dpsc.model.DPDCAN.train`, which trains with it as it is;
the record then reports the accountant's ε after the steps that actually ran.

A model that reads frozen input loadings (``input_pcs``) releases them first: one Gaussian
release of the gene second-moment matrix of its unit-norm cells (sensitivity 1, the release of
:func:`dpsc.pp.pca`), a history entry :math:`(\sigma_V, q = 1, 1)`. That release and the
:math:`T` steps share the target ε in the weights :data:`LOADINGS_SHARE` : 1 −
:data:`LOADINGS_SHARE` (:func:`~dpsc.privacy.split_budget`: one calibration per part).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from .._api import DEFAULT_EPSILON
from .._validation import (
    check_fit_args,
    check_privacy_args,
    check_target_frequency,
    resolve_delta,
)
from ..methods import kmeans_release_steps
from ..methods import type_gate as _type_gate
from ..methods.cluster_design import (
    BRANCHES,
    KINDS,
    MIN_GENES,
    TYPE_COUNT,
    kmeans_plan,
    kmeans_steps,
)
from ..methods.cluster_plan import ClusterPlan, calibrate_genes, cluster_releases, gated_branches
from ..methods.public_basis import PublicBasis
from ..optim import DEFAULT_PRIVATE_LRS, check_optimizer
from ..privacy import (
    DonorRows,
    DPSGDSettings,
    NoiseSource,
    PlannedRelease,
    PlanSettings,
    PoissonSampling,
    PrivacyRecord,
    PrivacyUnit,
    ReleasePlan,
    epsilon_curve,
    make_accountant,
    not_covered_for,
    shared_noise_source,
    with_unit,
)

#: The default unit of privacy: one cell.
PER_CELL = PrivacyUnit()

DECODER_WORDS = {
    "zinb": "decoder (hidden layers and ZINB heads)",
    "gaussian": "decoder (hidden and output layers)",
}
LOADINGS = "input loadings (DP-PCA of the cells)"
GENES = "gene selection (DP gene statistics)"
START = "private clustering the fit starts from (its genes, loadings and centroids)"
START_ON_REFERENCE = "private clustering the fit starts from (its centroids in the reference's basis)"
CHOICE = "choice between its partition and the model's"

#: Weight of the input-loadings release in the ε split of a model with ``input_pcs`` (the
#: training steps get the rest): the DP pipeline's PCA : k-means split.
LOADINGS_SHARE = 0.6

#: DP gene selection inside a fit: a matrix with more genes than :data:`MODEL_GENES` is first
#: reduced to that many by one release of gene statistics (:mod:`dpsc.methods.hvg`), which takes
#: :data:`GENE_SELECTION_SHARE` of the fit's ε. 2000 is the gene count DCAN's architecture and its
#: reference preprocessing are built for; the rule reads only the number of genes.
MODEL_GENES = 2000
GENE_SELECTION_SHARE = 0.1

HEURISTIC_REASON = (
    "under scope='paper' the decoder trains on the cells without noise and the encoder's "
    "gradients pass through it, so every noisy encoder update depends on all cells through that "
    "hidden state and the DP-SGD proof does not apply. Use scope='encoder' (the decoder fixed) or "
    "scope='full' for a proven guarantee."
)
#: What the record says of the decoder under ``scope="encoder"``: it never reads a cell.
FIXED_DECODER = (
    "the decoder is fixed at its initialisation (drawn from random_state, before any cell is read) "
    "and never trains, so it is a public function"
)
#: What the record says of the decoder of a fit pretrained on a public reference.
PRETRAINED_DECODER = (
    "the decoder is pretrained on the public reference without noise, is fixed while the private "
    "cells are read and never trains on them, so it is a public function"
)

#: Training-plan options of :meth:`DPDCAN.train` (``plan_kwargs`` overrides them), as scvi's
#: ``plan_kwargs``: learning rates (``None``: the private optimizer's row of
#: :data:`dpsc.optim.DEFAULT_PRIVATE_LRS`), instance-stage weight ``rho`` and masking rate,
#: cluster-stage loss weights ``betas`` (ZINB, DEC, separation) and target sharpening, DEC's
#: cluster frequencies, and whether the cluster stage trains the encoder.
DEFAULT_PLAN_OPTIONS: dict[str, object] = {
    "instance_lr": 1e-3,
    "cluster_lr": 0.1,
    "private_lr": None,
    "cluster_private_lr": None,
    "rho": 0.8,
    "mask_rate": 0.2,
    "betas": (0.4, 0.4, 0.2),
    "target_power": 2.0,
    "target_frequency": "released",
    "cluster_train_encoder": True,
}

#: Options of the DP k-means start (:func:`~dpsc.methods.dp_kmeans_centroids`) unless
#: ``kmeans_kwargs`` overrides them: clipping radius (``None``: the latent sphere's radius, which
#: clips nothing), 40 sketch releases with 2^6 buckets, 4 noisy Lloyd rounds of 40 releases with
#: 3k centroids reduced to k, count column weighted 0.3·R (docs, Benchmarks: "DP-DCAN benchmark results").
DEFAULT_KMEANS_OPTIONS: dict[str, object] = {
    "clip_norm": None,
    "n_sketch_steps": 40,
    "n_lloyd_rounds": 4,
    "steps_per_round": 40,
    "n_bits": 6,
    "oversampling": 3,
    "count_scale": 0.3,
}

#: A fit that starts from the private clustering (``tl.fit``'s default model) splits its ε over
#: the clustering's releases (:data:`START_SHARE`), the training (:data:`TRAINING_SHARE`) and the
#: choice between the clustering's partition and the trained model's (the rest), by
#: :func:`start_parts`. Leave one file out over 0.6 … 0.9 (docs, Benchmarks: "The default
#: ``tl.fit``'s constants by leave-one-file-out") finds no candidate better than 0.85 beyond the
#: run-to-run noise on any fold; no start share leads 0.85 on the labels, which are the clustering's
#: in every run, and 0.85 keeps twice the training's ε for the embedding the labels do not measure.
START_SHARE = 0.85
TRAINING_SHARE = 0.1
INSTANCE_SHARE = 5 / 9  # max_epochs is split 5:4, the reference's 50 instance + 40 cluster epochs


@dataclass
class TrainSettings:
    """Every option of a DP-DCAN training, with its default: the one table ``tl.fit`` and ``train`` share.

    ``max_epochs``, when given, sets both stages (split 5:4) unless they are given too.
    """

    epsilon: float | None = DEFAULT_EPSILON
    delta: float | None = None
    scope: str = "encoder"
    max_epochs: int | None = None
    instance_epochs: int | None = None
    cluster_epochs: int | None = None
    batch_size: int | None = None
    max_grad_norm: float = 0.1
    accountant: str = "rdp"
    optimizer: str = "sgd"
    plan_kwargs: dict | None = None
    kmeans_kwargs: dict | None = None
    random_state: int = 0
    noise_seed: int | None = None

    def epochs(self) -> tuple[int, int]:
        """``(instance_epochs, cluster_epochs)``: given, or from ``max_epochs``, or 50 + 40."""
        instance, cluster = self.instance_epochs, self.cluster_epochs
        if self.max_epochs is not None:
            if (
                isinstance(self.max_epochs, bool)
                or not isinstance(self.max_epochs, int)
                or self.max_epochs < 2
            ):
                raise ValueError(
                    f"max_epochs must be an integer of at least 2 (one per stage); got {self.max_epochs!r}."
                )
            split = max(1, round(self.max_epochs * INSTANCE_SHARE))
            instance = split if instance is None else instance
            cluster = self.max_epochs - split if cluster is None else cluster
        instance = 50 if instance is None else instance
        cluster = 40 if cluster is None else cluster
        for name, value in (("instance_epochs", instance), ("cluster_epochs", cluster)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}.")
        return int(instance), int(cluster)


def merged_options(given: dict | None, defaults: dict, name: str) -> dict:
    """``defaults`` updated by ``given``; an unknown key fails and names the known ones."""
    unknown = sorted(set(given or {}) - set(defaults))
    if unknown:
        raise ValueError(f"{name} does not take {unknown}; it takes {sorted(defaults)}.")
    return {**defaults, **(given or {})}


def check_options(
    plan_kwargs: dict | None, kmeans_kwargs: dict | None, optimizer: str = "sgd"
) -> tuple[dict, dict]:
    """Return the full plan and k-means options (defaults filled); refuse unknown or bad ones."""
    check_optimizer(optimizer)
    plan = merged_options(plan_kwargs, DEFAULT_PLAN_OPTIONS, "plan_kwargs")
    kmeans = merged_options(kmeans_kwargs, DEFAULT_KMEANS_OPTIONS, "kmeans_kwargs")
    lrs = DEFAULT_PRIVATE_LRS[optimizer]
    if plan["private_lr"] is None:
        plan["private_lr"] = lrs["dpdcan_instance"]
    if plan["cluster_private_lr"] is None:
        plan["cluster_private_lr"] = lrs["dpdcan_cluster"]
    check_target_frequency(plan["target_frequency"])
    return plan, kmeans


#: The accounted releases a DP-DCAN fit plans, by the record detail that counts them: the
#: :func:`planned_step_counts` keys each detail sums, and the words the CLI prints for it.
RELEASE_KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    "dpsgd_steps": (("instance", "cluster"), "DP-SGD steps"),
    "kmeans_steps": (("kmeans",), "DP k-means releases"),
    "frequency_steps": (("frequency",), "cluster-frequency releases"),
    "label_steps": (("labels",), "label-count release"),
}


def release_details(counts: dict[str, int] | None) -> dict[str, int]:
    """Return the record's per-kind release counts (:data:`RELEASE_KINDS`); all 0 for ``None``."""
    return {
        detail: 0 if counts is None else sum(counts[key] for key in keys)
        for detail, (keys, _) in RELEASE_KINDS.items()
    }


def planned_step_counts(
    sample_rate: float,
    *,
    instance_epochs: int,
    cluster_epochs: int,
    n_sketch_steps: int,
    n_lloyd_rounds: int,
    steps_per_round: int,
    target_frequency: str,
) -> dict[str, int]:
    r"""Sampled-Gaussian steps a DP-DCAN fit plans, all at Poisson rate ``sample_rate`` = q.

    An epoch is :math:`E = \max(1, \mathrm{round}(1/q))` batches, so the fit plans

    .. math:: T = (e_{inst} + e_{clu})\,E + (s_{sketch} + r \cdot s_{round}) + f + 1,

    with :math:`f = e_{clu}` frequency releases when ``target_frequency="released"`` (else 0) and
    one release of the trained model's label counts (the cells each cluster labels in one
    Poisson sample, read by the collapse note). Returns ``steps_per_epoch`` (E), ``instance``,
    ``cluster``, ``kmeans``, ``frequency``, ``labels`` and ``total`` (T).
    """
    steps_per_epoch = max(1, round(1.0 / sample_rate))
    counts = {
        "steps_per_epoch": steps_per_epoch,
        "instance": instance_epochs * steps_per_epoch,
        "cluster": cluster_epochs * steps_per_epoch,
        "kmeans": kmeans_release_steps(n_sketch_steps, n_lloyd_rounds, steps_per_round),
        "frequency": cluster_epochs if target_frequency == "released" else 0,
        "labels": 1,
    }
    counts["total"] = sum(release_details(counts).values())
    return counts


@dataclass
class FitPlan(PlanSettings):
    """One fit, fixed before training: options, step counts and its calibrated plan of releases.

    ``releases`` is the fit's plan as the one plan type (:class:`~dpsc.privacy.ReleasePlan`),
    in order: the gene selection and the input loadings (when the fit makes them) or the releases
    of the clustering it starts from (``start``, whose own plan is that part), the DP-SGD steps
    (σ, q, every planned step), then the choice between the two partitions (after a start). Every
    σ of the fit lives there; without ε each is 0 (the releases are exact). ``settings`` is the
    training's DP-SGD settings, ``None`` for a non-private fit. The target (ε, δ), the accountant
    and the training's sampling rate are read from ``releases``, never stored beside it.
    """

    scope: str
    instance_epochs: int
    cluster_epochs: int
    batch_size: int
    optimizer: str
    options: dict
    kmeans: dict
    random_state: int
    counts: dict[str, int]
    settings: DPSGDSettings | None
    noise: NoiseSource
    releases: ReleasePlan
    likelihood: str = "zinb"
    start: ClusterPlan | None = None
    #: The public reference's summary (:meth:`dpsc._public_reference.PublicReference.summary`) when the
    #: fit reads each cell's point in its basis and starts from a model pretrained on it.
    reference: dict | None = None
    #: What one individual is (a cell, or a donor with all of their cells) and, per donor, each
    #: donor's rows for the donor-level Poisson draws (local: never released).
    unit: PrivacyUnit = PER_CELL
    donors: DonorRows | None = None

    @property
    def sample_rate(self) -> float:
        """q, the Poisson rate of the DP-SGD steps."""
        return float(self.releases["training"].sample_rate)

    @property
    def sampling(self) -> PoissonSampling:
        """The fit's Poisson sampler: the training release's q, the fit's secret streams (and donors)."""
        return PoissonSampling(self.sample_rate, self.noise, self.donors)

    def sigma(self, name: str) -> float | None:
        """σ of release ``name`` (0 without ε), ``None`` when the fit does not make it."""
        return self.releases.sigma(name) if name in self.releases else None

    def planned_history(self) -> list[tuple[float, float, int]]:
        """Return the Opacus history the fit will have if every planned step runs."""
        return [] if self.settings is None else self.releases.history()

    def planned_record(self, n_obs: int) -> PrivacyRecord:
        """Return the record the fit will write if every planned step runs (for the budget check)."""
        return dcan_record(self, n_obs, history=self.planned_history() or None)

    def step_full_release(self, noise_multiplier: float, steps: int = 1) -> None:
        """Tell the accountant of a private fit about ``steps`` releases of every cell (q = 1) at σ."""
        if self.settings is not None:
            self.settings.record_full_release(noise_multiplier, steps)

    def params(self) -> dict:
        """Return the settings recorded in ``uns``: the plan options flat, the k-means ones nested."""
        params = {
            "instance_epochs": self.instance_epochs,
            "cluster_epochs": self.cluster_epochs,
            "batch_size": self.batch_size,
            "optimizer": self.optimizer,
            "random_state": self.random_state,
            "noise_seed": self.noise.noise_seed,
            **self.options,
        }
        params["betas"] = list(params["betas"])
        params["kmeans"] = dict(self.kmeans)
        params["planned_steps"] = self.counts["total"]
        return params


@dataclass(frozen=True)
class PlannedTraining:
    """A fit its caller planned and booked (``dpsc.tl.fit``): what :meth:`DPDCAN.train` runs under.

    ``plan`` replaces every privacy and schedule argument of ``train`` (nothing is calibrated
    again); the caller's ledger booking covers it, so ``train`` books nothing itself.
    ``after_training`` runs once the model is trained, before the record is written: the last
    releases of a plan that starts from the private clustering (``dpsc.tl.fit`` chooses the
    partition there), stepped in the plan's accountant so the record includes them.
    """

    plan: FitPlan
    after_training: Callable[[], None] | None = None


def plan_fit(
    settings: TrainSettings,
    n_obs: int,
    *,
    n_clusters: int,
    input_pcs: int | None,
    latent_scale: float | None,
    likelihood: str = "zinb",
    select_genes: bool = False,
    start_n_vars: int | None = None,
    start_basis: PublicBasis | None = None,
    reference: dict | None = None,
    unit: PrivacyUnit = PER_CELL,
    donors: DonorRows | None = None,
) -> FitPlan:
    """Check every option of a fit, count its steps and calibrate σ (and σ_V, σ_G) once. Reads no cell.

    ``select_genes``: the fit starts with the DP gene selection (:data:`MODEL_GENES`), which takes
    :data:`GENE_SELECTION_SHARE` of ε. ``start_n_vars``: the fit starts from the private
    clustering of a matrix with that many genes (:func:`start_parts`; ``select_genes`` and the
    loadings release are then the clustering's). ``start_basis``: that clustering reads each cell's
    point in a public reference's basis (:mod:`dpsc.methods.public_basis`): it releases only its
    k-means, with :data:`START_SHARE` of ε (:func:`start_parts_on_basis`); ``reference`` is that
    reference's summary, for the record. ``unit`` and ``donors``: the donor unit (q is then each
    donor's rate, :class:`~dpsc.privacy.DonorRows`); it needs a fit that starts from the clustering.
    """
    if unit.donor_key is not None and start_n_vars is None:
        raise ValueError(
            "donor_key needs the default model, which starts from the private clustering: "
            "scope='encoder' or 'full', input_pcs='auto', likelihood='zinb' (with or without a reference)."
        )
    instance_epochs, cluster_epochs = settings.epochs()
    batch_size = check_fit_args(
        n_obs=n_obs, n_clusters=n_clusters, scope=settings.scope, batch_size=settings.batch_size
    )
    delta = resolve_delta(settings.delta, n_obs)
    check_privacy_args(settings.epsilon, delta, n_obs)
    make_accountant(settings.accountant)  # refuses unknown names
    options, kmeans = check_options(settings.plan_kwargs, settings.kmeans_kwargs, settings.optimizer)
    if kmeans["clip_norm"] is None:
        if latent_scale is None:
            raise ValueError(
                "With latent_scale=None, pass kmeans_kwargs={'clip_norm': ...} (the DP k-means clipping "
                "radius)."
            )
        kmeans["clip_norm"] = float(latent_scale)
    sample_rate = batch_size / n_obs
    if start_n_vars is not None:  # the centroids start from the clustering's: no latent k-means release
        kmeans.update(n_sketch_steps=0, n_lloyd_rounds=0)
    counts = planned_step_counts(
        sample_rate,
        instance_epochs=instance_epochs,
        cluster_epochs=cluster_epochs,
        target_frequency=options["target_frequency"],
        **{k: kmeans[k] for k in ("n_sketch_steps", "n_lloyd_rounds", "steps_per_round")},
    )
    # data-parallel processes share one secret key: each release is one draw, made alike on each
    noise = NoiseSource(settings.noise_seed) if settings.noise_seed is not None else shared_noise_source()
    start = None
    if start_n_vars is not None:  # the clustering releases the genes and the loadings
        training = (sample_rate, counts["total"])
        start, releases = (
            start_parts(settings, delta, n_obs, start_n_vars, n_clusters, training)
            if start_basis is None
            else start_parts_on_basis(settings, delta, start_n_vars, n_clusters, training, start_basis)
        )
    else:
        parts = own_releases(
            sample_rate, counts["total"], input_pcs=bool(input_pcs), select_genes=select_genes
        )
        releases = ReleasePlan.of(*parts, accountant=settings.accountant).calibrate(settings.epsilon, delta)
    dp = None
    if settings.epsilon is not None:
        dp = releases.dpsgd_settings(
            "training", n_obs=n_obs, max_grad_norm=settings.max_grad_norm, noise=noise
        )
    return FitPlan(
        scope=settings.scope,
        instance_epochs=instance_epochs,
        cluster_epochs=cluster_epochs,
        batch_size=batch_size,
        optimizer=settings.optimizer,
        options=options,
        kmeans=kmeans,
        random_state=settings.random_state,
        counts=counts,
        settings=dp,
        noise=noise,
        releases=releases,
        likelihood=likelihood,
        start=start,
        reference=reference,
        unit=unit,
        donors=donors,
    )


def own_releases(
    sample_rate: float, steps: int, *, input_pcs: bool, select_genes: bool
) -> list[PlannedRelease]:
    """Return the releases of a fit that does not start from the clustering, with their shares.

    DP-SGD's ``steps`` sampled steps; with ``input_pcs`` first the loadings
    (:data:`LOADINGS_SHARE`), with ``select_genes`` before them the gene selection
    (:data:`GENE_SELECTION_SHARE`, the others scaled down).
    """
    training = PlannedRelease("training", sample_rate=sample_rate, steps=steps)
    releases = [training]
    if input_pcs:
        releases = [
            PlannedRelease("loadings", share=LOADINGS_SHARE),
            replace(training, share=1 - LOADINGS_SHARE),
        ]
    if select_genes:
        scaled = [replace(r, share=r.share * (1 - GENE_SELECTION_SHARE)) for r in releases]
        releases = [PlannedRelease("genes", share=GENE_SELECTION_SHARE), *scaled]
    return releases


def start_parts(
    settings: TrainSettings,
    delta: float,
    n_obs: int,
    n_vars: int,
    n_clusters: int,
    training: tuple[float, int],
) -> tuple[ClusterPlan, ReleasePlan]:
    r"""Return the clustering a fit starts from and the fit's whole calibrated plan.

    One calibration (:meth:`~dpsc.privacy.ReleasePlan.calibrate`) over every release of the fit:
    the clustering's releases (their shares :data:`~dpsc.methods.cluster_design.SHARES` scaled to
    :data:`START_SHARE`), the training's sampled steps (``training`` = (q, T)) with
    :data:`TRAINING_SHARE` and the choice between the two partitions
    (:mod:`dpsc.methods.selection`) with the rest. The genes the clustering reads follow its own
    rule (:func:`~dpsc.methods.cluster_design.genes_for`) at the PCA's σ of this split; when the rule
    keeps every gene, the gene release leaves the plan unsearched and its share goes to the others
    (:func:`~dpsc.methods.cluster_plan.calibrate_genes`). The clustering's plan is the first part of
    the fit's, with the same σ. Reads no cell. Without ε every σ is 0 (the exact clustering,
    training and choice).
    """
    kinds = KINDS if n_vars > MIN_GENES else KINDS[1:]
    planned = ReleasePlan.of(
        *cluster_releases(kinds, kmeans_steps(kmeans_plan()), share=START_SHARE),
        *_fit_releases(training),
        accountant=settings.accountant,
    )
    split, n_genes = calibrate_genes(planned, settings.epsilon, delta, n_obs=n_obs, n_vars=n_vars)
    clustering = split.part(*(k for k in kinds if k in split))
    plan = ClusterPlan.of(
        clustering, n_vars=n_vars, n_clusters=n_clusters, n_genes=n_genes, random_state=settings.random_state
    )
    return plan, split


def _fit_releases(training: tuple[float, int]) -> tuple[PlannedRelease, PlannedRelease]:
    """Return the releases of a fit after its clustering: the training's sampled steps, then the choice."""
    return (
        PlannedRelease("training", share=TRAINING_SHARE, sample_rate=training[0], steps=training[1]),
        PlannedRelease("selection", share=1 - START_SHARE - TRAINING_SHARE),
    )


def start_parts_on_basis(
    settings: TrainSettings,
    delta: float,
    n_vars: int,
    n_clusters: int,
    training: tuple[float, int],
    basis: PublicBasis,
) -> tuple[ClusterPlan, ReleasePlan]:
    r"""Return the clustering on a public basis a fit starts from and the fit's whole calibrated plan.

    As :func:`start_parts`, but the genes and loadings are the reference's (no ε): the clustering
    releases only its k-means tables, with :data:`START_SHARE` of ε; the training's sampled steps
    (``training`` = (q, T)) take :data:`TRAINING_SHARE` and the choice the rest. With the types'
    start and radii the clustering opens with the count that chooses its start
    (:mod:`dpsc.methods.type_gate`, its share of the k-means' as in ``tl.cluster``): the fit is
    calibrated once per branch and every release but the k-means gets the larger σ of the two, so
    either branch spends at most (ε, δ). Reads no cell.
    """
    typed = basis.start is not None  # from the reference's types' means
    gated = typed and basis.start_radii is not None
    kinds = (TYPE_COUNT, "kmeans") if gated else ("kmeans",)

    def calibrated(public_start: bool) -> ReleasePlan:
        steps = kmeans_steps(kmeans_plan(public_start=public_start))
        count = [PlannedRelease(TYPE_COUNT, share=START_SHARE * _type_gate.COUNT_SHARE)] if gated else []
        return ReleasePlan.of(
            *count,
            PlannedRelease("kmeans", share=START_SHARE, steps=steps),
            *_fit_releases(training),
            accountant=settings.accountant,
        ).calibrate(settings.epsilon, delta)

    fits = gated_branches([calibrated(start == "types") for start in BRANCHES]) if gated else ()
    split = fits[0] if gated else calibrated(typed)  # a gated fit follows the type start's branch
    plan = ClusterPlan.of(
        split.part(*kinds),
        n_vars=n_vars,
        n_clusters=n_clusters,
        n_genes=len(basis.genes),
        n_comps=basis.n_comps,
        random_state=settings.random_state,
        kmeans=kmeans_plan(public_start=typed),
        public_basis=True,
        branches=tuple(fit.part(*kinds) for fit in fits),
    )
    return plan, split


def dcan_record(
    plan: FitPlan, n_obs: int, *, history: list[tuple[float, float, int]] | None = None
) -> PrivacyRecord:
    """Return the fit's :class:`~dpsc.privacy.PrivacyRecord` (heuristic under ``scope="paper"``).

    Written by the fit's plan (:meth:`~dpsc.privacy.ReleasePlan.record`): its ε is the composition
    of ``history`` (the fit accountant's, the releases that ran, when not given) at δ.
    """
    unit = plan.unit.relation(n_obs)
    releases = plan.releases
    if plan.settings is None:
        return _no_guarantee_record(plan, unit)
    s = plan.settings
    history = s.history if history is None else history
    words = _record_words(plan)
    curve_steps, curve_eps = epsilon_curve(history, plan.delta, plan.accountant)
    details = {
        "private_parameters": words["private"],
        **release_details(plan.counts),
        "curve_steps": curve_steps,
        "curve_epsilon": curve_eps,
        **words["details"],
    }
    record = releases.record(
        "fit",
        unit=unit,
        mechanism=words["mechanism"],
        covered=words["covered"],
        not_covered=words["not_covered"],
        noise=plan.noise,
        history=history,
        guarantee="heuristic" if plan.scope == "paper" else "proven",
        reason=HEURISTIC_REASON,
        target_epsilon=float(plan.epsilon),
        mechanisms=words["mechanisms"],
        noise_multiplier=s.noise_multiplier,
        sample_rate=s.sample_rate,
        max_grad_norm=s.max_grad_norm,
        scope=plan.scope,
        details=details,
    )
    return with_unit(record, plan.unit)


def _no_guarantee_record(plan: FitPlan, unit: str) -> PrivacyRecord:
    """Record of a non-private fit: every parameter read the cells without noise."""
    return PrivacyRecord.stated(
        "fit",
        guarantee="none",
        epsilon=None,
        delta=plan.delta,
        unit=unit,
        mechanism="",
        covered="this model (encoder, decoder, centroids)",
        noise=plan.noise,
        scope="none",
        accountant=plan.accountant,
        sample_rate=plan.sample_rate,
        max_grad_norm=float("inf"),
        details={"private_parameters": [], **release_details(None)},
    )


def _sampling_words(unit: PrivacyUnit) -> str:
    """How the fit's Poisson draws pick cells, in a record's words (:class:`~dpsc.privacy.DonorRows`)."""
    if unit.donor_key is None:
        return "Poisson sampling"
    return (
        "Poisson sampling of donors, each donor drawn bringing one of its cells chosen at random, so a "
        "donor adds at most one clipped gradient or sampled row to a step"
    )


def _record_words(plan: FitPlan) -> dict:
    """Return what a private fit's record says: its private parameters, mechanism and coverage.

    Returns ``private`` (the released parameters, in order), ``mechanism``, ``mechanisms`` (each
    release's σ in words), ``covered``, ``not_covered`` and the ``details`` each optional
    release adds (its σ).
    """
    s = plan.settings
    decoder = DECODER_WORDS[plan.likelihood]
    private = ["encoder weights", "cluster centroids"] + ([decoder] if plan.scope == "full" else [])
    if "loadings" in plan.releases:
        private.insert(0, LOADINGS)
    centroid_start = (
        "start of the centroids at the encoder's image of its released centroids"
        if plan.start
        else "DP k-means start of the centroids"
    )
    covered = (
        f"the released {', '.join(private)}, including the {centroid_start} and the "
        "cluster-frequency and label-count releases, and anything computed from them on other data"
    )
    not_covered = not_covered_for(plan.unit.name)
    if plan.scope == "paper":
        not_covered = (
            f"the {decoder}, trained without noise and never exported by export_shared; " + not_covered
        )
    fixed = f"; {PRETRAINED_DECODER if plan.reference else FIXED_DECODER}" if plan.scope == "encoder" else ""
    trained = "the encoder and the centroids" + (" and the decoder" if plan.scope == "full" else "")
    kmeans = "" if plan.start else "k-means, "  # after a start the centroids need no release
    mechanism = (
        f"DP-SGD (ghost-clipped per-cell gradients, Gaussian noise, {_sampling_words(plan.unit)}) on "
        f"{trained}, plus "
        f"Gaussian {kmeans}frequency and label-count releases, composed by the "
        f"Opacus {plan.accountant.upper()} accountant{fixed}"
    )
    mechanisms = [
        f"sampled Gaussian, sigma={s.noise_multiplier:.4g}, q={s.sample_rate:.4g}, "
        f"C={s.max_grad_norm:g} (DP-SGD) and sensitivity-scaled releases "
        f"({kmeans}frequencies, label counts)"
    ]
    details: dict = {}
    if "loadings" in plan.releases:
        sigma_v = plan.releases.sigma("loadings")
        mechanism = "one Gaussian release of the gene second-moment matrix (the input loadings), " + mechanism
        mechanisms.insert(0, f"Gaussian, sigma={sigma_v:.4g}, sensitivity 1, q=1 (input loadings)")
        details["loadings_noise_multiplier"] = sigma_v
    if plan.start is not None:
        start, sigma_s = plan.start, plan.releases.sigma("selection")
        start_words = START if plan.reference is None else START_ON_REFERENCE
        private[:0] = [start_words]
        private.append(CHOICE)
        sums = (
            "gene statistics when it selects genes, cell sum, second moments, k-means tables"
            if plan.reference is None
            else "k-means tables of each cell's point in the public reference's basis"
        )
        if start.gated:  # which branch ran is in the history the ε composes
            sums = (
                "the count of cells within the reference's types, which chose the k-means start, then " + sums
            )
            details["start_branch_noise_multipliers"] = dict(zip(BRANCHES, start.branch_sigmas, strict=True))
        count = "" if start.gated else f"{start.n_releases} "
        mechanism = (
            f"the private clustering's {count}discrete Gaussian releases ({sums}{plan.unit.weighting}), then "
            + mechanism
            + ", then one discrete Gaussian release of both partitions' tables (the choice)"
        )
        mechanisms[:0] = [f"{name}: sigma={sigma:.4g}, q=1" for name, sigma in start.sigmas.items() if sigma]
        mechanisms.append(f"partition tables: sigma={sigma_s:.4g}, sensitivity 2, q=1 (the choice)")
        details["start_noise_multipliers"] = {k: v for k, v in start.sigmas.items() if v}
        details["selection_noise_multiplier"] = sigma_s
        covered = covered.replace("the released ", f"the released {start_words}, the {CHOICE}, ", 1)
    if plan.reference is not None:
        reference = plan.reference
        details["reference"] = reference
        not_covered = (
            f"the public reference {reference['name']!r} (sha256 {reference['fingerprint'][:16]}…, "
            f"{reference['n_obs']} cells), and the model pretrained on it: they are assumed public, "
            "the reference must not contain these cells, and no epsilon is spent on them; " + not_covered
        )
    if "genes" in plan.releases and plan.start is None:
        sigma_g = plan.releases.sigma("genes")
        private.insert(0, GENES)
        mechanism = "one Gaussian release of gene statistics (the gene selection), " + mechanism
        mechanisms.insert(0, f"Gaussian, sigma={sigma_g:.4g}, sensitivity sqrt(3), q=1 (gene selection)")
        details["genes_noise_multiplier"] = sigma_g
        covered = covered.replace("the released ", f"the released {GENES}, ", 1)
    return {
        "private": private,
        "mechanism": mechanism,
        "mechanisms": mechanisms,
        "covered": covered,
        "not_covered": not_covered,
        "details": details,
    }


__all__ = [
    "RELEASE_KINDS",
    "FitPlan",
    "TrainSettings",
    "dcan_record",
    "plan_fit",
    "planned_step_counts",
    "release_details",
]
