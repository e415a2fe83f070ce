r"""Differentially private k-means initialisation of the cluster centroids.

DEC-style models start the cluster stage with k-means on the latent codes of all cells. On
private cells that is a release of data-dependent points and must be paid for. Here every
access to the cells is *one step of the Poisson-subsampled Gaussian mechanism with the same
(σ, q) as DP-SGD*, so the Opacus accountant composes it with the training steps exactly:

* each step draws a Poisson sample of cells (rate :math:`q`), maps every sampled cell to one
  row of a table (its bucket or nearest centroid) and adds the vector
  :math:`(\mathrm{clip}_R(z_i - c),\ R)` to that row; one cell changes the table by at most
  :math:`\Delta = \sqrt{R^2 + R^2} = R\sqrt2` in L2 norm;
* Gaussian noise :math:`\mathcal N(0, \sigma^2\Delta^2)` is added to every entry.

The three phases (all post-processing of such releases):

1. one release of the noisy sum and count with a single row → a centre :math:`c`;
2. ``n_sketch_steps`` releases of a *sketch*: cells are hashed into :math:`2^b` buckets by the
   signs of :math:`b` random (data-independent) projections of :math:`z_i - c`; the noisy
   bucket means, weighted by noisy counts, are clustered with scikit-learn's k-means;
3. ``n_lloyd_steps`` noisy Lloyd iterations (nearest centroid → noisy means).

The centroids returned are therefore (ε, δ)-DP under the accountant that recorded the
``kmeans_release_steps(...)`` steps.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from sklearn.cluster import KMeans


def kmeans_release_steps(n_sketch_steps: int, n_lloyd_steps: int) -> int:
    """Number of sampled-Gaussian steps that :func:`dp_kmeans_centroids` spends."""
    return 1 + n_sketch_steps + n_lloyd_steps


def _clip_rows(z: torch.Tensor, clip_norm: float) -> torch.Tensor:
    norms = z.norm(dim=1, keepdim=True).clamp(min=1e-12)
    return z * (clip_norm / norms).clamp(max=1.0)


def _noisy_table(
    z_centered: torch.Tensor,
    rows: torch.Tensor,
    n_rows: int,
    clip_norm: float,
    noise_multiplier: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One Gaussian release of per-row (sum of clipped points, count)."""
    d = z_centered.shape[1]
    sums = torch.zeros(n_rows, d, dtype=torch.float64)
    counts = torch.zeros(n_rows, dtype=torch.float64)
    if z_centered.shape[0] > 0:
        clipped = _clip_rows(z_centered.double(), clip_norm)
        sums.index_add_(0, rows, clipped)
        counts.index_add_(0, rows, torch.full((rows.shape[0],), clip_norm, dtype=torch.float64))
    std = noise_multiplier * clip_norm * np.sqrt(2.0)
    sums += torch.normal(0.0, std, size=sums.shape, generator=generator, dtype=torch.float64)
    counts += torch.normal(0.0, std, size=counts.shape, generator=generator, dtype=torch.float64)
    return sums, counts / clip_norm


def dp_kmeans_centroids(
    sample_latents: Callable[[], torch.Tensor],
    n_clusters: int,
    *,
    noise_multiplier: float,
    clip_norm: float,
    record_step: Callable[[], None],
    generator: torch.Generator,
    n_sketch_steps: int = 8,
    n_lloyd_steps: int = 4,
    n_bits: int = 8,
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
        :math:`R`, the radius to which centred latent points are clipped.
    record_step
        Called once per release; it must tell the accountant about one (σ, q) step.
    generator
        Source of the Gaussian noise and of the random projections.
    n_sketch_steps, n_lloyd_steps, n_bits
        Releases of the bucket sketch, noisy Lloyd iterations, and projection bits
        (:math:`2^b` buckets).
    random_state
        Seed of the (post-processing) k-means on the noisy sketch.
    """
    # Phase 1: centre.
    z = sample_latents()
    d = z.shape[1]
    rows = torch.zeros(z.shape[0], dtype=torch.long)
    s, c = _noisy_table(z, rows, 1, clip_norm, noise_multiplier, generator)
    record_step()
    centre = (s[0] / c[0].clamp(min=1.0)).float()

    # Phase 2: sketch of bucket sums with data-independent random hyperplanes through `centre`.
    n_buckets = 2**n_bits
    proj = torch.randn(d, n_bits, generator=generator)
    weights = 2 ** torch.arange(n_bits)
    sums = torch.zeros(n_buckets, d, dtype=torch.float64)
    counts = torch.zeros(n_buckets, dtype=torch.float64)
    for _ in range(n_sketch_steps):
        zc = sample_latents() - centre
        rows = (((zc @ proj) > 0).long() * weights).sum(1)
        s, c = _noisy_table(zc, rows, n_buckets, clip_norm, noise_multiplier, generator)
        record_step()
        sums += s
        counts += c
    count_noise = noise_multiplier * np.sqrt(2.0 * max(n_sketch_steps, 1))
    valid = counts > 2.0 * count_noise
    if int(valid.sum()) < n_clusters:
        valid = torch.zeros_like(valid)
        valid[torch.argsort(counts, descending=True)[:n_clusters]] = True
    points = (sums[valid] / counts[valid].clamp(min=1.0)[:, None]).numpy()
    point_weights = counts[valid].clamp(min=1e-3).numpy()
    km = KMeans(n_clusters=n_clusters, n_init=10, random_state=random_state)
    km.fit(points, sample_weight=point_weights)
    centroids = torch.as_tensor(km.cluster_centers_, dtype=torch.float64)

    # Phase 3: noisy Lloyd refinement.
    for _ in range(n_lloyd_steps):
        zc = (sample_latents() - centre).double()
        rows = torch.cdist(zc, centroids).argmin(1) if zc.shape[0] else torch.zeros(0, dtype=torch.long)
        s, c = _noisy_table(zc, rows, n_clusters, clip_norm, noise_multiplier, generator)
        record_step()
        update = c > 2.0 * noise_multiplier * np.sqrt(2.0)
        centroids[update] = s[update] / c[update][:, None]
    return (centroids.float() + centre).numpy()
