r"""One-run privacy auditing (Steinke, Nasr & Jagielski 2023, "Privacy auditing with one (1) training run").

:math:`m` canaries are each included in the training run independently with probability ½.
After the run the auditor scores every canary, guesses "included" for the ``k_plus`` highest
scores and "excluded" for the ``k_minus`` lowest, and abstains on the rest; :math:`r` = number of
guesses, :math:`v` = number of correct ones. Their Theorem 5.2 (with the δ term of their
Appendix D): if the run is (ε, δ)-DP in the canaries, then for every :math:`v`

.. math:: \Pr[V \ge v] \le \Pr[\mathrm{Bin}(r, q_\varepsilon) \ge v]
   + 2m\delta \max_{1 \le i \le v} \frac{\Pr[v - i \le \mathrm{Bin}(r, q_\varepsilon) < v]}{i},
   \qquad q_\varepsilon = \frac{e^\varepsilon}{1 + e^\varepsilon}.

The right-hand side is the p-value of the hypothesis "the run is (ε, δ)-DP"; it grows with ε,
and :func:`epsilon_lower_bound` returns the largest ε it rejects at the stated confidence. The
canaries are not independent trials (they share one run), which is exactly what this analysis
allows, unlike Clopper–Pearson. The number of guesses must be fixed before looking at the
scores (choosing it afterwards is a multiple test); :func:`one_run_bound` takes it as an argument.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import expit
from scipy.stats import binom


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P-value of ``v`` correct guesses out of ``r`` (``m`` canaries) under (ε, δ)-DP (module docstring)."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"Need 0 <= v <= r <= m, got v={v}, r={r}, m={m}.")
    q = float(expit(epsilon))
    tail = float(binom.sf(v - 1, r, q))
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    i = np.arange(1, v + 1)
    window = binom.cdf(v - 1, r, q) - binom.cdf(v - 1 - i, r, q)  # P[v - i <= Bin < v]
    return min(tail + 2 * m * delta * float(np.max(window / i)), 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = 0.95) -> float:
    """Largest ε whose (ε, δ)-DP hypothesis ``v`` correct guesses reject at ``confidence`` (0 if none)."""
    alpha = 1.0 - confidence
    if p_value(m, r, v, 0.0, delta) >= alpha:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) < alpha:  # p grows with ε; bracket the crossing
        lo, hi = hi, 2 * hi
        if hi > 1e3:
            return math.inf
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p_value(m, r, v, mid, delta) < alpha else (lo, mid)
    return lo


def one_run_bound(
    scores: np.ndarray,
    included: np.ndarray,
    *,
    k_plus: int,
    k_minus: int,
    delta: float,
    confidence: float = 0.95,
) -> dict[str, float]:
    """Guess top-``k_plus`` as included and bottom-``k_minus`` as excluded; return the ε bound.

    Returns ``epsilon_lower``, ``ceiling`` (the bound if every guess were right: the most these
    ``m`` canaries and ``r`` guesses can ever show), ``n_guesses`` (r), ``n_correct`` (v),
    ``n_canaries`` (m) and ``confidence``.
    """
    scores, included = np.asarray(scores, dtype=float), np.asarray(included, dtype=bool)
    m = scores.size
    if included.shape != (m,) or k_plus < 0 or k_minus < 0 or k_plus + k_minus > m:
        raise ValueError("Need one inclusion flag per score and 0 <= k_plus + k_minus <= n_canaries.")
    order = np.argsort(scores, kind="stable")
    guessed_in, guessed_out = order[m - k_plus :] if k_plus else order[:0], order[:k_minus]
    v = int(included[guessed_in].sum() + (~included[guessed_out]).sum())
    r = k_plus + k_minus
    return {
        "epsilon_lower": epsilon_lower_bound(m, r, v, delta, confidence),
        "ceiling": epsilon_lower_bound(m, r, r, delta, confidence),
        "n_guesses": r,
        "n_correct": v,
        "n_canaries": m,
        "confidence": confidence,
    }
