r"""Differentially private k-means: tables of per-row sums and counts, released as sums over cells.

**Per-cell contribution.** A public :class:`Assignment` (data-independent random hyperplanes, or
already-released centroids) maps each cell to one row of a table; the cell adds
:math:`(\mathrm{clip}_R(z_i),\ \kappa R)` to that row and nothing elsewhere
(:func:`kmeans_table`), so one cell changes the flattened table by at most
:math:`\Delta = R\sqrt{1 + \kappa^2}` in L2 (``count_scale`` :math:`\kappa`: the share of the
sensitivity spent on the count).

**Sum and noise.** The table is a sum over cells (or over sites), released by the
:class:`~dpsc.privacy.GaussianSum` of :func:`table_release`; the count column of the released
table, divided by :math:`\kappa R`, is a noisy count of cells (:func:`split_table`).

**Driver** (:func:`dp_kmeans_centroids`, post-processing of such releases only; it never sees a
cell, only what ``release_table`` returns):

1. ``n_sketch_steps`` releases of a *sketch*: rows are the :math:`2^b` buckets of the signs of
   :math:`b` random projections (seeded by ``random_state``: public); the noisy bucket means,
   weighted by their noisy counts, are clustered by scikit-learn's k-means into :math:`m` =
   ``oversampling`` × :math:`k` seeds;
2. ``n_lloyd_rounds`` noisy Lloyd iterations with :math:`m` centroids, each summing
   ``steps_per_round`` releases (the noise of a mean shrinks as 1/sqrt(releases)); a centroid
   whose noisy count is below twice its noise is re-seeded next to the most populated one;
3. when :math:`m > k`, weighted k-means of the :math:`m` noisy centroids (weights: their last
   noisy counts; ``reduction_starts`` starts, the lowest weighted objective kept) reduces them
   to :math:`k`;
4. the last ``refine_rounds`` of the ``n_lloyd_rounds`` (default none) are Lloyd iterations of
   the :math:`k` reduced centroids: each becomes the noisy mean of the cells nearest to it;
   between two such rounds the :math:`i`-th centroid whose noisy count is below twice its noise
   is re-seeded next to the :math:`i`-th most populated one, so the next round splits that
   cluster instead of leaving an empty one.

With ``sphere_radius`` every noisy mean is projected back onto that sphere (spherical k-means:
noise shrinks means toward the origin). The centroids are (ε, δ)-DP under the accountant that
recorded the :func:`kmeans_release_steps` releases.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from ..privacy import GaussianSum

if TYPE_CHECKING:
    import torch

Metric = Literal["cosine", "euclidean"]


def _array(points) -> np.ndarray:
    """Points as a float64 array (a torch tensor is moved to the CPU first)."""
    if hasattr(points, "detach"):
        points = points.detach().cpu().numpy()
    return np.asarray(points, dtype=np.float64)


def kmeans_points(points, metric: Metric = "cosine") -> np.ndarray:
    """Each cell's point as DP k-means reads it: the row itself, or scaled to unit norm (cosine).

    A row of zeros stays zero. Applied to each cell alone, so it is part of the per-cell map the
    sensitivity argument allows (module docstring).
    """
    rows = _array(points)
    if metric == "cosine":
        rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    return rows


def nearest_centroid(points, centroids: np.ndarray, metric: Metric = "cosine") -> np.ndarray:
    """Index of each cell's nearest released centroid (to the cell's unit-norm point for ``"cosine"``).

    Post-processing of the centroids: use it to label cells that were not in the fit, from a
    representation computed the same way (e.g. ``unit_rows(X) @ varm["PCs"]``).
    """
    return nearest_point(kmeans_points(points, metric), centroids)


def nearest_point(points, centroids: np.ndarray, block: int = 65_536) -> np.ndarray:
    """Index of the nearest centroid of each row of points (already mapped by :func:`kmeans_points`)."""
    points, centroids = _array(points), np.asarray(centroids, dtype=np.float64)
    out = np.empty(points.shape[0], dtype=np.int64)
    norms = (centroids**2).sum(1)
    for start in range(0, points.shape[0], block):
        rows = points[start : start + block]
        out[start : start + len(rows)] = (norms[None, :] - 2.0 * rows @ centroids.T).argmin(1)
    return out


def kmeans_release_steps(n_sketch_steps: int, n_lloyd_rounds: int, steps_per_round: int) -> int:
    """Return the number of Gaussian releases :func:`dp_kmeans_centroids` makes."""
    return n_sketch_steps + n_lloyd_rounds * steps_per_round


@dataclass(frozen=True)
class Assignment:
    """Which table row each cell adds to: public, so it can be broadcast to every site.

    ``kind="sketch"``: the bucket of the signs of ``points @ matrix`` (``d × b`` projections);
    ``kind="nearest"``: the nearest of the centroids ``matrix`` (``m × d``).
    """

    kind: Literal["sketch", "nearest"]
    matrix: np.ndarray

    @property
    def n_rows(self) -> int:
        """Rows of the table: :math:`2^b` buckets, or the number of centroids."""
        return 2 ** self.matrix.shape[1] if self.kind == "sketch" else self.matrix.shape[0]

    def rows(self, points) -> np.ndarray:
        """Return the row of each point."""
        points, matrix = _array(points), np.asarray(self.matrix, dtype=np.float64)
        if self.kind == "sketch":
            return ((points @ matrix) > 0).astype(np.int64) @ (
                2 ** np.arange(matrix.shape[1], dtype=np.int64)
            )
        return nearest_point(points, matrix)


def table_sensitivity(clip_norm: float, count_scale: float) -> float:
    r"""L2 sensitivity :math:`\Delta = R\sqrt{1 + \kappa^2}` of one (sums, weighted counts) table."""
    return clip_norm * float(np.sqrt(1.0 + count_scale**2))


def _clip_rows(z: np.ndarray, clip_norm: float) -> np.ndarray:
    """Each row scaled to norm at most ``clip_norm``; a row that is not finite becomes zero."""
    z = np.where(np.isfinite(z).all(1, keepdims=True), z, 0.0)
    norms = np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    return z * np.minimum(clip_norm / norms, 1.0)


def kmeans_table(
    points,
    assignment: Assignment,
    clip_norm: float,
    count_scale: float,
    rows: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    r"""Return the exact table :math:`\sum_i w_i e_{r(i)} \otimes (\mathrm{clip}_R(z_i), \kappa R)` (flat).

    Row-major ``(n_rows, d + 1)``: the sums of the clipped points, then the weighted count.
    ``rows``: each point's row r(i) when it is not the assignment's of the point itself (a map of
    the cell and public values computed elsewhere, e.g. from another representation).
    ``weights``: each cell's :math:`w_i` (1 when ``None``; the donor unit's :math:`1/m_d`, adding up
    to 1 per donor, so a donor moves the table by at most the per-cell sensitivity).
    """
    z = _array(points)
    d = z.shape[1]
    table = np.zeros((assignment.n_rows, d + 1))
    if z.shape[0] > 0:
        rows = assignment.rows(z) if rows is None else np.asarray(rows, dtype=np.int64)
        clipped = _clip_rows(z, clip_norm)
        if weights is not None:
            clipped = clipped * np.asarray(weights, dtype=np.float64)[:, None]
        np.add.at(table[:, :d], rows, clipped)
        counts = np.bincount(rows, weights=weights, minlength=assignment.n_rows)
        table[:, d] = counts * (count_scale * clip_norm)
    return table.reshape(-1)


def table_release(
    n_rows: int,
    d: int,
    clip_norm: float,
    count_scale: float,
    noise_multiplier: float,
    sample_rate: float = 1.0,
) -> GaussianSum:
    r"""Return the Gaussian release of one k-means table (sensitivity :math:`R\\sqrt{1+\\kappa^2}`)."""
    return GaussianSum(
        "k-means table",
        n_rows * (d + 1),
        table_sensitivity(clip_norm, count_scale),
        noise_multiplier,
        sample_rate,
    )


def split_table(
    values: np.ndarray, n_rows: int, d: int, clip_norm: float, count_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return a released table as ``(sums (n_rows, d), counts (n_rows,))`` torch tensors, counts in cells."""
    import torch

    table = torch.as_tensor(np.asarray(values, dtype=np.float64).reshape(n_rows, d + 1))
    return table[:, :d].clone(), table[:, d] / (count_scale * clip_norm)


