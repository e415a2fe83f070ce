import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch

import dpsc
from dpsc.model import DPDCAN, SharedEncoder


@pytest.mark.slow
def test_fit_writes_documented_keys(small_adata, tiny_fit):
    model = dpsc.tl.fit(small_adata, epsilon=4.0, **tiny_fit, return_model=True)
    assert isinstance(model, DPDCAN)
    assert small_adata.obsm["X_dpdcan"].shape == (small_adata.n_obs, 16)  # the default model's latent
    assert isinstance(small_adata.obs["dp_cluster"].dtype, pd.CategoricalDtype)
    rec = small_adata.uns["dpsc"]["X_dpdcan"]["privacy"]
    for key in (
        "epsilon",
        "target_epsilon",
        "delta",
        "noise_multiplier",
        "sample_rate",
        "steps",
        "max_grad_norm",
        "accountant",
        "scope",
        "statement",
    ):
        assert key in rec
    assert 0 < rec["epsilon"] <= 4.0
    assert rec["scope"] == "encoder" and "decoder" in rec["statement"] and "Not covered" in rec["statement"]
    # steps actually run: the clustering's 6 releases (cell sum, second moments, 4 k-means tables of
    # the 200-gene plan: sketch, 2 Lloyd rounds, the refine round) + 3 epochs x 10 Poisson draws
    # + 1 cluster-frequency release per cluster epoch + 1 label-count release + the partition
    # choice (the centroids start at the encoder's image of the clustering's: no release)
    planned = small_adata.uns["dpsc"]["X_dpdcan"]["params"]["planned_steps"]  # the sampled steps
    assert rec["steps"] == 6 + 3 * 10 + 1 + 1 + 1 == planned + 7
    assert rec["kmeans_steps"] == 0 and rec["frequency_steps"] == 1 and rec["label_steps"] == 1
    assert rec["curve_steps"][-1] == rec["steps"]
    assert rec["curve_epsilon"][-1] == pytest.approx(rec["epsilon"])


@pytest.mark.slow
def test_noise_is_secret_unless_a_noise_seed_is_opted_into(small_adata, tiny_fit):
    a, b, c, d = (small_adata.copy() for _ in range(4))
    dpsc.tl.fit(a, epsilon=8.0, random_state=1, **tiny_fit)
    dpsc.tl.fit(b, epsilon=8.0, random_state=1, **tiny_fit)
    # same random_state, secret noise: different encoders (and the record says secret)
    assert not np.allclose(a.obsm["X_dpdcan"], b.obsm["X_dpdcan"])
    assert a.uns["dpsc"]["X_dpdcan"]["privacy"]["noise"]["secret"]
    assert "keyed with OS entropy" in a.uns["dpsc"]["X_dpdcan"]["privacy"]["statement"]
    dpsc.tl.fit(c, epsilon=8.0, random_state=1, noise_seed=11, **tiny_fit)
    dpsc.tl.fit(d, epsilon=8.0, random_state=1, noise_seed=11, **tiny_fit)
    np.testing.assert_array_equal(c.obsm["X_dpdcan"], d.obsm["X_dpdcan"])
    np.testing.assert_array_equal(c.obs["dp_cluster"], d.obs["dp_cluster"])
    record = c.uns["dpsc"]["X_dpdcan"]["privacy"]
    assert not record["noise"]["secret"] and "does NOT hold against anyone who knows" in record["statement"]


@pytest.mark.slow
def test_every_mechanism_draws_from_the_secure_source(small_adata, monkeypatch, tiny_fit):
    """With the OS-entropy seam patched to a constant, two secret fits coincide: nothing else is random."""
    import dpsc.privacy._random as random

    calls = []

    def fixed() -> bytes:
        calls.append(1)
        return bytes(range(32))

    monkeypatch.setattr(random, "secure_key", fixed)
    a, b = small_adata.copy(), small_adata.copy()
    dpsc.tl.fit(a, epsilon=8.0, random_state=1, **tiny_fit)
    n_calls = len(calls)
    dpsc.tl.fit(b, epsilon=8.0, random_state=1, **tiny_fit)
    assert n_calls >= 4  # sampling, DP-SGD noise of each stage, k-means and frequency releases
    np.testing.assert_array_equal(a.obsm["X_dpdcan"], b.obsm["X_dpdcan"])


