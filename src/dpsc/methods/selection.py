r"""Choose the better of two partitions of the same cells by one release (the k-means objective).

``dpsc.tl.fit`` starts from the private clustering's partition :math:`a` (each cell's nearest
DP k-means centroid) and trains DP-DCAN from it, whose partition is :math:`b`. Which one it keeps
is decided here, never by labels and never by an unaccounted look at the cells: both partitions
are scored by the k-means objective in the space both read, the clustering's unit-norm cell
points :math:`p_i` (:func:`~dpsc.methods.clustering.cell_points`).

**The release.** For a partition :math:`c(\cdot)` into k clusters the per-cluster table
:math:`(S_j, n_j)_{j<k}`, :math:`S_j = \sum_{c(i)=j} p_i`, :math:`n_j = |\{i: c(i) = j\}|`,
determines the between-cluster sum of squares :math:`W = \sum_j \lVert S_j\rVert^2 / n_j`. Since
:math:`\lVert p_i\rVert = 1`, the within-cluster sum of squares is :math:`n - W`: the larger
:math:`W`, the tighter the partition. One release carries both tables,

.. math:: T = \sum_i \bigl(e_{a(i)} \otimes (p_i, 1)\bigr) \oplus \bigl(e_{b(i)} \otimes (p_i, 1)\bigr),

where each labelling is a map of cell :math:`i` alone and public values (released loadings,
centroids and model weights). Adding or removing one cell changes one row of each table by
:math:`(p_i, 1)`, of norm at most :math:`\sqrt 2`, so the L2 sensitivity is
:math:`\Delta = \sqrt{2 + 2} = 2` (:data:`SENSITIVITY`): one Gaussian release
(:class:`~dpsc.privacy.GaussianSum`, history entry :math:`(\sigma, 1, 1)`).

**The score** (post-processing). With noise of sd :math:`s` per coordinate,
:math:`\mathbb E\lVert\tilde S_j\rVert^2 = \lVert S_j\rVert^2 + d s^2`, so

.. math:: \hat W = \sum_j \mathrm{clip}\Bigl(\frac{\lVert\tilde S_j\rVert^2 - d s^2}{\max(\tilde n_j, 1)},\;
          0,\; \max(\tilde n_j, 0)\Bigr),

the clip using :math:`\lVert S_j\rVert^2/n_j \le n_j` (unit points), which keeps an empty cluster's
noise from scoring. To first order a term's noise is
:math:`2 S_j^\top\xi_j / n_j - \lVert S_j\rVert^2 \zeta_j / n_j^2`, of variance
:math:`s^2(4\rho_j^2 + \rho_j^4) \le 5 s^2` with :math:`\rho_j = \lVert S_j\rVert / n_j \le 1`, so
the difference of the two scores has sd at most :math:`s\sqrt{10k}`. The model's partition is
kept only when its score exceeds the clustering's by :data:`MARGIN` times that bound: the
clustering is the proven pipeline the fit starts from, and a noisy score must not trade it for a
worse partition (with exact tables the margin is 0). The noisy counts :math:`\tilde n_j` of the
kept partition are its released label counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..privacy import GaussianSum

#: L2 sensitivity of the two tables together: one row of each moves by (p_i, 1), ‖p_i‖ ≤ 1.
SENSITIVITY = 2.0
PARTITIONS = ("clustering", "model")  # the partitions compared, in the table's order
#: How many noise sd (bound of the module docstring) the model's score must lead by to be kept.
MARGIN = 2.0


def selection_release(n_clusters: int, d: int, noise_multiplier: float) -> GaussianSum:
    """Return the release of the two partitions' tables (size 2k(d + 1), sensitivity 2)."""
    return GaussianSum("partition tables", 2 * n_clusters * (d + 1), SENSITIVITY, noise_multiplier)


def partition_tables(
    points: np.ndarray,
    labels: tuple[np.ndarray, np.ndarray],
    n_clusters: int,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    r"""Return the exact :math:`T` of the module docstring, flattened (both tables, row-major).

    ``points``: cells × d, rows of norm at most 1 (a row that is not finite, or longer, is scaled
    or zeroed so the sensitivity holds whatever the input); ``labels``: each cell's cluster in the
    two partitions, integers in ``[0, n_clusters)``. ``weights``: each cell's weight (the donor
    unit's :math:`1/m_d`, adding up to 1 per donor), so a donor moves :math:`T` by at most the
    per-cell bound 2.
    """
    p = np.asarray(points, dtype=np.float64)
    p = np.where(np.isfinite(p).all(1, keepdims=True), p, 0.0)
    p = p / np.maximum(np.linalg.norm(p, axis=1, keepdims=True), 1.0)
    w = np.ones(p.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64)
    d = p.shape[1]
    tables = np.zeros((2, n_clusters, d + 1))
    for table, assignment in zip(tables, labels, strict=True):
        assignment = np.asarray(assignment)
        in_range = not len(assignment) or (0 <= assignment.min() and assignment.max() < n_clusters)
        if assignment.shape != (p.shape[0],) or not in_range:
            raise ValueError("each labelling holds one cluster index in [0, n_clusters) per cell")
        np.add.at(table[:, :d], assignment, p * w[:, None])
        table[:, d] = np.bincount(assignment, weights=w, minlength=n_clusters)
    return tables.reshape(-1)


@dataclass(frozen=True)
class Selection:
    """The scores of both partitions and which one is kept (post-processing of one release)."""

    scores: tuple[float, float]  # Ŵ of the clustering's partition and of the model's
    counts: tuple[np.ndarray, np.ndarray]  # the released ñ_j of each
    count_noise: float  # sd of each released coordinate (so of each count)

    @property
    def margin(self) -> float:
        r"""The lead the model's score needs: :data:`MARGIN` · :math:`s\sqrt{10k}`."""
        return MARGIN * self.count_noise * float(np.sqrt(10 * len(self.counts[0])))

    @property
    def kept(self) -> str:
        """``"clustering"`` or ``"model"``: the model's partition only when it leads by the margin."""
        return PARTITIONS[int(self.scores[1] - self.scores[0] > self.margin)]

    @property
    def kept_counts(self) -> np.ndarray:
        """The released cell counts of the kept partition's clusters."""
        return self.counts[PARTITIONS.index(self.kept)]


def select_partition(released: np.ndarray, n_clusters: int, d: int, noise_sd: float) -> Selection:
    r"""Score both partitions from the released tables (:math:`\hat W`, module docstring) and choose.

    ``noise_sd`` is the release's noise sd per coordinate (:attr:`GaussianSum.noise_std`; 0 for
    exact tables). Reads released values only.
    """
    tables = np.asarray(released, dtype=np.float64).reshape(2, n_clusters, d + 1)
    scores, counts = [], []
    for table in tables:
        sums, n = table[:, :d], table[:, d]
        between = ((sums**2).sum(1) - d * noise_sd**2) / np.maximum(n, 1.0)
        scores.append(float(np.clip(between, 0.0, np.maximum(n, 0.0)).sum()))
        counts.append(n)
    return Selection((scores[0], scores[1]), (counts[0], counts[1]), float(noise_sd))


__all__ = [
    "MARGIN",
    "PARTITIONS",
    "SENSITIVITY",
    "Selection",
    "partition_tables",
    "select_partition",
    "selection_release",
]
