"""Shadow-model membership inference against DP-DCAN fits (Shokri et al. 2017; Ghosh & Das).

The cells are split 2:1:2:1 into target-train, target-test, shadow-train and shadow-test. A
target model is trained on target-train; each shadow model on a fresh 2/3 of the shadow cells.
The attacker sees only what the receiver of a shared model can compute (encoder outputs,
:func:`encoder_features`), and, when asked, the decoder's reconstruction loss. Thresholds are
placed on shadow data, metrics measured on the target.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd
from sklearn.ensemble import RandomForestClassifier
from sklearn.metrics import roc_auc_score, roc_curve
from sklearn.model_selection import cross_val_predict

from ._features import encoder_features, reconstruction_loss
from ._metrics import attack_metrics, best_thresholds

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


def _train(fit: Callable, adata: ad.AnnData, idx: np.ndarray, epsilon, fit_kwargs: dict, seed: int):
    """Fit a DP-DCAN on a copy of the given cells (the user's AnnData is not modified)."""
    return fit(
        adata[np.sort(idx)].copy(), epsilon=epsilon, random_state=seed, return_model=True, **fit_kwargs
    )


def _features(module: Any, X: Any, features: str, seed: int) -> dict[str, np.ndarray]:
    """Attack feature sets and single scores of each cell (decoder ones only if asked)."""
    feat, agree = encoder_features(module, X, random_state=seed)
    out = {"encoder": feat, "agreement": agree}
    if features == "encoder+decoder":
        recon = reconstruction_loss(module, X)
        out["encoder+decoder"] = np.column_stack([feat, recon])
        out["reconstruction"] = recon
    return out


def _x(adata: ad.AnnData, idx: np.ndarray, layer: str | None, model: Any) -> Any:
    """Rows ``idx`` of the count matrix, on the genes the model reads (a fit may select a subset)."""
    matrix = adata.X if layer is None else adata.layers[layer]
    return matrix[idx][:, adata.var_names.get_indexer(model.adata.var_names)]


def shadow_audit(
    adata: ad.AnnData,
    *,
    fit: Callable,
    epsilon: float | None,
    delta: float,
    attack: str,
    n_shadow: int,
    features: str,
    random_state: int,
    fit_kwargs: dict[str, Any],
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Run the attack; return the table (one row per attack) and the report (ROC curves, sizes)."""
    fit_kwargs = {"delta": delta, **fit_kwargs}
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

    target = _train(fit, adata, parts["target_train"], epsilon, fit_kwargs, random_state)
    t_idx = np.concatenate([parts["target_train"], parts["target_test"]])
    t_lab = np.r_[np.ones(parts["target_train"].size, bool), np.zeros(parts["target_test"].size, bool)]
    t_feat = _features(target.module, _x(adata, t_idx, layer, target), features, random_state)

    # Shadow models are trained for every attack: the thresholds are always placed on shadow data.
    s_parts, s_labs = [], []
    for s, perm in enumerate(shadow_sets):
        members, non_members = perm[:n_in], perm[n_in:]
        shadow = _train(fit, adata, members, epsilon, fit_kwargs, random_state + 1000 * (s + 1))
        idx = np.concatenate([members, non_members])
        cells = _x(adata, idx, layer, shadow)
        s_parts.append(_features(shadow.module, cells, features, random_state + s + 1))
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
    return table, report
