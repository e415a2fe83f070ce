"""``dpsc.tl.audit``: membership-inference audit of a DP-DCAN fit."""

from __future__ import annotations

from typing import Any, Literal

import anndata as ad
import pandas as pd

from .._api import DEFAULT_EPSILON
from .._validation import resolve_delta
from ..audit import ATTACKS, shadow_audit
from ..privacy import PrivacyRecord, ReleasePlan, no_guarantee_record, write_record
from ._audit_one_run import one_run_audit
from ._fit import fit


def audit(
    adata: ad.AnnData,
    *,
    epsilon: float | None = DEFAULT_EPSILON,
    delta: float | None = None,
    method: Literal["shadow", "one_run"] = "shadow",
    attack: Literal["shadow", "threshold", "both"] = "shadow",
    n_shadow: int = 1,
    features: Literal["encoder", "encoder+decoder"] = "encoder",
    random_state: int = 0,
    canaries: Literal["gradient", "input"] = "gradient",
    n_canaries: int = 1000,
    guess_fraction: float = 0.1,
    confidence: float = 0.95,
    noise_seed: int | None = None,
    donor_key: str | None = None,
    key_added: str = "audit",
    **fit_kwargs: Any,
) -> pd.DataFrame:
    """Audit DP-DCAN's privacy: a one-run canary audit, or membership inference on trained models.

    ``method="one_run"`` (Steinke, Nasr & Jagielski 2023): one DP-SGD run of DP-DCAN's encoder on
    these cells, through the same engine as :func:`dpsc.tl.fit`, with ``n_canaries`` white-box
    gradient canaries (:class:`dpsc.audit.GradientCanaries`), each included with probability ½;
    the auditor guesses ``guess_fraction`` of them on each side and turns the correct guesses into
    an ε lower bound at ``confidence`` (:func:`dpsc.audit.one_run_bound`), valid although the
    canaries share one run. Returns one row with ``epsilon_claimed``, ``epsilon_lower``,
    ``confidence``, ``n_canaries``, ``ceiling`` (the largest bound these canaries could give) and
    the run's σ, q and steps. ``fit_kwargs`` go to :func:`dpsc.audit.gradient_canary_run`
    (``epochs``, ``batch_size``, ``accountant``, ``max_grad_norm``, ``n_hidden``, ...); the tightest
    audit uses ``batch_size=adata.n_obs`` (q = 1) and ``accountant="prv"``. The run is a ledger entry
    (its report is post-processing of its noisy gradients).

    ``canaries="input"`` audits a whole default fit from the outside
    (:func:`dpsc.audit.input_canary_run`): ``n_canaries`` canary cells (real cells with their counts
    permuted across genes) are each added to the cells with probability ½, one :func:`dpsc.tl.fit`
    with ``fit_kwargs`` (e.g. ``scope``) runs on the union, and each canary is scored from the
    released model: the shared encoder's masked-view agreement, and the decoder's reconstruction
    loss (which a ``scope="paper"`` fit never shares). One row per score; the fit is a ledger entry of
    these cells.

    ``method="shadow"`` (default): membership inference, as follows.

    The cells are split 2:1:2:1 into target-train, target-test, shadow-train and shadow-test
    (Ghosh & Das). A target model is trained on target-train with ``fit_kwargs``; each shadow
    model is trained the same way on a fresh 2/3 of the shadow cells. The attacker sees only
    what the receiver of a shared model can compute: encoder outputs (sorted soft assignments,
    distance to the nearest centroid, agreement of masked views; see
    :func:`dpsc.audit.encoder_features`), never the decoder.

    Attacks: ``"shadow"`` — a random forest trained on the shadow models' member/non-member
    features scores the target's cells; ``"threshold"`` — the masked-view agreement itself is
    the score (its direction learned on the shadow models). For both, the decision threshold is
    chosen on shadow data and the metrics are measured on the target: AUC, balanced accuracy,
    TPR at FPR ≤ 1 % / 10 %, and an empirical ε lower bound at ``delta`` with 95 %
    Clopper–Pearson confidence (:func:`dpsc.audit.epsilon_lower_bound`). Caveat: the members are
    the training cells of one fit, not independently inserted canaries, so the bound is an
    average-case audit, not a worst-case one; it must never exceed the claimed ε.

    Parameters
    ----------
    adata
        Cells × genes with raw counts (as for :func:`dpsc.tl.fit`); it is only read, except for
        ``uns["dpsc"]["audit"]``.
    epsilon, delta
        Privacy of the audited fits (``epsilon=None``: non-private, for contrast);
        ``delta=None``: 10⁻⁵, or 1/(10 n) above 10⁴ cells.
    method
        ``"shadow"`` (membership inference) or ``"one_run"`` (canary audit).
    canaries, n_canaries, guess_fraction, confidence, noise_seed
        One-run audit only: the canary kind (``"gradient"`` or ``"input"``), m, the share of
        canaries guessed on each side (fixed before the run), the confidence of the bound, and
        the noise-seed opt-in.
    attack
        ``"shadow"``, ``"threshold"`` or ``"both"``.
    n_shadow
        Number of shadow models.
    features
        ``"encoder"`` (default: what a receiver of the shared model can compute) or
        ``"encoder+decoder"``, which adds two attacks that also use the per-cell reconstruction
        loss through the decoder (:func:`dpsc.audit.reconstruction_loss`): legitimate for
        ``scope="full"`` and ``"encoder"`` models, and for ``scope="paper"`` a measure of what
        releasing the decoder would leak.
    random_state
        Seed of the split, the fits and the attack.
    donor_key
        Audit the donor-level guarantee (``method="one_run"``, ``canaries="input"`` only): each
        canary is a donor of up to :data:`dpsc.audit.CANARY_DONOR_CELLS` permuted cells of one real
        donor, and the audited fit is ``dpsc.tl.fit(donor_key=...)``; the bound is then per donor
        (:func:`dpsc.audit.input_canary_run`).
    key_added
        Where the report and its record go: ``uns["dpsc"][key_added]`` (two audits under two keys
        keep both reports). The audit is an evaluation, not an annotation of the cells: it returns
        its table and has no ``copy``.
    **fit_kwargs
        Passed to :func:`dpsc.tl.fit` for target and shadow models (e.g. ``max_epochs``,
        ``optimizer``, ``scope``, ``layer``).

    Returns
    -------
    DataFrame with one row per attack; also written to ``adata.uns["dpsc"][key_added]`` with the
    ROC curves.
    """
    delta = resolve_delta(delta, adata.n_obs)
    if donor_key is not None and (method, canaries) != ("one_run", "input"):
        raise ValueError(
            "dpsc.tl.audit: donor_key audits the donor-level guarantee with canary donors: pass "
            "method='one_run', canaries='input' (gradient canaries and the membership split are per cell)."
        )
    if donor_key is not None:
        fit_kwargs["donor_key"] = donor_key
    if method == "one_run":
        return one_run_audit(
            adata,
            fit=fit,
            epsilon=epsilon,
            delta=delta,
            canaries=canaries,
            n_canaries=n_canaries,
            guess_fraction=guess_fraction,
            confidence=confidence,
            layer=fit_kwargs.pop("layer", None),
            random_state=random_state,
            noise_seed=noise_seed,
            key_added=key_added,
            **fit_kwargs,
        )
    if method != "shadow":
        raise ValueError(f"Unknown method {method!r}; choose 'shadow' or 'one_run'.")
    if attack not in ATTACKS:
        raise ValueError(f"Unknown attack {attack!r}; choose one of {ATTACKS}.")
    if features not in ("encoder", "encoder+decoder"):
        raise ValueError(f"Unknown features {features!r}; choose 'encoder' or 'encoder+decoder'.")
    if n_shadow < 1:
        raise ValueError(f"n_shadow must be at least 1, got {n_shadow}.")
    for key in ("copy", "key_added", "cluster_key", "random_state", "epsilon", "delta"):
        if key in fit_kwargs:
            raise ValueError(f"{key!r} is set by the audit itself; remove it from the arguments.")
    record = audit_record(adata.n_obs)
    with ReleasePlan.reading("audit report").spend(adata, record, key_added) as spent:
        table, report = shadow_audit(
            adata,
            fit=fit,
            epsilon=epsilon,
            delta=delta,
            attack=attack,
            n_shadow=n_shadow,
            features=features,
            random_state=random_state,
            fit_kwargs=fit_kwargs,
        )
        write_record(adata, key_added, record, **report)
        spent.booking.settle(record)
    return table


def audit_record(n_obs: int) -> PrivacyRecord:
    """Ledger record of a membership audit: its report reads the cells and their membership without noise."""
    covered = "the audit report (attack scores, ROC curves) and the target and shadow models"
    return no_guarantee_record("audit", unit=f"the {n_obs} audited cells", covered=covered)
