"""``dpsc.tl.audit``: membership-inference audit of a DP-DCAN fit."""

from __future__ import annotations

from typing import Any, Literal

import anndata as ad
import numpy as np
import pandas as pd
from sklearn.ensemble import RandomForestClassifier
from sklearn.metrics import roc_auc_score, roc_curve
from sklearn.model_selection import cross_val_predict

from .._validation import resolve_delta
from ..audit import attack_metrics, best_thresholds, encoder_features, reconstruction_loss
from ..privacy import PrivacyRecord, no_guarantee_record, write_result
from ._audit_one_run import one_run_audit
from ._fit import fit

ATTACKS = ("shadow", "threshold", "both")
MIN_PART = 10  # cells in the smallest (1/6) part


def split_2121(n_obs: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Split cell indices into target-train / target-test / shadow-train / shadow-test as 2:1:2:1."""
    if n_obs // 6 < MIN_PART:
        raise ValueError(
            f"An audit splits the cells 2:1:2:1 (target train/test, shadow train/test) and needs at "
            f"least {6 * MIN_PART} cells; got {n_obs}. Audit on a larger data set."
        )
    perm = rng.permutation(n_obs)
    unit = n_obs // 6
    cuts = np.cumsum([2 * unit, unit, 2 * unit])
    parts = np.split(perm, cuts)
    return dict(zip(("target_train", "target_test", "shadow_train", "shadow_test"), parts, strict=True))


def _train(adata: ad.AnnData, idx: np.ndarray, epsilon: float | None, fit_kwargs: dict, seed: int):
    """Fit a DP-DCAN on a copy of the given cells (the user's AnnData is not modified)."""
    return fit(
        adata[np.sort(idx)].copy(), epsilon=epsilon, random_state=seed, return_model=True, **fit_kwargs
    )


def _features(module: Any, X: Any, features: str, seed: int) -> dict[str, np.ndarray]:
    """Attack feature sets and single scores of each cell (decoder ones only if asked)."""
    feat, agree = encoder_features(module, X, seed=seed)
    out = {"encoder": feat, "agreement": agree}
    if features == "encoder+decoder":
        recon = reconstruction_loss(module, X)
        out["encoder+decoder"] = np.column_stack([feat, recon])
        out["reconstruction"] = recon
    return out


def _x(adata: ad.AnnData, idx: np.ndarray, layer: str | None) -> Any:
    """Rows ``idx`` of the count matrix."""
    matrix = adata.X if layer is None else adata.layers[layer]
    return matrix[idx]


def audit(
    adata: ad.AnnData,
    *,
    epsilon: float | None = 8.0,
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
    loss (shared only under ``scope="full"``). One row per score; the fit is a ledger entry of
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
        ``scope="full"`` models, and for ``scope="encoder"`` a measure of what releasing the
        decoder would leak.
    random_state
        Seed of the split, the fits and the attack.
    **fit_kwargs
        Passed to :func:`dpsc.tl.fit` for target and shadow models (e.g. ``max_epochs``,
        ``optimizer``, ``scope``, ``layer``).

    Returns
    -------
    DataFrame with one row per attack; also written to ``adata.uns["dpsc"]["audit"]`` with the
    ROC curves.
    """
    delta = resolve_delta(delta, adata.n_obs)
    if method == "one_run":
        return one_run_audit(
            adata,
            epsilon=epsilon,
            delta=delta,
            canaries=canaries,
            n_canaries=n_canaries,
            guess_fraction=guess_fraction,
            confidence=confidence,
            layer=fit_kwargs.pop("layer", None),
            random_state=random_state,
            noise_seed=noise_seed,
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
    fit_kwargs = {"delta": delta, **fit_kwargs}
    user_adata = adata
    layer = fit_kwargs.get("layer")
    rng = np.random.default_rng(random_state)
    parts = split_2121(adata.n_obs, rng)
    pool = np.concatenate([parts["shadow_train"], parts["shadow_test"]])
    n_in = parts["shadow_train"].size
    shadow_sets = [pool] + [rng.permutation(pool) for _ in range(n_shadow - 1)]
    # Every fit needs each gene to have counts in its training cells: keep the genes that do in
    # all training sets (the audit is run by the data holder and releases nothing).
    matrix = adata.X if layer is None else adata.layers[layer]
    keep = np.ones(adata.n_vars, dtype=bool)
    for members in [parts["target_train"]] + [perm[:n_in] for perm in shadow_sets]:
        keep &= np.asarray((matrix[members] != 0).sum(0)).ravel() > 0
    adata = adata[:, keep]

    target = _train(adata, parts["target_train"], epsilon, fit_kwargs, random_state)
    t_idx = np.concatenate([parts["target_train"], parts["target_test"]])
    t_lab = np.r_[np.ones(parts["target_train"].size, bool), np.zeros(parts["target_test"].size, bool)]
    t_feat = _features(target.module, _x(adata, t_idx, layer), features, random_state)

    # Shadow models are trained for every attack: the thresholds are always placed on shadow data.
    s_parts, s_labs = [], []
    for s, perm in enumerate(shadow_sets):
        members, non_members = perm[:n_in], perm[n_in:]
        shadow = _train(adata, members, epsilon, fit_kwargs, random_state + 1000 * (s + 1))
        idx = np.concatenate([members, non_members])
        s_parts.append(_features(shadow.module, _x(adata, idx, layer), features, random_state + s + 1))
        s_labs.append(np.r_[np.ones(members.size, bool), np.zeros(non_members.size, bool)])
    s_feat = {k: np.concatenate([p[k] for p in s_parts]) for k in t_feat}
    s_lab = np.concatenate(s_labs)

    decoder = features == "encoder+decoder"
    rows, curves = [], {}
    if attack in ("shadow", "both"):
        sets = {"shadow": "encoder"}
        if decoder:
            sets["shadow (encoder+decoder)"] = "encoder+decoder"
        for name, key in sets.items():
            clf = RandomForestClassifier(n_estimators=300, min_samples_leaf=5, random_state=random_state)
            # Out-of-fold scores of the shadow cells place the thresholds without in-sample bias.
            s_score = cross_val_predict(clf, s_feat[key], s_lab, cv=5, method="predict_proba")[:, 1]
            t_score = clf.fit(s_feat[key], s_lab).predict_proba(t_feat[key])[:, 1]
            thr = best_thresholds(s_lab, s_score, delta)
            rows.append({"attack": name, **attack_metrics(t_lab, t_score, thresholds=thr, delta=delta)})
            curves[name] = roc_curve(t_lab, t_score)[:2]
    if attack in ("threshold", "both"):
        scores = {"threshold": "agreement"}
        if decoder:
            scores["threshold (reconstruction)"] = "reconstruction"
        for name, key in scores.items():
            s_score, t_score = s_feat[key], t_feat[key]
            # The attacker learns the direction of the signal from the shadow models.
            if roc_auc_score(s_lab, s_score) < 0.5:
                s_score, t_score = -s_score, -t_score
            thr = best_thresholds(s_lab, s_score, delta)
            rows.append({"attack": name, **attack_metrics(t_lab, t_score, thresholds=thr, delta=delta)})
            curves[name] = roc_curve(t_lab, t_score)[:2]

    claimed = float(target.privacy_["epsilon"]) if epsilon is not None else float("inf")
    table = pd.DataFrame(rows).assign(claimed_epsilon=claimed, delta=delta, n_shadow=n_shadow)
    report = {
        "table": {c: table[c].tolist() for c in table.columns},
        "roc": {k: {"fpr": v[0].tolist(), "tpr": v[1].tolist()} for k, v in curves.items()},
        "claimed_epsilon": claimed if np.isfinite(claimed) else "inf",
        "delta": delta,
        "n_cells": {k: int(v.size) for k, v in parts.items()},
        "n_genes": int(keep.sum()),
        "features": features,
        "statement": (
            "claimed_epsilon is the ε the audited fits spent; what it covers is the target model's "
            f"statement: {target.privacy_['statement']} "
            if epsilon is not None
            else "The audited models are non-private; they carry no guarantee. "
        )
        + "epsilon_lower_bound is an empirical, average-case lower bound from one attack at 95 % "
        "confidence; a bound of 0 shows no leak was proven, not that the true ε is small.",
    }
    write_result(user_adata, "audit", audit_record(user_adata.n_obs), **report)
    return table


def audit_record(n_obs: int) -> PrivacyRecord:
    """Ledger record of an audit: its report reads the cells (and their membership) without noise."""
    covered = "the audit report (attack scores, ROC curves) and the target and shadow models"
    return no_guarantee_record("audit", unit=f"the {n_obs} audited cells", covered=covered)
