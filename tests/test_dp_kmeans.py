"""The DP k-means start of the centroids: accounting, sensitivity, noise and recovery."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from dpsc.privacy import dp_kmeans_centroids, kmeans_release_steps
from dpsc.privacy._kmeans import _noisy_table, table_sensitivity

RADIUS = 3.0


def _blobs_on_sphere(n_per: int = 150, k: int = 4, d: int = 8, seed: int = 0):
    """k tight, well-separated groups of points on the sphere of radius RADIUS."""
    rng = np.random.default_rng(seed)
    centres = np.eye(d)[:k]
    z = np.concatenate([c + 0.05 * rng.normal(size=(n_per, d)) for c in centres])
    z = RADIUS * z / np.linalg.norm(z, axis=1, keepdims=True)
    return torch.as_tensor(z), np.repeat(np.arange(k), n_per)


def _run(z, k, sigma, seed=0, **kwargs):
    rng = np.random.default_rng(seed)
    steps = []
    centroids = dp_kmeans_centroids(
        lambda: z[torch.as_tensor(rng.random(len(z)) < 0.1)],
        k,
        noise_multiplier=sigma,
        clip_norm=RADIUS,
        record_step=lambda: steps.append(1),
        generator=torch.Generator().manual_seed(seed),
        sphere_radius=RADIUS,
        random_state=seed,
        **kwargs,
    )
    labels = torch.cdist(z.float(), torch.as_tensor(centroids)).argmin(1).numpy()
    return centroids, labels, len(steps)


@pytest.mark.parametrize("counts", [{}, {"n_sketch_steps": 5, "n_lloyd_rounds": 2, "steps_per_round": 3}])
def test_every_release_is_one_accounted_step(counts):
    z, _ = _blobs_on_sphere()
    _, _, recorded = _run(z, 4, 1.0, **counts)
    expected = kmeans_release_steps(
        counts.get("n_sketch_steps", 20), counts.get("n_lloyd_rounds", 4), counts.get("steps_per_round", 10)
    )
    assert recorded == expected


@pytest.mark.parametrize("count_scale", [1.0, 0.3])
def test_one_cell_moves_a_table_by_at_most_the_sensitivity(count_scale):
    """Noise-free tables of neighbouring data sets (one cell added) differ by ≤ Δ = R·sqrt(1+κ²)."""
    z, _ = _blobs_on_sphere(n_per=20)
    extra = torch.full((1, z.shape[1]), 10.0, dtype=torch.float64)  # far outside the clip radius
    rows = torch.arange(len(z)) % 5
    gen = torch.Generator().manual_seed(0)
    weight = count_scale * RADIUS
    s0, c0 = _noisy_table(z, rows, 5, RADIUS, 0.0, gen, count_scale)
    s1, c1 = _noisy_table(
        torch.cat([z, extra]), torch.cat([rows, torch.tensor([2])]), 5, RADIUS, 0.0, gen, count_scale
    )
    change = torch.cat([(s1 - s0).flatten(), weight * (c1 - c0)]).norm()
    assert change == pytest.approx(table_sensitivity(RADIUS, count_scale))
    assert change > RADIUS  # the bound is attained, so it is not loose by construction


def test_noise_has_the_calibrated_scale():
    """Entries carry N(0, (σΔ)²); the returned counts are divided by the count weight κR."""
    sigma, count_scale = 1.7, 0.3
    empty = torch.zeros(0, 8, dtype=torch.float64)
    sums, counts = _noisy_table(
        empty,
        torch.zeros(0, dtype=torch.long),
        4000,
        RADIUS,
        sigma,
        torch.Generator().manual_seed(1),
        count_scale,
    )
    delta = table_sensitivity(RADIUS, count_scale)
    assert float(sums.std()) == pytest.approx(sigma * delta, rel=0.03)
    assert float(counts.std()) == pytest.approx(sigma * delta / (count_scale * RADIUS), rel=0.05)


@pytest.mark.parametrize("oversampling", [1, 3])
def test_noise_free_start_recovers_separated_groups(oversampling):
    z, truth = _blobs_on_sphere()
    centroids, labels, _ = _run(z, 4, 0.0, oversampling=oversampling)
    assert centroids.shape == (4, z.shape[1])
    assert np.allclose(np.linalg.norm(centroids, axis=1), RADIUS, atol=1e-4)
    assert adjusted_rand_score(truth, labels) == 1.0


def test_many_clusters_get_enough_buckets():
    """k = 30 with oversampling 3 asks for 90 seeds: the sketch grows past its 32 default buckets."""
    z, _ = _blobs_on_sphere(n_per=40, k=8, d=40)
    centroids, _, _ = _run(z, 30, 0.5, oversampling=3, count_scale=0.3)
    assert centroids.shape == (30, 40)
    assert np.isfinite(centroids).all()


@pytest.mark.parametrize("bad", [{"oversampling": 0}, {"count_scale": 0.0}])
def test_bad_options_are_refused(bad):
    z, _ = _blobs_on_sphere()
    with pytest.raises(ValueError, match=next(iter(bad))):
        _run(z, 4, 1.0, **bad)


def test_unknown_kmeans_option_is_refused_before_training(small_adata):
    from dpsc.model import DPDCAN

    DPDCAN.setup_anndata(small_adata)
    model = DPDCAN(small_adata, n_clusters=3)
    with pytest.raises(ValueError, match="kmeans_kwargs does not take"):
        model.train(epsilon=8.0, kmeans_kwargs={"n_rounds": 3}, progress_bar=False, accelerator="cpu")
    with pytest.raises(ValueError, match="plan_kwargs does not take"):
        model.train(epsilon=8.0, plan_kwargs={"lr": 3}, progress_bar=False, accelerator="cpu")
    assert not model.is_trained_