@pytest.mark.slow
def test_scope_sets_the_guarantee(small_adata, tiny_fit):
    a, b, c = small_adata.copy(), small_adata.copy(), small_adata.copy()
    dpsc.tl.fit(a, epsilon=8.0, **tiny_fit)
    dpsc.tl.fit(b, epsilon=8.0, scope="full", **tiny_fit)
    dpsc.tl.fit(c, epsilon=8.0, scope="paper", **tiny_fit)
    enc, full, paper = (x.uns["dpsc"]["X_dpdcan"]["privacy"] for x in (a, b, c))
    assert enc["guarantee"] == "proven" and enc["statement"].startswith("Proven")  # the default
    assert "decoder is fixed" in enc["statement"]
    assert paper["guarantee"] == "heuristic" and paper["statement"].startswith("HEURISTIC")
    assert "not a proof" in paper["statement"][:60]
    assert full["guarantee"] == "proven" and full["statement"].startswith("Proven")


@pytest.mark.slow
def test_copy_returns_annotated_copy_and_leaves_input(small_adata, tiny_fit):
    before = set(small_adata.obsm.keys())
    out = dpsc.tl.fit(small_adata, epsilon=8.0, copy=True, key_added="X_test", cluster_key="cl", **tiny_fit)
    assert "X_test" in out.obsm and "cl" in out.obs
    assert set(small_adata.obsm.keys()) == before and "cl" not in small_adata.obs
    # the original's cells were read: its ledger books the fit, and only that changed in it
    assert dpsc.privacy.ledger_frame(small_adata)["key"].tolist() == ["X_test"]
    assert "X_test" not in small_adata.uns["dpsc"]


@pytest.mark.slow
def test_one_return_rule(small_adata, tiny_fit):
    assert dpsc.tl.fit(small_adata, epsilon=8.0, **tiny_fit) is None
    out, model = dpsc.tl.fit(
        small_adata, epsilon=8.0, copy=True, return_model=True, key_added="X2", **tiny_fit
    )
    assert isinstance(out, ad.AnnData) and isinstance(model, dpsc.model.DPDCAN)
    assert "X2" in out.obsm and "X2" not in small_adata.obsm


