"""The default fit starts from the private clustering and keeps the better partition by one release."""

import numpy as np
import pytest

import dpsc
from dpsc.methods import selection as _selection
from dpsc.methods.clustering import cell_points
from dpsc.model._dcan_privacy import CHOICE, START


def _unit_points(rng, centers, per_cluster, spread):
    points = np.concatenate([c + spread * rng.standard_normal((per_cluster, c.size)) for c in centers])
    return points / np.linalg.norm(points, axis=1, keepdims=True)


def test_one_cell_moves_the_two_tables_by_at_most_the_sensitivity():
    """Adding a cell adds (p, 1) to one row of each table: L2 norm at most 2, whatever the cell."""
    rng = np.random.default_rng(0)
    points = rng.standard_normal((50, 6))
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    labels = (rng.integers(0, 4, 50), rng.integers(0, 4, 50))
    base = _selection.partition_tables(points, labels, 4)
    for extra in ([np.ones(6) * 5.0], [np.full(6, np.nan)], [np.eye(6)[0]]):  # long, not finite, unit
        more = np.vstack([points, extra])
        with_cell = _selection.partition_tables(more, (np.append(labels[0], 3), np.append(labels[1], 0)), 4)
        assert np.linalg.norm(with_cell - base) <= _selection.SENSITIVITY + 1e-12
    with pytest.raises(ValueError, match="cluster index"):
        _selection.partition_tables(points, (labels[0], labels[1] + 4), 4)


def test_exact_scores_prefer_the_tighter_partition_and_noise_keeps_the_clustering():
    rng = np.random.default_rng(1)
    centers = [np.eye(8)[j] * 3 for j in range(4)]
    points = _unit_points(rng, centers, 200, 0.3)
    truth = np.repeat(np.arange(4), 200)
    shuffled = truth.copy()
    moved = rng.random(800) < 0.5
    shuffled[moved] = rng.integers(0, 4, moved.sum())  # half the cells in a random cluster
    exact = _selection.partition_tables(points, (shuffled, truth), 4)
    choice = _selection.select_partition(exact, 4, 8, 0.0)
    assert choice.scores[1] > choice.scores[0] and choice.kept == "model"
    swapped = _selection.select_partition(
        _selection.partition_tables(points, (truth, shuffled), 4), 4, 8, 0.0
    )
    assert swapped.kept == "clustering"
    # a lead below the margin (noise of sd s) keeps the clustering's partition
    close = _selection.Selection((100.0, 100.0 + 0.5 * 2.0 * np.sqrt(40)), (np.ones(4), np.ones(4)), 1.0)
    assert close.kept == "clustering"
    far = _selection.Selection((100.0, 100.0 + 2.01 * np.sqrt(40)), (np.ones(4), np.ones(4)), 1.0)
    assert far.kept == "model"


def test_noisy_scores_are_unbiased_for_a_partition():
    """The score subtracts the noise's d·s² from each squared sum: its mean stays at the exact W."""
    rng = np.random.default_rng(2)
    points = _unit_points(rng, [np.eye(5)[j] * 2 for j in range(3)], 300, 0.4)
    labels = np.repeat(np.arange(3), 300)
    exact = _selection.partition_tables(points, (labels, labels), 3)
    W = _selection.select_partition(exact, 3, 5, 0.0).scores[0]
    s = 5.0
    noisy = [
        _selection.select_partition(exact + s * rng.standard_normal(exact.size), 3, 5, s).scores[0]
        for _ in range(400)
    ]
    assert abs(np.mean(noisy) - W) < 4 * np.std(noisy) / np.sqrt(400) + 1.0


