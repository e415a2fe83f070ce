r"""Whether a public reference holds the cohort's cell types: one released count chooses the k-means start.

With ``reference_key`` the DP k-means can start from the reference types' mean points and make
one Lloyd release (:func:`~dpsc._public_reference.type_start`); that start is the better one only
when the private cells are of those types. A reference of another study can hold other types
(developing tissue for an adult cohort), and then the DP k-means' own sketch start is better.
Which case holds is a property of the private cells, so it is decided by a release:

**The count.** With :math:`m_j` the start's centroids (type means) and :math:`r_j` the radius of
type j (the :data:`~dpsc._public_reference.GATE_RADIUS_QUANTILE` quantile of its reference cells'
distances to :math:`m_j`; 0 for a centroid that is not a type's), each cell's point :math:`p_i`
in the public basis is *inside* when :math:`\lVert p_i - m_{j(i)}\rVert_2 \le r_{j(i)}` for its
nearest centroid :math:`j(i)`. The released vector is

.. math::

    c = \Bigl(\sum_i [\text{inside}_i],\ \sum_i [\text{not inside}_i]\Bigr) + \mathcal N(0, \sigma_c^2 I_2).

**Privacy argument.** Whether a cell is inside is a map of that cell and public values (the
reference's basis, means and radii). Adding or removing one cell changes exactly one of the two
counts by 1: L2 sensitivity 1, one Gaussian release (:data:`SENSITIVITY`). The start is then
chosen from the released counts alone (post-processing, :func:`starts_from_types`): the type
start unless the released share of inside cells is clearly (by :data:`MARGIN` noise sd) below
:data:`TYPED_SHARE`, else the sketch. The two plans that can follow
(the type start's single Lloyd release, or the sketch's releases) are each calibrated together
with the count to at most (ε, δ), and the count is released with the larger of the two σ_c they
ask for (more noise can only lower either composition, :func:`dpsc.methods.cluster_plan.plan_clustering`),
so whichever branch runs, the whole clustering spends at most (ε, δ), as its record states.

:data:`TYPED_SHARE` follows from the radius: a type's own cells are inside with probability
:data:`~dpsc._public_reference.GATE_RADIUS_QUANTILE` (0.9), a cell of a type the reference lacks
seldom is; a cohort whose cells are mostly inside is of the reference's types. Measured on the
benchmark pairs (docs, Benchmarks: "``tl.cluster(reference=...)`` on reference / private pairs").
"""

from __future__ import annotations

import numpy as np

SENSITIVITY = 1.0  # one cell moves one of the two counts by 1
#: The k-means starts from the reference types' means when at least this share of the released
#: count is inside a type's spread (module docstring), else from its own sketch.
TYPED_SHARE = 0.5
#: How many noise sd the count must lie below TYPED_SHARE for the sketch start (:func:`starts_from_types`).
MARGIN = 2.0
#: The count's share of the budget, as a fraction of the k-means' own share.
COUNT_SHARE = 0.02
#: The count's share of δ where a site books its releases one by one (``ClusterPlan.release_delta``).
COUNT_DELTA_SHARE = 1e-3


def inside_counts(
    points: np.ndarray, start: np.ndarray, radii: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """Return the exact (inside, not inside) counts of the module docstring (cells × d points in).

    ``weights``: each cell's weight (the donor unit's 1/m_d, adding up to 1 per donor).
    """
    points = np.asarray(points, dtype=np.float64)
    if not len(points):
        return np.zeros(2)
    w = np.ones(len(points)) if weights is None else np.asarray(weights, dtype=np.float64)
    start, radii = np.asarray(start, dtype=np.float64), np.asarray(radii, dtype=np.float64)
    squared = (points**2).sum(1)[:, None] - 2 * points @ start.T + (start**2).sum(1)[None, :]
    nearest = squared.argmin(1)
    distance = np.sqrt(np.maximum(squared[np.arange(len(points)), nearest], 0.0))
    inside = float(w[distance <= radii[nearest]].sum())
    return np.array([inside, w.sum() - inside], dtype=np.float64)


def starts_from_types(released: np.ndarray, sigma: float) -> bool:
    r"""Whether the released counts choose the type start (post-processing of the release).

    With :math:`s` = :data:`TYPED_SHARE`, the statistic :math:`d = (1 - s)\,c_{in} - s\,c_{out}` is
    :math:`\ge 0` exactly when the share of inside cells is at least s; its noise has sd
    :math:`\sigma_c\sqrt{(1-s)^2 + s^2}`. The type start, which ``reference_key`` asks for, is kept
    unless :math:`d` is below :data:`MARGIN` of those sd: the sketch is chosen only when the count
    says clearly that most cells lie outside the reference's types (a small cohort at a small ε,
    whose count is mostly noise, keeps the types).
    """
    inside, outside = np.asarray(released, dtype=np.float64)
    share = TYPED_SHARE
    statistic = (1 - share) * inside - share * outside
    return bool(statistic >= -MARGIN * float(sigma) * np.hypot(1 - share, share))
