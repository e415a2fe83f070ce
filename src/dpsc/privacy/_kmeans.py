r"""Differentially private k-means initialisation of the cluster centroids.

DEC-style models start the cluster stage with k-means on the latent codes of all cells. On
private cells that is a release of data-dependent points and must be paid for. Here every
access to the cells is *one step of the Poisson-subsampled Gaussian mechanism with the same
(σ, q) as DP-SGD*, so the Opacus accountant composes it with the training steps exactly:

* each step draws a Poisson sample of cells (rate :math:`q`), maps every sampled cell to one
  row of a table (its bucket or nearest centroid) and adds the vector
  :math:`(\mathrm{clip}_R(z_i),\ c)` to that row, where :math:`c = \kappa R` is the weight of
  the count (``count_scale`` :math:`\kappa`); one cell changes the table by at most
  :math:`\Delta = \sqrt{R^2 + c^2}` in L2 norm;
* Gaussian noise :math:`\mathcal N(0, \sigma^2\Delta^2)` is added to every entry.

The default :math:`\kappa = 1` gives :math:`\Delta = R\sqrt2`. With :math:`\kappa < 1` less of
the sensitivity goes to the count, which is large anyway, and the noise on the sums (hence on
the means) shrinks by :math:`\sqrt{(1+\kappa^2)/2}`.

The three phases (all post-processing of such releases):

1. ``n_sketch_steps`` releases of a *sketch*: cells are hashed into :math:`2^b` buckets by the
   signs of :math:`b` random (data-independent) projections of :math:`z_i`; the noisy bucket
   means, weighted by noisy counts, are clustered with scikit-learn's k-means into
   :math:`m` = ``oversampling`` × :math:`k` seeds (default :math:`m = k`);
2. ``n_lloyd_rounds`` noisy Lloyd iterations with the :math:`m` centroids (nearest centroid →
   noisy means), each summing ``steps_per_round`` releases so that the noise of a mean shrinks
   as 1/sqrt(releases);
3. when :math:`m > k`, the :math:`m` noisy centroids, weighted by their last noisy counts, are
   reduced to :math:`k` by weighted k-means (post-processing: the reduction sees no cell).

On the latent of a private PBMC instance stage (ε = 8) ``oversampling=3, count_scale=0.3``
with 40 + 4 × 40 releases and 6 bits gives a better start than this function's defaults (ARI of
the start 0.67–0.69 vs 0.61–0.65, agreement with non-private k-means 0.77–0.84 vs 0.68;
``benchmarks/results/dp_kmeans_start.md``). :meth:`dpsc.model.DPDCAN.train` uses that setting by
default, together with DEC frequencies released during the cluster stage
(``benchmarks/results/dpdcan.md``).

Because DCAN's latents lie on a sphere of radius :math:`s`, :math:`R = s` clips nothing.

The centroids returned are therefore (ε, δ)-DP under the accountant that recorded the
``kmeans_release_steps(...)`` steps.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from sklearn.cluster import KMeans


def kmeans_release_steps(n_sketch_steps: int, n_lloyd_rounds: int, steps_per_round: int) -> int:
    """Return the number of sampled-Gaussian steps that :func:`dp_kmeans_centroids` spends."""
    return n_sketch_steps + n_lloyd_rounds * steps_per_round


def _clip_rows(z: torch.Tensor, clip_norm: float) -> torch.Tensor:
    norms = z.norm(dim=1, keepdim=True).clamp(min=1e-12)
    return z * (clip_norm / norms).clamp(max=1.0)


def table_sensitivity(clip_norm: float, count_scale: float) -> float:
    r"""L2 sensitivity :math:`\Delta = R\sqrt{1 + \kappa^2}` of one (sums, weighted counts) table."""
    return clip_norm * float(np.sqrt(1.0 + count_scale**2))


def _noisy_table(
    z: torch.Tensor,
    rows: torch.Tensor,
    n_rows: int,
    clip_norm: float,
    noise_multiplier: float,
    generator: torch.Generator,
    count_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""One Gaussian release of per-row (sum of clipped points, count).

    Each cell adds :math:`(\mathrm{clip}_R(z_i), \kappa R)` to its row; noise of standard
    deviation :math:`\sigma\Delta` goes on every entry; the count column is returned divided by
    :math:`\kappa R` (a noisy count of cells).
    """
    d = z.shape[1]
    weight = count_scale * clip_norm
    sums = torch.zeros(n_rows, d, dtype=torch.float64)
    counts = torch.zeros(n_rows, dtype=torch.float64)
    if z.shape[0] > 0:
        sums.index_add_(0, rows, _clip_rows(z.double(), clip_norm))
        counts.index_add_(0, rows, torch.full((rows.shape[0],), weight, dtype=torch.float64))
    std = noise_multiplier * table_sensitivity(clip_norm, count_scale)
    sums += torch.normal(0.0, std, size=sums.shape, generator=generator, dtype=torch.float64)
    counts += torch.normal(0.0, std, size=counts.shape, generator=generator, dtype=torch.float64)
    return sums, counts / weight