def test_default_fit_starts_from_the_clustering_and_records_every_release(small_adata, tiny_fit):
    model = dpsc.tl.fit(small_adata, epsilon=4.0, noise_seed=0, return_model=True, **tiny_fit)
    entry = small_adata.uns["dpsc"]["X_dpdcan"]
    rec = dpsc.privacy.get_record(small_adata, "X_dpdcan")
    assert rec["guarantee"] == "proven"
    assert rec["private_parameters"][0] == START and CHOICE in rec["private_parameters"]
    history = [tuple(h) for h in rec["history"]]
    start_sigmas = rec["start_noise_multipliers"]
    # the clustering's releases first (cell sum, second moments, k-means), the choice last
    assert history[0][0] == pytest.approx(start_sigmas["sum"]) and history[0][1:] == (1.0, 1)
    assert history[-1] == pytest.approx((rec["selection_noise_multiplier"], 1.0, 1))
    assert 0.97 * 4.0 <= rec["epsilon"] <= 4.0
    params = entry["params"]
    assert params["partition"] in _selection.PARTITIONS and len(params["partition_scores"]) == 2
    # the model's centroids start at the encoder's image of the released centroids: no latent k-means
    assert params["kmeans"]["n_lloyd_rounds"] == 0 and params["kmeans"]["n_sketch_steps"] == 0
    assert rec["kmeans_steps"] == 0
    # the model reads the clustering's k-means points: its input is the clustering's cell points
    genes = np.flatnonzero(small_adata.var.get("dp_fit_gene", np.ones(small_adata.n_vars, bool)))
    assert model.module.input_pcs == params["input_pcs"]
    assert small_adata.obs["dp_cluster"].cat.categories.tolist() == ["0", "1", "2"]
    assert len(genes) == model.module.input_loadings.shape[0]


def test_the_model_reads_the_clustering_points(small_adata, tiny_fit):
    """With the start's loadings set, the module reads each cell's projection on them, at norm 1 the
    clustering's k-means point (cell_points, the same map)."""
    import dpsc.tl._fit as fit_module

    seen = {}
    original = fit_module.choose_partition

    def spy(matrix, start, model, plan, weights=None):
        seen["points"] = cell_points(matrix, start.genes, start.loadings)
        x = model.adata_manager.get_from_registry("X")
        import torch

        dense = torch.as_tensor(np.asarray(x.todense() if hasattr(x, "todense") else x), dtype=torch.float32)
        rep = model.module.represent(dense)
        seen["module"] = model.module.clustering_points(rep).detach().numpy()
        seen["norms"] = rep.norm(dim=1).detach().numpy()
        return original(matrix, start, model, plan, weights)

    fit_module.choose_partition = spy
    try:
        dpsc.tl.fit(small_adata, epsilon=None, **tiny_fit)
    finally:
        fit_module.choose_partition = original
    np.testing.assert_allclose(seen["module"], seen["points"], atol=1e-5)
    assert seen["norms"].max() <= 1 + 1e-5 and seen["norms"].min() < 0.99  # the projection keeps its length


def test_the_kept_clustering_partition_travels_with_the_model(small_adata, tiny_fit, tmp_path):
    """predict and a SharedEncoder give the labels tl.fit wrote, whichever partition was kept."""
    model = dpsc.tl.fit(small_adata, epsilon=8.0, noise_seed=0, return_model=True, **tiny_fit)
    written = small_adata.obs["dp_cluster"].to_numpy().astype(str)
    np.testing.assert_array_equal(model.predict().astype(str), written)
    model.export_shared(tmp_path / "share")
    shared = dpsc.model.SharedEncoder.load(tmp_path / "share")
    kept = small_adata.uns["dpsc"]["X_dpdcan"]["params"]["partition"]
    assert (shared.partition_centroids is not None) == (kept == "clustering")
    agree = np.mean(shared.predict(small_adata) == written)
    assert agree > 0.99  # float32 points on the receiving side: a tie may fall either way


