r"""What a DP-DCAN fit will spend (planned before any work) and what it did spend (its record).

A fit is a sequence of sampled-Gaussian steps, all with the same :math:`(\sigma, q)`: the
DP-SGD steps of both stages, the DP k-means releases of the centroid start and the DEC
frequency releases. σ is calibrated once, before training, so that the planned total
:math:`T` (:func:`planned_step_counts`) spends at most the target ε
(:func:`~dpsc.privacy.calibrate_noise_multiplier`); the record then reports the accountant's ε
after the steps that actually ran.

A model that reads frozen input loadings (``input_pcs``) releases them first: one Gaussian
release of the gene second-moment matrix of its unit-norm cells (sensitivity 1, the release of
:func:`dpsc.pp.pca`), a history entry :math:`(\sigma_V, q = 1, 1)`. That release and the
:math:`T` steps share the target ε in the weights :data:`LOADINGS_SHARE` : 1 −
:data:`LOADINGS_SHARE` (:func:`~dpsc.privacy.split_budget`, one Opacus accountant for both).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..privacy import (
    COMMON_NOT_COVERED,
    DPSGDSettings,
    NoiseSource,
    PrivacyRecord,
    build_statement,
    calibrate_noise_multiplier,
    epsilon_curve,
    kmeans_release_steps,
    make_accountant,
    spent_epsilon,
    split_budget,
)

DECODER = "decoder (hidden layers and ZINB heads)"
LOADINGS = "input loadings (DP-PCA of the cells)"

#: Weight of the input-loadings release in the ε split of a model with ``input_pcs`` (the
#: training steps get the rest): the DP pipeline's PCA : k-means split (``dpsc.pp.pca`` then
#: ``dpsc.tl.kmeans``, ``benchmarks/dp_pipeline.py``).
LOADINGS_SHARE = 0.6

HEURISTIC_REASON = (
    "under scope='encoder' the decoder trains on the cells without noise and the encoder's "
    "gradients pass through it, so every noisy encoder update depends on all cells through that "
    "hidden state and the DP-SGD proof does not apply. Use scope='full' for a proven guarantee."
)


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

    .. math:: T = (e_{inst} + e_{clu})\,E + (s_{sketch} + r \cdot s_{round}) + f,

    with :math:`f = e_{clu}` frequency releases when ``target_frequency="released"`` (else 0).
    Returns ``steps_per_epoch`` (E), ``instance``, ``cluster``, ``kmeans``, ``frequency`` and
    ``total`` (T).
    """
    steps_per_epoch = max(1, round(1.0 / sample_rate))
    counts = {
        "steps_per_epoch": steps_per_epoch,
        "instance": instance_epochs * steps_per_epoch,
        "cluster": cluster_epochs * steps_per_epoch,
        "kmeans": kmeans_release_steps(n_sketch_steps, n_lloyd_rounds, steps_per_round),
        "frequency": cluster_epochs if target_frequency == "released" else 0,
    }
    counts["total"] = counts["instance"] + counts["cluster"] + counts["kmeans"] + counts["frequency"]
    return counts


@dataclass
class DCANPrivacyPlan:
    """The privacy side of one fit, fixed before training.

    ``settings`` is ``None`` for a non-private fit; ``counts`` are the planned step counts.
    ``loadings_noise_multiplier`` is σ_V of the input-loadings release (0 for exact loadings in a
    non-private fit; ``None`` when the model reads genes).
    """

    epsilon: float | None
    delta: float
    scope: str
    accountant: str
    counts: dict[str, int]
    sample_rate: float
    settings: DPSGDSettings | None
    noise: NoiseSource
    loadings_noise_multiplier: float | None = None

    def planned_record(self, n_obs: int) -> PrivacyRecord:
        """Return the record the fit will write if every planned step runs (for the budget check)."""
        if self.settings is None:
            return dcan_record(self, n_obs, spent=None)
        history = [(self.settings.noise_multiplier, self.sample_rate, self.counts["total"])]
        if self.loadings_noise_multiplier is not None:
            history.insert(0, (self.loadings_noise_multiplier, 1.0, 1))
        accountant = make_accountant(self.accountant)
        accountant.history = history
        return dcan_record(self, n_obs, spent=spent_epsilon(accountant, self.delta), history=history)


def plan_privacy(
    *,
    epsilon: float | None,
    delta: float,
    scope: str,
    n_obs: int,
    batch_size: int,
    counts: dict[str, int],
    max_grad_norm: float,
    accountant: str,
    noise: NoiseSource,
    input_loadings: bool = False,
) -> DCANPrivacyPlan:
    """Calibrate σ for the planned steps (and σ_V for input loadings) and build the DP-SGD settings.

    Reads no cell.
    """
    sample_rate = batch_size / n_obs
    settings = None
    loadings_sigma = 0.0 if input_loadings else None
    if epsilon is not None:
        if input_loadings:
            parts = {
                "loadings": (LOADINGS_SHARE, 1.0, 1),
                "training": (1 - LOADINGS_SHARE, sample_rate, counts["total"]),
            }
            split = split_budget(epsilon, delta, parts, accountant)
            loadings_sigma, sigma = split["loadings"][1], split["training"][1]
        else:
            sigma = calibrate_noise_multiplier(epsilon, delta, sample_rate, counts["total"], accountant)
        settings = DPSGDSettings(
            noise_multiplier=sigma,
            max_grad_norm=max_grad_norm,
            sample_rate=sample_rate,
            expected_batch_size=batch_size,
            accountant=make_accountant(accountant),
            noise=noise,
        )
    return DCANPrivacyPlan(
        epsilon, delta, scope, accountant, counts, sample_rate, settings, noise, loadings_sigma
    )