def _accumulate(
    sample_latents: Callable[[], torch.Tensor],
    assign: Callable[[torch.Tensor], torch.Tensor],
    n_rows: int,
    n_releases: int,
    clip_norm: float,
    noise_multiplier: float,
    record_step: Callable[[], None],
    generator: torch.Generator,
    count_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of ``n_releases`` independent noisy tables (each one accounted step)."""
    sums, counts = None, None
    for _ in range(n_releases):
        z = sample_latents().double()
        rows = assign(z) if z.shape[0] else torch.zeros(0, dtype=torch.long)
        s, c = _noisy_table(z, rows, n_rows, clip_norm, noise_multiplier, generator, count_scale)
        record_step()
        sums = s if sums is None else sums + s
        counts = c if counts is None else counts + c
    return sums, counts


def _count_noise(noise_multiplier: float, count_scale: float, n_releases: int) -> float:
    """Return the standard deviation of a noisy count summed over ``n_releases`` tables."""
    return noise_multiplier * float(np.sqrt((1.0 + count_scale**-2) * n_releases))


def dp_kmeans_centroids(
    sample_latents: Callable[[], torch.Tensor],
    n_clusters: int,
    *,
    noise_multiplier: float,
    clip_norm: float,
    record_step: Callable[[], None],
    generator: torch.Generator,
    n_sketch_steps: int = 20,
    n_lloyd_rounds: int = 4,
    steps_per_round: int = 10,
    n_bits: int = 5,
    oversampling: int = 1,
    count_scale: float = 1.0,
    sphere_radius: float | None = None,
    random_state: int = 0,
) -> np.ndarray:
    r"""Return ``(n_clusters, d)`` centroids computed from noisy releases only.

    Parameters
    ----------
    sample_latents
        Returns the latent codes of a fresh Poisson sample of the private cells (rate q) each
        time it is called; may return zero rows.
    n_clusters
        Number of centroids :math:`k`.
    noise_multiplier
        σ of the sampled Gaussian mechanism (the DP-SGD value).
    clip_norm
        :math:`R`; points are clipped to norm R (no-op when latents lie on a sphere of radius
        at most R).
    record_step
        Called once per release; it must tell the accountant about one (σ, q) step.
    generator
        Source of the Gaussian noise and of the random projections.
    n_sketch_steps, n_bits
        Releases of the bucket sketch and projection bits (:math:`2^b` buckets; :math:`b` is
        raised to :math:`\lceil\log_2 2m\rceil` when that is larger).
    n_lloyd_rounds, steps_per_round
        Noisy Lloyd iterations with ``n_coreset`` centroids, each averaging
        ``steps_per_round`` releases.
    oversampling
        The noisy Lloyd phase runs with :math:`m` = ``oversampling × n_clusters`` centroids
        before the reduction to ``n_clusters``; 1 skips the reduction.
    count_scale
        :math:`\kappa`, weight of the count column relative to :math:`R` (module docstring).
    sphere_radius
        If the latents lie on a sphere of this radius, every noisy mean is projected back onto
        it (spherical k-means): noise shrinks means toward the origin, and without projection
        the shrunken centroids lose every nearest-centroid contest. A centroid whose noisy
        count is too small is re-seeded next to the largest cluster's centroid.
    random_state
        Seed of the (post-processing) k-means runs on noisy releases.
    """
    if count_scale <= 0:
        raise ValueError(f"count_scale must be > 0, got {count_scale}.")
    if oversampling < 1:
        raise ValueError(f"oversampling must be an integer >= 1, got {oversampling}.")
    n_coreset = oversampling * n_clusters
    d = sample_latents().shape[1]  # shape only: nothing about the cells is used
    rng = np.random.default_rng(random_state)

    def to_sphere(points: torch.Tensor) -> torch.Tensor:
        if sphere_radius is None:
            return points
        return sphere_radius * points / points.norm(dim=-1, keepdim=True).clamp(min=1e-12)

    def release(assign: Callable[[torch.Tensor], torch.Tensor], n_rows: int, n_releases: int):
        return _accumulate(
            sample_latents,
            assign,
            n_rows,
            n_releases,
            clip_norm,
            noise_multiplier,
            record_step,
            generator,
            count_scale,
        )

    n_bits = max(n_bits, int(np.ceil(np.log2(2 * n_coreset))))  # at least 2m buckets
    n_buckets = 2**n_bits
    proj = torch.randn(d, n_bits, generator=generator, dtype=torch.float64)
    weights = 2 ** torch.arange(n_bits)
    sums, counts = release(lambda z: (((z @ proj) > 0).long() * weights).sum(1), n_buckets, n_sketch_steps)
    valid = counts > 2.0 * _count_noise(noise_multiplier, count_scale, n_sketch_steps)
    if int(valid.sum()) < n_coreset:
        valid = torch.zeros_like(valid)
        valid[torch.argsort(counts, descending=True)[:n_coreset]] = True
    points = to_sphere(sums[valid] / counts[valid].clamp(min=1.0)[:, None]).numpy()
    seeds = KMeans(n_clusters=min(n_coreset, len(points)), n_init=10, random_state=random_state)
    seeds.fit(points, sample_weight=counts[valid].clamp(min=1e-3).numpy())
    centroids = to_sphere(torch.as_tensor(seeds.cluster_centers_, dtype=torch.float64))

    threshold = 2.0 * _count_noise(noise_multiplier, count_scale, steps_per_round)
    counts = torch.ones(len(centroids), dtype=torch.float64)
    for _ in range(n_lloyd_rounds):
        current = centroids.clone()
        sums, counts = release(
            lambda z, c=current: torch.cdist(z, c).argmin(1), len(current), steps_per_round
        )
        update = counts > threshold
        centroids[update] = to_sphere(sums[update] / counts[update][:, None])
        dead = torch.nonzero(~update).reshape(-1)
        if len(dead):  # split the most populated cluster (post-processing of noisy counts)
            largest = centroids[int(torch.argmax(counts))]
            spread = 0.1 * (largest.norm() + 1e-3)
            jitter = torch.as_tensor(rng.normal(size=(len(dead), d)), dtype=torch.float64)
            centroids[dead] = to_sphere(largest + spread * jitter / np.sqrt(d))
    if len(centroids) > n_clusters:
        reduce = KMeans(n_clusters=n_clusters, n_init=20, random_state=random_state)
        reduce.fit(centroids.numpy(), sample_weight=counts.clamp(min=1e-3).numpy())
        centroids = to_sphere(torch.as_tensor(reduce.cluster_centers_, dtype=torch.float64))
    return centroids.float().numpy()