@pytest.mark.slow
def test_dense_and_sparse_give_the_same_fit(small_adata, tiny_fit):
    dense = small_adata.copy()
    dense.X = dense.X.toarray()
    dpsc.tl.fit(dense, epsilon=8.0, noise_seed=0, **tiny_fit)
    dpsc.tl.fit(small_adata, epsilon=8.0, noise_seed=0, **tiny_fit)
    np.testing.assert_allclose(dense.obsm["X_dpdcan"], small_adata.obsm["X_dpdcan"], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_backed_h5ad_gives_the_same_fit(small_adata, tmp_path, tiny_fit):
    """A file opened with backed="r" streams; the fit equals the in-memory one."""
    import anndata as ad

    path = tmp_path / "cells.h5ad"
    small_adata.write_h5ad(path)
    backed = ad.read_h5ad(path, backed="r")
    dpsc.tl.fit(backed, epsilon=8.0, noise_seed=0, **tiny_fit)
    dpsc.tl.fit(small_adata, epsilon=8.0, noise_seed=0, **tiny_fit)
    np.testing.assert_allclose(backed.obsm["X_dpdcan"], small_adata.obsm["X_dpdcan"], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_non_private_and_full_scope(small_adata, tiny_fit):
    a = small_adata.copy()
    dpsc.tl.fit(a, epsilon=None, **tiny_fit)
    assert np.isnan(a.uns["dpsc"]["X_dpdcan"]["privacy"]["epsilon"])
    assert "No differential privacy" in a.uns["dpsc"]["X_dpdcan"]["privacy"]["statement"]
    b = small_adata.copy()
    dpsc.tl.fit(b, epsilon=8.0, scope="full", **tiny_fit)
    assert b.uns["dpsc"]["X_dpdcan"]["privacy"]["scope"] == "full"
    assert "decoder" in " ".join(b.uns["dpsc"]["X_dpdcan"]["privacy"]["private_parameters"])


@pytest.mark.slow
def test_layer_and_h5ad_round_trip(small_adata, tmp_path, tiny_fit):
    small_adata.layers["counts"] = small_adata.X.copy()
    small_adata.X = sp.csr_matrix(np.log1p(small_adata.X.toarray()))
    dpsc.tl.fit(small_adata, epsilon=8.0, layer="counts", **tiny_fit)
    path = tmp_path / "out.h5ad"
    small_adata.write_h5ad(path)
    import anndata as ad

    back = ad.read_h5ad(path)
    record = small_adata.uns["dpsc"]["X_dpdcan"]["privacy"]
    assert back.uns["dpsc"]["X_dpdcan"]["privacy"]["statement"] == record["statement"]


@pytest.mark.slow
def test_trained_model_refuses_a_second_ledger(small_adata, tiny_fit):
    model = dpsc.tl.fit(small_adata, epsilon=8.0, **tiny_fit, return_model=True)
    with pytest.raises(RuntimeError, match="already trained"):
        model.train(epsilon=8.0, instance_epochs=1, cluster_epochs=1, progress_bar=False)


@pytest.mark.slow
def test_save_load_round_trip(small_adata, tmp_path, tiny_fit):
    model = dpsc.tl.fit(small_adata, epsilon=8.0, **tiny_fit, return_model=True)
    z = model.get_latent_representation()
    model.save(tmp_path / "m", overwrite=True)
    loaded = DPDCAN.load(tmp_path / "m", adata=small_adata)
    np.testing.assert_allclose(loaded.get_latent_representation(), z, rtol=1e-6)
    np.testing.assert_array_equal(loaded.predict(), model.predict())
    assert loaded.privacy_["epsilon"] == model.privacy_["epsilon"]
    assert model.history_ is None  # no exact training losses are kept after a DP fit


@pytest.mark.slow
def test_export_shared_has_no_decoder_and_reproduces_outputs(small_adata, tmp_path, tiny_fit, monkeypatch):
    model = dpsc.tl.fit(small_adata, epsilon=8.0, **tiny_fit, return_model=True)
    model.export_shared(tmp_path / "share")
    state = torch.load(tmp_path / "share" / "shared_encoder.pt", weights_only=True)
    assert all(
        k.startswith(("encoder.", "clustering.")) or k in ("input_loadings", "latent_weights") for k in state
    )
    assert "latent_weights" in state  # the residual latent's public coordinate weights travel with it
    assert not any(k.startswith(("decoder.", "px_")) for k in state)
    shared = SharedEncoder.load(tmp_path / "share")
    np.testing.assert_allclose(
        shared.get_latent_representation(small_adata), model.get_latent_representation(), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_array_equal(shared.predict(small_adata), model.predict().astype(str))
    assert shared.privacy["epsilon"] == pytest.approx(model.privacy_["epsilon"])
    with pytest.raises(FileExistsError):
        model.export_shared(tmp_path / "share")
    # Encoded in blocks of 7 cells, genes in another order: the same codes, cell for cell.
    monkeypatch.setattr(dpsc._blocks, "DENSE_ROWS", 7)
    shuffled = small_adata[:, np.random.default_rng(0).permutation(small_adata.n_vars)].copy()
    np.testing.assert_allclose(
        shared.get_latent_representation(shuffled), model.get_latent_representation(), rtol=1e-5, atol=1e-5
    )
    # The model's own inference in loader batches of 7 cells fills every row in order.
    np.testing.assert_allclose(
        model.get_latent_representation(batch_size=7), model.get_latent_representation(), atol=1e-5
    )
    np.testing.assert_array_equal(model.predict(batch_size=7), model.predict())
    with pytest.raises(ValueError, match=r"missing from adata\.var_names"):
        shared.get_latent_representation(small_adata[:, :50])
    # Another site's cells may have genes without counts: inference still works.
    few = small_adata[:5].copy()
    assert (np.asarray(few.X.sum(0)).ravel() == 0).any()
    assert shared.predict(few).shape == (5,)


@pytest.mark.slow
def test_gaussian_likelihood_for_lognormalised_data(small_adata, tiny_fit):
    small_adata.X = sp.csr_matrix(np.log1p(small_adata.X.toarray()).astype(np.float32))
    dpsc.tl.fit(small_adata, epsilon=8.0, likelihood="gaussian", **tiny_fit)
    assert np.isfinite(small_adata.obsm["X_dpdcan"]).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_private_fit_runs_on_gpu(small_adata, tiny_fit):
    adata = small_adata.copy()
    dpsc.tl.fit(adata, epsilon=8.0, **{**tiny_fit, "accelerator": "gpu"})
    assert adata.uns["dpsc"]["X_dpdcan"]["privacy"]["epsilon"] <= 8.0
    assert np.isfinite(adata.obsm["X_dpdcan"]).all()


@pytest.mark.slow
def test_fit_warns_before_training_when_cells_are_few(small_adata, tiny_fit):
    with pytest.warns(UserWarning, match="cells are few for private clustering") as caught:
        dpsc.tl.fit(small_adata, epsilon=1.0, **tiny_fit)
    assert "X_dpdcan" in small_adata.obsm
    first = next(w for w in caught if "cells are few" in str(w.message))
    assert "300 cells" in str(first.message)
