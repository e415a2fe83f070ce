r"""Differentially private k-means initialisation of the cluster centroids.

DEC-style models start the cluster stage with k-means on the latent codes of all cells. On
private cells that is a release of data-dependent points and must be paid for. Here every
access to the cells is *one step of the Poisson-subsampled Gaussian mechanism with the same
(σ, q) as DP-SGD*, so the Opacus accountant composes it with the training steps exactly:

* each step draws a Poisson sample of cells (rate :math:`q`), maps every sampled cell to one
  row of a table (its bucket or nearest centroid) and adds the vector
  :math:`(\mathrm{clip}_R(z_i),\ R)` to that row; one cell changes the table by at most
  :math:`\Delta = \sqrt{R^2 + R^2} = R\sqrt2` in L2 norm;
* Gaussian noise :math:`\mathcal N(0, \sigma^2\Delta^2)` is added to every entry.

The two phases (all post-processing of such releases):

1. ``n_sketch_steps`` releases of a *sketch*: cells are hashed into :math:`2^b` buckets by the
   signs of :math:`b` random (data-independent) projections of :math:`z_i`; the noisy bucket
   means, weighted by noisy counts, are clustered with scikit-learn's k-means;
2. ``n_lloyd_rounds`` noisy Lloyd iterations (nearest centroid → noisy means), each summing
   ``steps_per_round`` releases so that the noise of a mean shrinks as 1/sqrt(releases).

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


def _noisy_table(
    z: torch.Tensor,
    rows: torch.Tensor,
    n_rows: int,
    clip_norm: float,
    noise_multiplier: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One Gaussian release of per-row (sum of clipped points, count)."""
    d = z.shape[1]
    sums = torch.zeros(n_rows, d, dtype=torch.float64)
    counts = torch.zeros(n_rows, dtype=torch.float64)
    if z.shape[0] > 0:
        sums.index_add_(0, rows, _clip_rows(z.double(), clip_norm))
        counts.index_add_(0, rows, torch.full((rows.shape[0],), clip_norm, dtype=torch.float64))
    std = noise_multiplier * clip_norm * np.sqrt(2.0)
    sums += torch.normal(0.0, std, size=sums.shape, generator=generator, dtype=torch.float64)
    counts += torch.normal(0.0, std, size=counts.shape, generator=generator, dtype=torch.float64)
    return sums, counts / clip_norm


def _accumulate(
    sample_latents: Callable[[], torch.Tensor],
    assign: Callable[[torch.Tensor], torch.Tensor],
    n_rows: int,
    n_releases: int,
    clip_norm: float,
    noise_multiplier: float,
    record_step: Callable[[], None],
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of ``n_releases`` independent noisy tables (each one accounted step)."""
    sums, counts = None, None
    for _ in range(n_releases):
        z = sample_latents().double()
        rows = assign(z) if z.shape[0] else torch.zeros(0, dtype=torch.long)
        s, c = _noisy_table(z, rows, n_rows, clip_norm, noise_multiplier, generator)
        record_step()
        sums = s if sums is None else sums + s
        counts = c if counts is None else counts + c
    return sums, counts


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
    sphere_radius: float | None = None,
    random_state: int = 0,
) -> np.ndarray:
    """Return ``(n_clusters, d)`` centroids computed from noisy releases only.

    Parameters
    ----------
    sample_latents
        Returns the latent codes of a fresh Poisson sample of the private cells (rate q) each
        time it is called; may return zero rows.
    n_clusters
        Number of centroids.
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
        Releases of the bucket sketch and projection bits (:math:`2^b` buckets).
    n_lloyd_rounds, steps_per_round
        Noisy Lloyd iterations, each averaging ``steps_per_round`` releases.
    sphere_radius
        If the latents lie on a sphere of this radius, every noisy mean is projected back onto
        it (spherical k-means): noise shrinks means toward the origin, and without projection
        the shrunken centroids lose every nearest-centroid contest. A centroid whose noisy
        count is too small is re-seeded next to the largest cluster's centroid.
    random_state
        Seed of the (post-processing) k-means on the noisy sketch.
    """
    d = sample_latents().shape[1]  # shape only: nothing about the cells is used
    rng = np.random.default_rng(random_state)

    def to_sphere(points: torch.Tensor) -> torch.Tensor:
        if sphere_radius is None:
            return points
        return sphere_radius * points / points.norm(dim=-1, keepdim=True).clamp(min=1e-12)

    n_buckets = 2**n_bits
    proj = torch.randn(d, n_bits, generator=generator, dtype=torch.float64)
    weights = 2 ** torch.arange(n_bits)

    def bucket(z: torch.Tensor) -> torch.Tensor:
        return (((z @ proj) > 0).long() * weights).sum(1)

    sums, counts = _accumulate(
        sample_latents, bucket, n_buckets, n_sketch_steps, clip_norm, noise_multiplier, record_step, generator
    )
    count_noise = noise_multiplier * np.sqrt(2.0 * n_sketch_steps)
    valid = counts > 2.0 * count_noise
    if int(valid.sum()) < n_clusters:
        valid = torch.zeros_like(valid)
        valid[torch.argsort(counts, descending=True)[:n_clusters]] = True
    points = to_sphere(sums[valid] / counts[valid].clamp(min=1.0)[:, None]).numpy()
    km = KMeans(n_clusters=n_clusters, n_init=10, random_state=random_state)
    km.fit(points, sample_weight=counts[valid].clamp(min=1e-3).numpy())
    centroids = to_sphere(torch.as_tensor(km.cluster_centers_, dtype=torch.float64))

    round_noise = 2.0 * noise_multiplier * np.sqrt(2.0 * steps_per_round)
    for _ in range(n_lloyd_rounds):
        current = centroids.clone()
        sums, counts = _accumulate(
            sample_latents,
            lambda z, c=current: torch.cdist(z, c).argmin(1),
            n_clusters,
            steps_per_round,
            clip_norm,
            noise_multiplier,
            record_step,
            generator,
        )
        update = counts > round_noise
        centroids[update] = to_sphere(sums[update] / counts[update][:, None])
        dead = torch.nonzero(~update).reshape(-1)
        if len(dead):  # split the most populated cluster (post-processing of noisy counts)
            largest = centroids[int(torch.argmax(counts))]
            spread = 0.1 * (largest.norm() + 1e-3)
            jitter = torch.as_tensor(rng.normal(size=(len(dead), d)), dtype=torch.float64)
            centroids[dead] = to_sphere(largest + spread * jitter / np.sqrt(d))
    return centroids.float().numpy()