def test_the_model_starts_at_the_encoders_image_of_the_released_centroids(small_adata, tiny_fit):
    """No latent release starts the centroids: each is the encoder's image of a released centroid.

    With no cluster-stage epoch the model's centroids are that start, and the model's own
    partition (nearest latent centroid) is the clustering's for nearly every cell.
    """
    import torch

    fit = {**tiny_fit, "cluster_epochs": 0}
    model = dpsc.tl.fit(small_adata, epsilon=8.0, noise_seed=0, return_model=True, **fit)
    module = model.module
    with torch.no_grad():
        start = torch.nn.functional.normalize(torch.as_tensor(model._start_centroids, dtype=torch.float32))
        image = module.assignment_space(module.encode(start)).double()
    expected = module.latent_scale * image / image.norm(dim=1, keepdim=True)
    np.testing.assert_allclose(module.clustering.centroids.detach().double(), expected, atol=1e-5)
    assert small_adata.uns["dpsc"]["X_dpdcan"]["privacy"]["kmeans_steps"] == 0
    latent = torch.as_tensor(model.get_latent_representation())
    own = module.soft_assignment(latent).argmax(1).numpy()
    x = model.adata_manager.get_from_registry("X")
    dense = torch.as_tensor(np.asarray(x.todense() if hasattr(x, "todense") else x), dtype=torch.float32)
    with torch.no_grad():
        points = module.represent(dense).numpy()
    nearest = np.linalg.norm(points[:, None] - start.numpy()[None], axis=2).argmin(1)
    assert np.mean(own == nearest) >= 0.9


def test_the_untrained_default_model_embeds_each_cell_at_its_clustering_point(small_adata, tiny_fit):
    """The default model's encoder is residual: before training, the embedding is the clustering's.

    With no epoch ``obsm["X_dpdcan"]`` is ``obsm["X_dp_cluster"]`` times the latent scale: each
    cell's projection on the clustering's loadings, its length kept, in the clustering's
    coordinates (the encoder reads the mean coordinate weighted as the k-means weights it, and
    writes its latent back without the weight), so the model starts from the clustering's
    neighbourhoods; the clusters are read from the weighted points (the clustering's partition).
    """
    import torch

    from dpsc.module import input_representation

    fit = {**tiny_fit, "instance_epochs": 0, "cluster_epochs": 0}
    model = dpsc.tl.fit(small_adata, epsilon=8.0, noise_seed=0, return_model=True, **fit)
    module = model.module
    weights = module.latent_weights.numpy()
    assert module.residual and weights[0] < 1 and (weights[1:] == 1).all()
    embedded = small_adata.obsm["X_dpdcan"]
    x = model.adata_manager.get_from_registry("X")
    dense = torch.as_tensor(np.asarray(x.todense() if hasattr(x, "todense") else x), dtype=torch.float32)
    with torch.no_grad():
        read = module.represent(dense)  # u_i on the loadings with the k-means weight: V_w^T u_i
        unweighted = torch.nn.functional.normalize(input_representation(dense, "zinb"), dim=-1) @ (
            module.input_loadings / module.latent_weights
        )
        points = module.clustering_points(read)
        clusters = module.assignment_space(torch.as_tensor(embedded)) / module.latent_scale
    np.testing.assert_allclose(embedded, module.latent_scale * unweighted.numpy(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(clusters, points, rtol=1e-4, atol=1e-5)  # the clustering's k-means points


def test_a_residual_encoder_starts_at_the_identity_and_trains_its_correction():
    """h = E r + f(r) with f's last layer zero: the untrained latent is s r (|r| <= 1), f has gradients."""
    import torch

    from dpsc.module import DCANModule

    module = DCANModule(n_input=50, n_clusters=3, n_latent=8, n_hidden=(16,), input_pcs=6, residual=True)
    rep = torch.nn.functional.normalize(torch.randn(20, 6), dim=-1) * torch.rand(20, 1)
    z = module.encode(rep)
    expected = module.latent_scale * torch.cat([rep, torch.zeros(20, 2)], dim=1)
    torch.testing.assert_close(z, expected)
    (z * torch.randn_like(z)).sum().backward()
    assert module.encoder[-1].weight.grad.abs().sum() > 0
    assert torch.allclose(module.assignment_space(z).norm(dim=1), torch.full((20,), module.latent_scale))
    plain = DCANModule(n_input=50, n_clusters=3, n_latent=8, n_hidden=(16,), input_pcs=6)
    assert not torch.allclose(plain.encode(rep), expected)
