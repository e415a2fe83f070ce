"""The DP k-means start of the centroids: accounting, sensitivity, noise and recovery."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from dpsc.methods import (
    Assignment,
    dp_kmeans_centroids,
    kmeans_release_steps,
    kmeans_table,
    split_table,
    table_release,
)
from dpsc.methods.kmeans import table_sensitivity
from dpsc.privacy import NoiseSource

RADIUS = 3.0


def _blobs_on_sphere(n_per: int = 150, k: int = 4, d: int = 8, seed: int = 0):
    """k tight, well-separated groups of points on the sphere of radius RADIUS."""
    rng = np.random.default_rng(seed)
    centres = np.eye(d)[:k]
    z = np.concatenate([c + 0.05 * rng.normal(size=(n_per, d)) for c in centres])
    z = RADIUS * z / np.linalg.norm(z, axis=1, keepdims=True)
    return torch.as_tensor(z), np.repeat(np.arange(k), n_per)


def _run(z, k, sigma, seed=0, count_scale=1.0, **kwargs):
    """DP k-means on Poisson samples (q = 0.1) of z, one noisy table per release."""
    rng = np.random.default_rng(seed)
    noise = NoiseSource(seed)
    steps = []
    d = z.shape[1]

    def release_table(assignment):
        sample = z[torch.as_tensor(rng.random(len(z)) < 0.1)]
        table = kmeans_table(sample, assignment, RADIUS, count_scale)
        spec = table_release(assignment.n_rows, d, RADIUS, count_scale, sigma, 0.1)
        steps.append(1)
        return split_table(
            spec.release(table, noise.stream("test")), assignment.n_rows, d, RADIUS, count_scale
        )

    centroids = dp_kmeans_centroids(
        release_table,
        k,
        d,
        noise_multiplier=sigma,
        clip_norm=RADIUS,
        count_scale=count_scale,
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
    """Exact tables of neighbouring data sets (one cell added) differ by ≤ Δ = R·sqrt(1+κ²)."""
    z, _ = _blobs_on_sphere(n_per=20)
    extra = torch.full((1, z.shape[1]), 10.0, dtype=torch.float64)  # far outside the clip radius
    nearest = Assignment("nearest", np.eye(z.shape[1])[:5] * RADIUS)
    t0 = kmeans_table(z, nearest, RADIUS, count_scale)
    t1 = kmeans_table(torch.cat([z, extra]), nearest, RADIUS, count_scale)
    change = np.linalg.norm(t1 - t0)
    assert change == pytest.approx(table_sensitivity(RADIUS, count_scale))
    assert change > RADIUS  # the bound is attained, so it is not loose by construction


def test_noise_has_the_calibrated_scale():
    """Entries carry noise of std σΔ (lattice: at most 0.1 % more); counts are divided by κR."""
    sigma, count_scale, d, rows = 1.7, 0.3, 8, 4000
    spec = table_release(rows, d, RADIUS, count_scale, sigma)
    noisy = spec.release(np.zeros(rows * (d + 1)), NoiseSource(1).stream("test"))
    sums, counts = split_table(noisy, rows, d, RADIUS, count_scale)
    delta = table_sensitivity(RADIUS, count_scale)
    assert sigma * delta <= spec.noise_std <= 1.001 * sigma * delta
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


def test_refine_rounds_are_lloyd_rounds_of_the_k_reduced_centroids():
    """The last ``refine_rounds`` tables have k rows (after the reduction of m = 3k), the releases
    still number :func:`kmeans_release_steps`, and separated groups are still recovered."""
    z, truth = _blobs_on_sphere()
    rows = []
    d = z.shape[1]

    def release_table(assignment):
        rows.append((assignment.kind, assignment.n_rows))
        table = kmeans_table(z, assignment, RADIUS, 1.0)
        return split_table(table, assignment.n_rows, d, RADIUS, 1.0)

    plan = {"n_sketch_steps": 1, "n_lloyd_rounds": 3, "steps_per_round": 1, "oversampling": 3}
    centroids = dp_kmeans_centroids(
        release_table,
        4,
        d,
        noise_multiplier=0.0,
        clip_norm=RADIUS,
        sphere_radius=RADIUS,
        refine_rounds=1,
        **plan,
    )
    assert [r for _, r in rows[1:]] == [12, 12, 4] and len(rows) == kmeans_release_steps(1, 3, 1)
    labels = torch.cdist(z.float(), torch.as_tensor(centroids)).argmin(1).numpy()
    assert adjusted_rand_score(truth, labels) == 1.0


def test_between_refine_rounds_an_empty_centroid_moves_next_to_a_populated_one():
    """Two point masses and k = 4: the first refine round leaves two centroids without cells; before
    the second, each is re-seeded next to a different populated centroid (post-processing only)."""
    d = 8
    z = torch.as_tensor(np.repeat(RADIUS * np.eye(d)[:2], [200, 100], axis=0))
    tables = []

    def release_table(assignment):
        table = kmeans_table(z, assignment, RADIUS, 1.0)
        tables.append((assignment, split_table(table, assignment.n_rows, d, RADIUS, 1.0)[1].numpy()))
        return split_table(table, assignment.n_rows, d, RADIUS, 1.0)

    plan = {"n_sketch_steps": 1, "n_lloyd_rounds": 4, "steps_per_round": 1, "oversampling": 3}
    dp_kmeans_centroids(
        release_table,
        4,
        d,
        noise_multiplier=1e-9,
        clip_norm=RADIUS,
        sphere_radius=RADIUS,
        refine_rounds=2,
        **plan,
    )
    (_, counts), (second, _) = tables[-2], tables[-1]
    empty, populated = np.flatnonzero(counts == 0), np.flatnonzero(counts > 0)
    assert len(empty) == 2 and len(populated) == 2
    means = second.matrix[populated]  # the first round moved each populated centroid to its cells' mean
    assert np.allclose(np.sort(means, axis=0), np.sort(RADIUS * np.eye(d)[:2], axis=0), atol=1e-5)
    distances = np.linalg.norm(second.matrix[empty][:, None, :] - means[None, :, :], axis=2)
    assert (distances.min(1) < 0.25 * RADIUS).all()  # jittered by 0.1 × the norm, then on the sphere
    assert len(set(distances.argmin(1))) == 2  # next to a different populated centroid each


@pytest.mark.parametrize("bad", [{"oversampling": 0}, {"count_scale": 0.0}, {"refine_rounds": 9}])
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


def test_a_clustering_plan_schedules_its_refine_round_and_runs_it(small_adata, monkeypatch):
    """The clustering's k-means ends with ``REFINE_ROUNDS`` Lloyd releases of the k centroids: the last
    release has k rows in the schedule (what a federated site serves), the plan is calibrated for
    every release, and the run follows it; without refine rounds the schedule loses that release."""
    from dpsc.methods import cluster_design, cluster_plan, clustering

    plan = cluster_plan.plan_clustering(
        8.0, 1e-5, n_vars=small_adata.n_vars, n_clusters=3, n_obs=small_adata.n_obs
    )
    tables = [entry for entry in plan.schedule() if entry.kind == "kmeans"]
    assert [entry.rows for entry in tables[1:]] == [12, 12, 3] and plan.kmeans_steps == 4
    result = clustering.run_clustering(plan, clustering.central_release_sum(small_adata.X, NoiseSource(1)))
    assert result.centroids.shape == (3, plan.n_comps) and result.releases == plan.n_releases
    monkeypatch.setattr(cluster_design, "REFINE_ROUNDS", 0)
    plain = cluster_plan.plan_clustering(
        8.0, 1e-5, n_vars=small_adata.n_vars, n_clusters=3, n_obs=small_adata.n_obs
    )
    tables = [entry for entry in plain.schedule() if entry.kind == "kmeans"]
    assert [entry.rows for entry in tables[1:]] == [12, 12] and plain.kmeans_steps == 3
    assert plain.sigmas["kmeans"] < plan.sigmas["kmeans"]  # one release fewer shares the k-means' ε


def test_the_reported_centroid_noise_is_the_spread_of_the_released_means():
    """return_noise: each centroid's noise sd per coordinate, κRs/c_j from released counts and σ,
    matches the spread of its noisy mean over independent noise draws (one Lloyd round from
    public starting centroids); 0 without noise."""
    from dpsc.methods import central_table_release

    z, truth = _blobs_on_sphere(n_per=200, k=3, d=6)
    start = np.stack([z.numpy()[truth == g].mean(0) for g in range(3)])
    settings = {"n_sketch_steps": 0, "n_lloyd_rounds": 1, "steps_per_round": 2, "start": start}

    def once(sigma, seed):
        noise, drawn = NoiseSource(seed), iter(range(100))
        release = central_table_release(
            z,
            clip_norm=RADIUS,
            count_scale=1.0,
            noise_multiplier=sigma,
            draw_stream=lambda: noise.stream("kmeans", next(drawn)),
        )
        return dp_kmeans_centroids(
            release,
            3,
            6,
            noise_multiplier=sigma,
            clip_norm=RADIUS,
            return_in_use=True,
            return_noise=True,
            **settings,
        )

    draws = [once(20.0, seed) for seed in range(40)]
    spread = np.stack([centroids for centroids, _, _ in draws]).std(axis=0).mean(axis=1)
    reported = np.mean([noise for _, _, noise in draws], axis=0)
    assert np.all(reported > 0)
    np.testing.assert_allclose(spread, reported, rtol=0.35)
    assert np.all(once(0.0, 0)[2] == 0)
