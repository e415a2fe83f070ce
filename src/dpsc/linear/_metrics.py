"""Evaluation metrics for drug-sensitivity prediction."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from scipy.special import ndtr
from scipy.stats import spearmanr

from .._api import renamed_arguments


def spearman(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Spearman's rank correlation (``nan`` when a side is constant)."""
    return float(spearmanr(y_true, y_pred).statistic)


def probabilistic_c_index(y_true: np.ndarray, y_pred: np.ndarray, noise_sd: float = 0.0) -> float:
    r"""Probabilistic concordance index of one drug (the pc-index of the NCI-DREAM challenge).

    For every pair :math:`i < j` the score is the probability that the true responses are ordered
    as predicted, when each measured response carries Gaussian noise of s.d. :math:`s`:

    .. math:: pc = \binom n2^{-1}\sum_{i<j} \Phi\!\left(\operatorname{sign}(\hat y_i - \hat y_j)
       \frac{y_i - y_j}{\sqrt2\, s}\right),

    a tie in the predictions scores 1/2. With :math:`s = 0` this is the ordinary concordance
    index (Φ becomes a step function, ties in :math:`y` score 1/2).
    """
    y_true = np.asarray(y_true, dtype=float)
    y_pred = np.asarray(y_pred, dtype=float)
    i, j = np.triu_indices(y_true.size, k=1)
    sign = np.sign(y_pred[i] - y_pred[j])
    diff = y_true[i] - y_true[j]
    if noise_sd > 0:
        prob = ndtr(sign * diff / (np.sqrt(2) * noise_sd))
    else:
        prob = 0.5 * (1 + np.sign(sign * diff))
    prob = np.where(sign == 0, 0.5, prob)
    return float(prob.mean())


@renamed_arguments("dpsc.linear.null_pc_sd", seed="random_state")
def null_pc_sd(
    y_true: np.ndarray,
    noise_sd: float = 0.0,
    n_permutations: int = 200,
    random_state: int = 0,
) -> float:
    """Return the standard deviation of the pc-index of random predictions (permutations of the truth)."""
    rng = np.random.default_rng(random_state)
    y_true = np.asarray(y_true, dtype=float)
    values = [probabilistic_c_index(y_true, rng.permutation(y_true), noise_sd) for _ in range(n_permutations)]
    return float(np.std(values))


def wpc_index(pc: Mapping[str, float], null_sd: Mapping[str, float]) -> float:
    r"""Weighted probabilistic c-index over drugs: :math:`\sum_d w_d\, pc_d / \sum_d w_d`.

    Our reading of the DREAM weighting: a drug counts more when its pc-index is more
    informative, i.e. :math:`w_d = 1/\mathrm{sd}_d` with :math:`\mathrm{sd}_d` the s.d. of the
    drug's pc-index under random predictions (:func:`null_pc_sd`).
    """
    drugs = list(pc)
    weights = np.array([1.0 / null_sd[d] for d in drugs])
    values = np.array([pc[d] for d in drugs])
    return float((weights * values).sum() / weights.sum())
