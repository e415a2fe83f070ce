"""The private scanpy pipeline: DP PCA (Analyze Gauss) and DP k-means, each a ledger entry."""

import warnings

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.metrics import adjusted_rand_score

import dpsc
from dpsc import _blocks
from dpsc.methods import kmeans_release_steps, nearest_centroid
from dpsc.methods.pca import residual_rows, second_moment, unit_rows
from dpsc.privacy import BudgetExceededError, ledger_frame, set_budget, spent
from dpsc.tl._kmeans import KMEANS_DEFAULTS


def blobs(n_per=150, k=4, genes=60, seed=0):
    """Counts of k cell types, each with its own set of highly expressed genes."""
    rng = np.random.default_rng(seed)
    rows, labels = [], []
    for c in range(k):
        rate = np.full(genes, 1.0)
        rate[c * (genes // k) : (c + 1) * (genes // k)] = 12.0
        rows.append(rng.poisson(rate, size=(n_per, genes)))
        labels += [c] * n_per
    X = sp.csr_matrix(np.vstack(rows).astype(np.float32))
    adata = ad.AnnData(X)
    adata.obs["truth"] = np.array(labels).astype(str)
    return adata


def test_one_cell_moves_the_released_matrix_by_at_most_one():
    rng = np.random.default_rng(0)
    for _ in range(200):
        z = unit_rows(rng.poisson(3.0, size=(1, 30)) + 1.0)[0]
        iu = np.triu_indices(30)
        assert np.linalg.norm(np.outer(z, z)[iu]) <= 1.0 + 1e-12


def test_second_moment_sums_every_cell_across_dense_blocks(monkeypatch):
    adata = blobs(n_per=40)  # 160 cells, read 7 at a time: 22 full blocks and a partial one
    monkeypatch.setattr(_blocks, "DENSE_ROWS", 7)
    Z = unit_rows(adata.X).toarray()
    expected = Z.T @ Z
    np.testing.assert_allclose(second_moment(adata.X), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(second_moment(adata.X.toarray()), expected, rtol=1e-12, atol=1e-12)
    without_last = second_moment(adata.X[:-1])  # a cell in the partial block counts once
    np.testing.assert_allclose(expected - without_last, np.outer(Z[-1], Z[-1]), atol=1e-12)


def test_pca_writes_scanpy_keys_and_a_proven_record():
    adata = blobs()
    dpsc.pp.pca(adata, n_comps=5, epsilon=8.0, n_genes=40, noise_seed=0)
    assert adata.obsm["X_pca"].shape == (adata.n_obs, 5) and adata.varm["PCs"].shape == (adata.n_vars, 5)
    assert adata.var["dp_pca_gene"].sum() == 40
    assert np.all(adata.varm["PCs"][~adata.var["dp_pca_gene"].to_numpy()] == 0)
    assert np.all(np.linalg.norm(adata.obsm["X_pca"], axis=1) <= 1 + 1e-5)
    record = dpsc.privacy.get_record(adata, "X_pca")
    assert record["guarantee"] == "proven" and 0 < record["epsilon"] <= 8.0
    assert record["statement"].startswith("Proven") and tuple(record["history"][0]) == (
        record["noise_multiplier"],
        1.0,
        1.0,
    )
    assert spent(adata)[0] == pytest.approx(record["epsilon"])


def test_dropping_the_mean_component_keeps_the_next_loadings_of_the_same_release():
    with_mean, without = blobs(), blobs()
    dpsc.pp.pca(with_mean, n_comps=4, epsilon=8.0, drop_mean_component=False, noise_seed=3)
    dpsc.pp.pca(without, n_comps=3, epsilon=8.0, noise_seed=3)
    np.testing.assert_allclose(without.varm["PCs"], with_mean.varm["PCs"][:, 1:], atol=1e-10)
    top = with_mean.varm["PCs"][:, 0]
    mean_cell = np.asarray(unit_rows(with_mean.X).mean(0)).ravel()
    assert abs(top @ mean_cell) / np.linalg.norm(mean_cell) > 0.99  # the dropped one is the mean cell
    with pytest.raises(ValueError, match="plus the dropped mean component"):
        dpsc.pp.pca(blobs(), n_comps=5, epsilon=1.0, n_genes=5)


def test_cosine_labels_ignore_each_cell_s_scale():
    rng = np.random.default_rng(0)
    points, centroids = rng.normal(size=(50, 3)), rng.normal(size=(4, 3))  # means: any norm
    scaled = points * rng.uniform(0.01, 5.0, size=(50, 1))
    np.testing.assert_array_equal(nearest_centroid(points, centroids), nearest_centroid(scaled, centroids))
    assert not np.array_equal(
        nearest_centroid(points, centroids, "euclidean"), nearest_centroid(scaled, centroids, "euclidean")
    )


def test_pca_noise_is_secret_unless_seeded():
    a, b, c, d = (blobs() for _ in range(4))
    for x in (a, b):
        dpsc.pp.pca(x, n_comps=3, epsilon=1.0, n_genes=None)
    assert not np.allclose(a.varm["PCs"], b.varm["PCs"])
    for x in (c, d):
        dpsc.pp.pca(x, n_comps=3, epsilon=1.0, n_genes=None, noise_seed=4)
    np.testing.assert_array_equal(c.varm["PCs"], d.varm["PCs"])


def test_pipeline_recovers_separated_types_and_composes_in_the_ledger():
    adata = blobs()
    dpsc.pp.pca(adata, n_comps=4, epsilon=4.0, n_genes=None, noise_seed=1)
    out = dpsc.tl.kmeans(adata, 4, epsilon=4.0, noise_seed=1, copy=True)
    assert "dp_cluster" not in adata.obs and "dp_cluster" in out.obs  # copy=True leaves adata alone
    labels = out.obs["dp_cluster"]
    assert list(labels.cat.categories) == ["0", "1", "2", "3"]
    assert adjusted_rand_score(out.obs["truth"], labels) > 0.9
    result = out.uns["dpsc"]["dp_cluster"]
    plan = (KMEANS_DEFAULTS[key] for key in ("n_sketch_steps", "n_lloyd_rounds", "steps_per_round"))
    assert result["centroids"].shape == (4, 4) and result["privacy"]["steps"] == kmeans_release_steps(*plan)
    eps, delta = spent(out)
    entries = ledger_frame(out)["epsilon"].to_numpy()
    assert entries.max() < eps < entries.sum() and delta == pytest.approx(2e-5)


def test_kmeans_warns_when_few_released_centroids_hold_cells():
    adata = blobs()
    dpsc.pp.pca(adata, n_comps=4, epsilon=4.0, n_genes=None, noise_seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # separated types: every centroid labels cells, no note
        dpsc.tl.kmeans(adata, 4, epsilon=4.0, noise_seed=1)
    assert adata.uns["dpsc"]["dp_cluster"]["clusters_in_use"] == 4
    adata.obsm["one_direction"] = np.tile([[0.3, 0.1, 0.0, 0.2]], (adata.n_obs, 1))
    with pytest.warns(UserWarning, match="Only 1 of the 6 released centroids hold a share"):
        dpsc.tl.kmeans(adata, 6, epsilon=4.0, use_rep="one_direction", key_added="flat", noise_seed=2)
    assert adata.obs["flat"].nunique() == 1 and adata.uns["dpsc"]["flat"]["clusters_in_use"] == 1


def test_budget_and_bad_input_leave_adata_unchanged():
    adata = blobs()
    set_budget(adata, 1.0)
    before = adata.copy()
    with pytest.raises(BudgetExceededError):
        dpsc.pp.pca(adata, n_comps=3, epsilon=2.0)
    with pytest.raises(ValueError, match="compute a representation first"):
        dpsc.tl.kmeans(adata, 3)
    with pytest.raises(ValueError, match="n_genes"):
        dpsc.pp.pca(adata, n_comps=10, epsilon=0.5, n_genes=5)
    assert set(adata.obsm) == set(before.obsm) and set(adata.uns["dpsc"]) == {"budget"}
    # values that are not counts are refused before booking (a local check of the caller's cells)
    bad = blobs()
    bad.X = -bad.X
    with pytest.raises(ValueError, match=r"negative or non-integer values.*log_normalize=False"):
        dpsc.pp.pca(bad, n_comps=3, epsilon=0.5)
    assert "X_pca" not in bad.obsm and dpsc.privacy.spent(bad).epsilon == 0.0


def test_a_unit_residual_moves_the_release_by_at_most_one_whatever_directions_the_server_sends():
    """Each cell's residual contribution has norm ≤ 1 for any released columns, even malformed ones."""
    rng = np.random.default_rng(1)
    iu = np.triu_indices(30)
    for _ in range(200):
        z = unit_rows(rng.poisson(3.0, size=(1, 30)) + 1.0)
        released = rng.normal(size=(30, rng.integers(1, 4))) * rng.choice([1e-3, 1.0, 1e3])
        r = residual_rows(z, released)[0]
        assert np.linalg.norm(np.outer(r, r)[iu]) <= 1.0 + 1e-12
    u = np.ones((30, 1)) / np.sqrt(30)
    assert np.all(residual_rows(u.T, u) == 0)  # a cell along the direction contributes nothing


def test_the_one_call_loads_the_mean_direction_then_the_residual_components():
    """Without noise: loadings = [mean direction, top eigenvectors of the unit residuals], orthonormal."""
    adata = blobs(n_per=60, k=4, genes=80)
    exact = adata.copy()
    dpsc.tl.cluster(exact, 4, epsilon=None)
    loadings = exact.varm["dp_cluster_loadings"]
    np.testing.assert_allclose(loadings.T @ loadings, np.eye(loadings.shape[1]), atol=1e-10)
    Z = unit_rows(adata.X).toarray()
    u = Z.sum(0) / np.linalg.norm(Z.sum(0))
    np.testing.assert_allclose(loadings[:, 0], u, atol=1e-5)  # the sums are lattice-encoded
    R = residual_rows(Z, u[:, None])
    top = np.linalg.eigh(R.T @ R)[1][:, ::-1][:, :3]  # the types' directions: 3 clear components
    np.testing.assert_allclose(np.linalg.svd(top.T @ loadings[:, 1:4])[1], 1.0, atol=1e-6)
    assert exact.var["dp_cluster_gene"].all()
    assert adjusted_rand_score(adata.obs["truth"], exact.obs["dp_cluster"]) == 1.0
    noisy = adata.copy()
    dpsc.tl.cluster(noisy, 4, epsilon=8.0, noise_seed=0)
    released = noisy.varm["dp_cluster_loadings"]
    assert released[:, 0] @ u > 0.95  # the released sum's direction, off by its noise
    np.testing.assert_allclose(released.T @ released, np.eye(16), atol=1e-10)


def test_the_plan_reads_fewer_genes_when_the_noise_would_drown_them():
    """G = clip((0.02 n / σ)², 250, 2000) from n, ε and δ only; the composed ε stays the asked one."""
    from dpsc.methods.cluster_design import MAX_GENES, MIN_GENES, genes_for
    from dpsc.methods.cluster_plan import plan_clustering

    plans = {eps: plan_clustering(eps, 1e-5, n_vars=3000, n_clusters=8, n_obs=8000) for eps in (1, 4, 8)}
    counts = [plans[eps].n_genes for eps in (1, 4, 8)]
    assert MIN_GENES < counts[0] < counts[1] <= counts[2] == MAX_GENES
    assert plan_clustering(1, 1e-5, n_vars=3000, n_clusters=8, n_obs=2000).n_genes == MIN_GENES  # the floor
    one = plans[1]
    assert (
        one.n_genes == genes_for(8000, one.sigmas["pca"], 3000) == int((0.02 * 8000 / one.sigmas["pca"]) ** 2)
    )
    assert one.select_genes and one.sigmas["genes"] > 0 and one.n_comps == 16
    for eps, plan in plans.items():
        assert plan.spent() == pytest.approx(eps, rel=0.01)
    exact = plan_clustering(None, 1e-5, n_vars=3000, n_clusters=8, n_obs=4000)
    assert exact.n_genes == MAX_GENES  # the no-noise design reads 2000 genes
    small = plan_clustering(8, 1e-5, n_vars=2000, n_clusters=8, n_obs=10**6)
    assert not small.select_genes and small.sigmas["genes"] == 0  # all 2000 genes: nothing to select
    assert plan_clustering(1, 1e-5, n_vars=200, n_clusters=3).n_genes == 200  # below the floor: no n needed
    with pytest.raises(ValueError, match="n_obs"):
        plan_clustering(1, 1e-5, n_vars=3000, n_clusters=8)
    received = plan_clustering(1, 1e-5, n_vars=3000, n_clusters=8, n_genes=one.n_genes)
    assert received.sigmas == one.sigmas  # a site calibrates the plan's genes without knowing n


def test_the_one_call_selects_the_genes_of_its_plan_at_small_epsilon():
    adata = blobs(n_per=150, k=4, genes=400)  # 600 cells: at ε = 1 the plan reads 250 of 400 genes
    dpsc.tl.cluster(adata, 4, epsilon=1.0, noise_seed=0)
    record = dpsc.privacy.get_record(adata, "dp_cluster")
    assert (
        int(adata.var["dp_cluster_gene"].sum())
        == 250
        == adata.uns["dpsc"]["dp_cluster"]["params"]["genes_selected"]
    )
    assert "gene statistics" in record["statement"]
    assert spent(adata).epsilon == pytest.approx(1.0, rel=0.01)


def test_the_one_call_reduces_its_lloyd_centroids_with_the_plans_starts(monkeypatch):
    """The 4k noisy Lloyd centroids are reduced to k by a weighted k-means of the plan's starts."""
    import sklearn.cluster

    starts = []
    original = sklearn.cluster.KMeans

    class Recording(original):
        def fit(self, X, y=None, sample_weight=None):
            starts.append((self.n_clusters, self.n_init, len(X)))
            return super().fit(X, y, sample_weight=sample_weight)

    monkeypatch.setattr(sklearn.cluster, "KMeans", Recording)
    dpsc.tl.cluster(blobs(), 4, epsilon=8.0, noise_seed=0)
    lloyd = KMEANS_DEFAULTS["oversampling"] * 4
    assert starts[-1] == (4, KMEANS_DEFAULTS["reduction_starts"], lloyd) and starts[-1][1] == 100
