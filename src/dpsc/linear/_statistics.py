r"""Sufficient statistics of linear regression, their sensitivities and the Laplace release.

The statistics are :math:`S_{xx} = X^\top X` (upper triangle), :math:`S_{xy} = X^\top y` and
:math:`S_{yy} = y^\top y` (Honkela et al. 2018, Eqs. 1–3; :math:`n\,\overline{xx^\top}` etc. in
their notation). Neighbouring data sets differ in one sample (substitution, the sample count
:math:`n` is public), every entry of a sample is projected onto :math:`[-B_x, B_x]`, the target
onto :math:`[-B_y, B_y]`, and, when samples are normalised, :math:`\lVert x\rVert_2 \le 1`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..privacy import SecureRandom, laplace_release


@dataclass(frozen=True)
class Statistics:
    """Sufficient statistics of a (projected) data set."""

    xx: np.ndarray
    xy: np.ndarray
    yy: float
    n: int

    def __add__(self, other: Statistics) -> Statistics:
        return Statistics(self.xx + other.xx, self.xy + other.xy, self.yy + other.yy, self.n + other.n)


def sufficient_statistics(X: np.ndarray, y: np.ndarray) -> Statistics:
    r"""Return :math:`(X^\top X, X^\top y, y^\top y, n)`."""
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    return Statistics(X.T @ X, X.T @ y, float(y @ y), X.shape[0])


def empty_statistics(d: int) -> Statistics:
    """Statistics of an empty data set (no public samples)."""
    return Statistics(np.zeros((d, d)), np.zeros(d), 0.0, 0)


def sensitivities(d: int, bound_x: float, bound_y: float, row_norm: float = np.inf) -> dict[str, float]:
    r"""L1 sensitivities of the three statistics under substitution of one sample.

    With :math:`|x_j| \le B_x`, :math:`\lVert x\rVert_2 \le r` and :math:`|y| \le B_y`:

    * :math:`S_{xx}` (the :math:`d(d+1)/2` upper-triangle entries): a substitution
      :math:`x \to x'` changes it by :math:`U(x) - U(x')`, with :math:`U(x)` the upper triangle
      of :math:`xx^\top`. By the triangle inequality its L1 norm is at most
      :math:`\lVert U(x)\rVert_1 + \lVert U(x')\rVert_1`, and
      :math:`\lVert U(x)\rVert_1 = \sum_j x_j^2 + \sum_{j<k}|x_jx_k|
      = (\lVert x\rVert_2^2 + \lVert x\rVert_1^2)/2`. With :math:`\lVert x\rVert_2^2 \le
      \min(r^2, dB_x^2)` and :math:`\lVert x\rVert_1 \le \min(\sqrt d\, r, dB_x)`,
      :math:`\Delta_{xx} = \min(r^2, dB_x^2) + \min(\sqrt d\, r, dB_x)^2`, valid for every
      :math:`d` (for :math:`d = 2`, :math:`r = 1` it is 3; the pair :math:`x = (0.973, 0.230)`,
      :math:`x' = (-0.230, 0.973)` reaches :math:`\sqrt5 \approx 2.24`). Without the norm bound
      this is :math:`dB_x^2 + d^2B_x^2`.
    * :math:`S_{xy}`: :math:`\lVert x y\rVert_1 \le \min(dB_x, \sqrt d\, r)B_y`, so
      :math:`\Delta_{xy} = 2\min(dB_x, \sqrt d\, r)B_y`.
    * :math:`S_{yy}`: :math:`y^2 \in [0, B_y^2]`, so :math:`\Delta_{yy} = B_y^2`.
    """
    l2_sq = min(row_norm**2, d * bound_x**2)
    l1_x = min(d * bound_x, np.sqrt(d) * row_norm)
    return {"xx": float(l2_sq + l1_x**2), "xy": float(2 * l1_x * bound_y), "yy": float(bound_y**2)}


def laplace_scales(sens: dict[str, float], epsilon: float, split: dict[str, float]) -> dict[str, float]:
    r"""Laplace scale :math:`b_k = \Delta_k / (p_k\varepsilon)` of each released statistic."""
    return {k: (sens[k] / (split[k] * epsilon) if np.isfinite(epsilon) else 0.0) for k in split}


def perturb(stats: Statistics, scales: dict[str, float], rng: SecureRandom) -> Statistics:
    r"""Add independent Laplace noise to each released statistic (upper triangle, then mirrored).

    Each statistic released with :math:`b_k = \Delta_k/(p_k\varepsilon)` is
    :math:`p_k\varepsilon`-DP; the released set is :math:`\sum_k p_k\varepsilon`-DP by sequential
    composition. Statistics not in ``scales`` are not released and come back as ``nan``.
    """
    d = stats.xx.shape[0]
    iu = np.triu_indices(d)
    xx = np.full((d, d), np.nan)
    if "xx" in scales:
        xx = np.zeros((d, d))
        xx[iu] = laplace_release(stats.xx[iu], scales["xx"], rng)
        xx = xx + np.triu(xx, 1).T
    xy = np.full(d, np.nan)
    if "xy" in scales:
        xy = laplace_release(stats.xy, scales["xy"], rng)
    yy = float("nan")
    if "yy" in scales:
        yy = float(laplace_release(np.array([stats.yy]), scales["yy"], rng)[0])
    return Statistics(xx, xy, yy, stats.n)
