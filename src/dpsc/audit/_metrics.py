"""Attack metrics and the empirical ε lower bound of a membership-inference attack."""

from __future__ import annotations

import numpy as np
from scipy.stats import beta as beta_dist
from sklearn.metrics import roc_auc_score, roc_curve


def clopper_pearson(successes: int, trials: int, alpha: float = 0.05) -> tuple[float, float]:
    """Two-sided ``1 - alpha`` Clopper–Pearson interval of a binomial proportion."""
    k, n = successes, trials
    lo = 0.0 if k == 0 else float(beta_dist.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta_dist.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def epsilon_lower_bound(
    true_pos: int, n_pos: int, false_pos: int, n_neg: int, delta: float, alpha: float = 0.05
) -> float:
    r"""Empirical ε lower bound from one attack threshold (Kairouz et al. 2015; Jagielski et al. 2020).

    Any (ε, δ)-DP mechanism satisfies :math:`\mathrm{TPR} \le e^\varepsilon\mathrm{FPR} + \delta`
    and :math:`1-\mathrm{FPR} \le e^\varepsilon(1-\mathrm{TPR}) + \delta`, so

    .. math:: \varepsilon \ge \max\Big(\log\frac{\mathrm{TPR}_{lo}-\delta}{\mathrm{FPR}_{hi}},\
       \log\frac{1-\mathrm{FPR}_{hi}-\delta}{1-\mathrm{TPR}_{lo}}\Big),

    with the Clopper–Pearson bounds :math:`\mathrm{TPR}_{lo}`, :math:`\mathrm{FPR}_{hi}` at
    confidence ``1 - alpha`` (so the bound holds with that confidence). Returns 0 when no
    positive bound follows.
    """
    tpr_lo = clopper_pearson(true_pos, n_pos, alpha)[0]
    fpr_hi = clopper_pearson(false_pos, n_neg, alpha)[1]
    bounds = [0.0]
    if tpr_lo - delta > 0 and fpr_hi > 0:
        bounds.append(np.log((tpr_lo - delta) / fpr_hi))
    if 1 - fpr_hi - delta > 0 and 1 - tpr_lo > 0:
        bounds.append(np.log((1 - fpr_hi - delta) / (1 - tpr_lo)))
    return float(max(bounds))


def best_thresholds(labels: np.ndarray, scores: np.ndarray, delta: float) -> dict[str, float]:
    """Thresholds chosen on *reference* (shadow) data: one for accuracy, one for the ε bound.

    ``"accuracy"`` maximises balanced accuracy (TPR − FPR); ``"epsilon"`` maximises the
    Clopper–Pearson ε lower bound of :func:`epsilon_lower_bound` on the reference data.
    """
    labels = np.asarray(labels, dtype=bool)
    fpr, tpr, thresholds = roc_curve(labels, scores)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    finite = np.isfinite(thresholds)
    acc_idx = int(np.argmax(np.where(finite, tpr - fpr, -np.inf)))
    bounds = [
        epsilon_lower_bound(round(t * n_pos), n_pos, round(f * n_neg), n_neg, delta) if ok else -1.0
        for t, f, ok in zip(tpr, fpr, finite, strict=True)
    ]
    return {"accuracy": float(thresholds[acc_idx]), "epsilon": float(thresholds[int(np.argmax(bounds))])}


def attack_metrics(
    labels: np.ndarray, scores: np.ndarray, *, thresholds: dict[str, float], delta: float
) -> dict[str, float]:
    """AUC, balanced accuracy, TPR at FPR ≤ 1 % / 10 %, and the ε lower bound.

    ``thresholds`` (from :func:`best_thresholds`) must come from data other than the attacked
    model's (the shadow models), so that neither accuracy nor the ε bound is fitted to the
    target. Balanced accuracy is the accuracy on a 50/50 member/non-member mix (the 2:1 split
    makes plain accuracy's chance level 2/3).
    """
    labels = np.asarray(labels, dtype=bool)
    scores = np.asarray(scores, dtype=float)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())

    def counts(threshold: float) -> tuple[int, int]:
        pred = scores >= threshold
        return int((pred & labels).sum()), int((pred & ~labels).sum())

    tp_acc, fp_acc = counts(thresholds["accuracy"])
    tp, fp = counts(thresholds["epsilon"])
    fpr, tpr, _ = roc_curve(labels, scores)
    return {
        "auc": float(roc_auc_score(labels, scores)),
        "accuracy": 0.5 * (tp_acc / n_pos + (n_neg - fp_acc) / n_neg),
        "tpr_at_fpr_0.01": float(tpr[fpr <= 0.01].max()),
        "tpr_at_fpr_0.1": float(tpr[fpr <= 0.1].max()),
        "epsilon_lower_bound": epsilon_lower_bound(tp, n_pos, fp, n_neg, delta),
    }