def plan_fit(settings: dict, n_obs: int) -> DCANPrivacyPlan:
    """Planned steps, calibrated σ and DP-SGD settings of a fit from its checked settings (reads no cell).

    ``settings`` holds ``train``'s arguments with ``batch_size`` resolved and the full ``plan`` and
    ``kmeans`` options (:meth:`dpsc.model.DPDCAN.check_options`).
    """
    counts = planned_step_counts(
        settings["batch_size"] / n_obs,
        instance_epochs=settings["instance_epochs"],
        cluster_epochs=settings["cluster_epochs"],
        target_frequency=settings["plan"]["target_frequency"],
        **{k: settings["kmeans"][k] for k in ("n_sketch_steps", "n_lloyd_rounds", "steps_per_round")},
    )
    return plan_privacy(
        epsilon=settings["epsilon"],
        delta=settings["delta"],
        scope=settings["scope"],
        n_obs=n_obs,
        batch_size=settings["batch_size"],
        counts=counts,
        max_grad_norm=settings["max_grad_norm"],
        accountant=settings["accountant"],
        noise=NoiseSource(settings["noise_seed"]),
        input_loadings=bool(settings.get("input_pcs")),
    )


def dcan_record(
    plan: DCANPrivacyPlan,
    n_obs: int,
    *,
    spent: float | None,
    history: list[tuple[float, float, int]] | None = None,
) -> PrivacyRecord:
    """Return the fit's :class:`~dpsc.privacy.PrivacyRecord` (heuristic under ``scope="encoder"``)."""
    unit = f"adding or removing one of the {n_obs} training cells"
    if plan.settings is None:
        covered = "this model (encoder, decoder, centroids)"
        return PrivacyRecord(
            tool="fit",
            epsilon=None,
            delta=plan.delta,
            guarantee="none",
            statement=build_statement(
                guarantee="none",
                epsilon=None,
                delta=plan.delta,
                unit=unit,
                mechanism="",
                covered=covered,
                not_covered="",
            ),
            covered=covered,
            scope="none",
            accountant=plan.accountant,
            sample_rate=plan.sample_rate,
            max_grad_norm=float("inf"),
            noise=plan.noise.to_dict(),
            details={"private_parameters": [], "kmeans_steps": 0, "frequency_steps": 0},
        )
    s = plan.settings
    history = list(s.accountant.history) if history is None else history
    private = ["encoder weights", "cluster centroids"] + ([DECODER] if plan.scope == "full" else [])
    if plan.loadings_noise_multiplier is not None:
        private.insert(0, LOADINGS)
    covered = (
        f"the released {', '.join(private)}, including the DP k-means start of the centroids and the "
        "cluster-frequency releases, and anything computed from them on other data"
    )
    not_covered = COMMON_NOT_COVERED
    if plan.scope == "encoder":
        not_covered = (
            f"the {DECODER}, trained without noise and never exported by export_shared; " + not_covered
        )
    guarantee = "heuristic" if plan.scope == "encoder" else "proven"
    mechanism = (
        "DP-SGD (ghost-clipped per-cell gradients, Gaussian noise, Poisson sampling) plus Gaussian "
        f"k-means and frequency releases, composed by the Opacus {plan.accountant.upper()} accountant"
    )
    mechanisms = [
        f"sampled Gaussian, sigma={s.noise_multiplier:.4g}, q={s.sample_rate:.4g}, "
        f"C={s.max_grad_norm:g} (DP-SGD) and sensitivity-scaled releases (k-means, frequencies)"
    ]
    curve_steps, curve_eps = epsilon_curve(history, plan.delta, plan.accountant)
    details = {
        "private_parameters": private,
        "kmeans_steps": plan.counts["kmeans"],
        "frequency_steps": plan.counts["frequency"],
        "curve_steps": curve_steps,
        "curve_epsilon": curve_eps,
    }
    if plan.loadings_noise_multiplier is not None:
        sigma_v = plan.loadings_noise_multiplier
        mechanism = "one Gaussian release of the gene second-moment matrix (the input loadings), " + mechanism
        mechanisms.insert(0, f"Gaussian, sigma={sigma_v:.4g}, sensitivity 1, q=1 (input loadings)")
        details["loadings_noise_multiplier"] = sigma_v
    return PrivacyRecord(
        tool="fit",
        epsilon=spent,
        delta=plan.delta,
        guarantee=guarantee,
        statement=build_statement(
            guarantee=guarantee,
            epsilon=spent,
            delta=plan.delta,
            unit=unit,
            mechanism=mechanism,
            covered=covered,
            not_covered=not_covered,
            reason=HEURISTIC_REASON,
            noise=plan.noise.describe(),
        ),
        covered=covered,
        not_covered=not_covered,
        guarantee_reason=HEURISTIC_REASON if guarantee == "heuristic" else "",
        target_epsilon=float(plan.epsilon),
        accountant=plan.accountant,
        mechanisms=mechanisms,
        history=[(float(a), float(b), int(c)) for a, b, c in history],
        noise_multiplier=s.noise_multiplier,
        sample_rate=s.sample_rate,
        steps=int(sum(h[2] for h in history)),
        max_grad_norm=s.max_grad_norm,
        scope=plan.scope,
        noise=plan.noise.to_dict(),
        details=details,
    )