ReleaseTable = Callable[[Assignment], tuple]  # (sums, counts) as torch tensors


#: Weight of a public start in a Lloyd round, in units of the round's count noise sd :math:`s`: a
#: centroid that started from public data (a reference type's mean) moves to
#: :math:`(S_j + \lambda c_j) / (N_j + \lambda)` with :math:`\lambda` = this × :math:`s`, the
#: posterior mean when the start counts as :math:`\lambda` cells (post-processing of the release).
#: A cluster whose noisy count is far above its noise moves to its noisy mean; one near the update
#: threshold (:math:`2s`) moves a third of the way. Chosen by leave one cohort out among 0, 1, 2, 3, 4
#: and 6, then 4 on every cohort (docs, Benchmarks: "The donor unit", the start's weight).
START_PRIOR = 4.0


def dp_kmeans_centroids(
    release_table: ReleaseTable,
    n_clusters: int,
    d: int,
    *,
    noise_multiplier: float,
    clip_norm: float,
    n_sketch_steps: int = 20,
    n_lloyd_rounds: int = 4,
    steps_per_round: int = 10,
    n_bits: int = 5,
    oversampling: int = 1,
    count_scale: float = 1.0,
    sphere_radius: float | None = None,
    reduction_starts: int = 20,
    refine_rounds: int = 0,
    random_state: int = 0,
    return_in_use: bool = False,
    start: np.ndarray | None = None,
    return_noise: bool = False,
) -> np.ndarray | tuple[np.ndarray, int] | tuple[np.ndarray, int, np.ndarray]:
    r"""Return ``(n_clusters, d)`` centroids computed from noisy releases only (module docstring).

    Parameters
    ----------
    release_table
        ``release_table(assignment) -> (sums, counts)``: one noisy release of the table of the
        private cells under that assignment (:func:`kmeans_table` summed over the cells, or over
        sites, with :func:`table_release`'s noise, :func:`split_table` applied). Each call is one
        accounted release; the caller accounts it.
    n_clusters
        Number of centroids :math:`k`.
    d
        Dimension of the points.
    noise_multiplier, clip_norm, count_scale
        σ, R and κ of the releases (the thresholds on noisy counts use them).
    n_sketch_steps, n_bits
        Releases of the bucket sketch and projection bits (:math:`2^b` buckets; :math:`b` is
        raised to :math:`\lceil\log_2 2m\rceil` when that is larger).
    n_lloyd_rounds, steps_per_round
        Noisy Lloyd iterations, each averaging ``steps_per_round`` releases.
    oversampling
        The Lloyd phase runs with :math:`m` = ``oversampling × n_clusters`` centroids.
    sphere_radius
        Project every noisy mean onto the sphere of this radius (``None``: no projection).
    reduction_starts
        Starts of the weighted k-means that reduces the :math:`m` Lloyd centroids to :math:`k`
        (post-processing: more starts cost time, not privacy).
    refine_rounds
        How many of the ``n_lloyd_rounds`` run after the reduction, with the :math:`k` centroids
        (step 4 of the module docstring; the table of such a round has :math:`k` rows).
    random_state
        Seed of the projections and of the post-processing k-means runs (public).
    return_in_use
        Also return how many centroids are in use: those whose released count in the last Lloyd
        round (summed over the Lloyd centroids merged into it, with its noise sd
        :math:`s\sqrt{m_j}`) exceeds twice that sd (:func:`clusters_above_noise`; an empty
        cluster passes by chance with probability about 2.3 %). Post-processing of released
        counts: no cell is read. Without Lloyd rounds every centroid counts as in use.
    start
        Public starting centroids of the Lloyd phase (``(m, d)``, from public data alone, e.g. a
        public reference's points): step 1 is skipped (``n_sketch_steps`` must be 0) and the
        Lloyd phase runs with these :math:`m` centroids, each round's mean weighting the centroid it
        moves from as :data:`START_PRIOR` count-noise sds of cells. Public values: no ε.
    return_noise
        With ``return_in_use``, also return each centroid's noise: the standard deviation of one
        coordinate of its last noisy mean, :math:`\kappa R s \sqrt{m_j} / c_j` with :math:`s` the
        noise sd of the last round's accumulated counts, :math:`c_j` the count it holds (summed over
        the :math:`m_j` Lloyd centroids merged into it; at least :math:`s`). Post-processing of the
        released counts and the public σ; 0 without Lloyd rounds or without noise.
    """
    import torch
    from sklearn.cluster import KMeans

    if count_scale <= 0:
        raise ValueError(f"count_scale must be > 0, got {count_scale}.")
    if oversampling < 1:
        raise ValueError(f"oversampling must be an integer >= 1, got {oversampling}.")
    if not 0 <= refine_rounds <= n_lloyd_rounds:
        raise ValueError(
            f"refine_rounds must be in [0, n_lloyd_rounds={n_lloyd_rounds}], got {refine_rounds}."
        )
    n_coreset = oversampling * n_clusters
    rng = np.random.default_rng(random_state)

    def to_sphere(points: torch.Tensor) -> torch.Tensor:
        if sphere_radius is None:
            return points
        return sphere_radius * points / points.norm(dim=-1, keepdim=True).clamp(min=1e-12)

    def accumulate(assignment: Assignment, n_releases: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        sums = torch.zeros(assignment.n_rows, d, dtype=torch.float64)
        counts = torch.zeros(assignment.n_rows, dtype=torch.float64)
        for _ in range(n_releases):
            s, c = release_table(assignment)
            sums, counts = sums + s, counts + c
        one = table_release(assignment.n_rows, d, clip_norm, count_scale, noise_multiplier)
        count_noise = one.noise_std / (count_scale * clip_norm) * float(np.sqrt(n_releases))
        return sums, counts, count_noise

    if start is not None:
        if n_sketch_steps:
            raise ValueError("A k-means with public starting centroids makes no sketch release.")
        centroids = to_sphere(torch.as_tensor(np.asarray(start, dtype=np.float64).reshape(-1, d)))
    else:
        centroids = _sketch_seeds(
            accumulate, to_sphere, d, n_coreset, n_bits, n_sketch_steps, rng, random_state
        )

    counts = torch.ones(len(centroids), dtype=torch.float64)

    def lloyd_round(centroids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One noisy Lloyd round in place: a centroid above twice its count's noise moves to its mean."""
        sums, counts, count_noise = accumulate(
            Assignment("nearest", centroids.numpy().copy()), steps_per_round
        )
        update = counts > 2.0 * count_noise
        prior = START_PRIOR * count_noise if start is not None else 0.0
        moved = (sums[update] + prior * centroids[update]) / (counts[update] + prior)[:, None]
        centroids[update] = to_sphere(moved)
        return update, counts, count_noise

    def reseed(dead: torch.Tensor, counts: torch.Tensor, targets: int) -> None:
        """Move each dead centroid next to one of the ``targets`` most populated ones (noisy counts).

        Post-processing: the next Lloyd round splits each such cluster between the two centroids.
        """
        populated = torch.argsort(counts, descending=True)[:targets]
        for i, j in enumerate(dead.tolist()):
            nearby = centroids[int(populated[i % len(populated)])]
            jitter = torch.as_tensor(rng.normal(size=d), dtype=torch.float64) / np.sqrt(d)
            centroids[j] = to_sphere(nearby + 0.1 * (nearby.norm() + 1e-3) * jitter)

    for _ in range(n_lloyd_rounds - refine_rounds):
        update, counts, count_noise = lloyd_round(centroids)
        dead = torch.nonzero(~update).reshape(-1)
        if len(dead):  # split the most populated cluster
            reseed(dead, counts, targets=1)
    merged = np.arange(len(centroids))  # which final centroid each Lloyd centroid became
    if len(centroids) > n_clusters:
        reduce = KMeans(n_clusters=n_clusters, n_init=reduction_starts, random_state=random_state)
        reduce.fit(centroids.numpy(), sample_weight=counts.clamp(min=1e-3).numpy())
        centroids = to_sphere(torch.as_tensor(reduce.cluster_centers_, dtype=torch.float64))
        merged = reduce.labels_
    for round_ in range(refine_rounds):  # Lloyd rounds of the k reduced centroids
        update, counts, count_noise = lloyd_round(centroids)
        dead = torch.nonzero(~update).reshape(-1)
        if round_ < refine_rounds - 1 and len(dead):  # split the most populated clusters, one each
            reseed(dead, counts, targets=len(dead))
        merged = np.arange(len(centroids))
    if not return_in_use:
        return centroids.float().numpy()
    in_use, noise = len(centroids), np.zeros(len(centroids))
    if n_lloyd_rounds > 0:
        held = np.bincount(merged, weights=counts.numpy(), minlength=len(centroids))
        held_noise = count_noise * np.sqrt(np.bincount(merged, minlength=len(centroids)))
        in_use = clusters_above_noise(held, held_noise)
        scale = count_scale * clip_norm  # a count of one cell in the table's units
        noise = scale * held_noise / np.maximum(held, np.maximum(held_noise, 1e-12))
    if return_noise:
        return centroids.float().numpy(), in_use, noise
    return centroids.float().numpy(), in_use


def _sketch_seeds(accumulate, to_sphere, d, n_coreset, n_bits, n_sketch_steps, rng, random_state):
    """Step 1 of :func:`dp_kmeans_centroids`: ``m`` seeds from the noisy bucket means of the sketch."""
    import torch
    from sklearn.cluster import KMeans

    n_bits = max(n_bits, int(np.ceil(np.log2(2 * n_coreset))))  # at least 2m buckets
    sketch = Assignment("sketch", rng.normal(size=(d, n_bits)))
    sums, counts, count_noise = accumulate(sketch, n_sketch_steps)
    valid = counts > 2.0 * count_noise
    if int(valid.sum()) < n_coreset:
        valid = torch.zeros_like(valid)
        valid[torch.argsort(counts, descending=True)[:n_coreset]] = True
    points = to_sphere(sums[valid] / counts[valid].clamp(min=1.0)[:, None]).numpy()
    seeds = KMeans(n_clusters=min(n_coreset, len(points)), n_init=10, random_state=random_state)
    seeds.fit(points, sample_weight=counts[valid].clamp(min=1e-3).numpy())
    centroids = to_sphere(torch.as_tensor(seeds.cluster_centers_, dtype=torch.float64))
    return centroids


def clusters_above_noise(counts: np.ndarray, noise_sd: float | np.ndarray) -> int:
    r"""Clusters whose released count exceeds :math:`\max(2 s_j, 0.5)`, :math:`s_j` its noise sd.

    The rule of every ``clusters_in_use`` in dpsc (DP-DCAN's released label counts, the DP
    k-means' last Lloyd counts): post-processing of released values; without noise (s = 0) it
    counts the clusters with any cell.
    """
    return int((np.asarray(counts) > np.maximum(2.0 * np.asarray(noise_sd), 0.5)).sum())


def central_table_release(
    points: torch.Tensor,
    *,
    clip_norm: float,
    count_scale: float,
    noise_multiplier: float,
    draw_stream: Callable[[], object],
    on_release: Callable[[], None] = lambda: None,
    weights: np.ndarray | None = None,
) -> ReleaseTable:
    """``release_table`` over points held in one place: table, noise from a fresh stream, split.

    ``weights``: each point's weight in the table (the donor unit, :func:`kmeans_table`).
    """
    d = points.shape[1]

    def release(assignment: Assignment) -> tuple[torch.Tensor, torch.Tensor]:
        table = kmeans_table(points, assignment, clip_norm, count_scale, weights=weights)
        spec = table_release(assignment.n_rows, d, clip_norm, count_scale, noise_multiplier)
        noisy = spec.release(table, draw_stream())
        on_release()
        return split_table(noisy, assignment.n_rows, d, clip_norm, count_scale)

    return release
