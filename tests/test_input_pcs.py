"""The proven scope's model: frozen DP principal components as the encoder's input (``input_pcs``)."""

import numpy as np
import pytest
import torch

import dpsc
from dpsc.methods.pca import unit_rows
from dpsc.model import DPDCAN, SharedEncoder
from dpsc.model._dcan_privacy import LOADINGS
from dpsc.privacy import make_accountant, split_budget


def test_split_budget_composes_to_the_target_in_the_given_shares():
    parts = {"loadings": (0.6, 1.0, 1), "training": (0.4, 0.1, 200)}
    split = split_budget(4.0, 1e-5, parts)
    (eps_v, sigma_v), (eps_t, sigma_t) = split["loadings"], split["training"]
    # each part is calibrated once to its nominal share, then both σ are scaled by one factor
    assert eps_v / eps_t == pytest.approx(0.6 / 0.4, rel=0.1)
    acc = make_accountant("rdp")
    acc.history = [(sigma_v, 1.0, 1), (sigma_t, 0.1, 200)]
    assert 0.97 * 4.0 <= acc.get_epsilon(1e-5) <= 4.0
    # composing in one accountant buys more than the sum of the parts' epsilons
    assert eps_v + eps_t > 4.0
    with pytest.raises(ValueError, match="positive"):
        split_budget(4.0, 1e-5, {"a": (0.0, 1.0, 1), "b": (1.0, 1.0, 1)})


@pytest.mark.slow
def test_full_scope_releases_the_loadings_inside_its_epsilon(small_adata, tiny_fit):
    # input_pcs=16: the model releases its own loadings (the default starts from the clustering's)
    model = dpsc.tl.fit(
        small_adata, epsilon=4.0, scope="full", input_pcs=16, noise_seed=0, return_model=True, **tiny_fit
    )
    rec = dpsc.privacy.get_record(small_adata, "X_dpdcan")
    assert rec["guarantee"] == "proven" and rec["private_parameters"][0] == LOADINGS
    assert "input loadings" in rec["statement"]
    history = [tuple(h) for h in rec["history"]]
    sigma_v = rec["loadings_noise_multiplier"]
    assert history[0] == pytest.approx((sigma_v, 1.0, 1))  # one Gaussian release at q = 1, first
    assert rec["steps"] == small_adata.uns["dpsc"]["X_dpdcan"]["params"]["planned_steps"] + 1
    assert 0.97 * 4.0 <= rec["epsilon"] <= 4.0  # loadings + training composed to the target
    V = model.module.input_loadings.numpy()
    assert V.shape == (small_adata.n_vars, 16)
    np.testing.assert_allclose(V.T @ V, np.eye(16), atol=1e-5)  # noisy eigenvectors, orthonormal
    assert small_adata.obsm["X_dpdcan"].shape == (small_adata.n_obs, model.module.n_latent)


@pytest.mark.slow
def test_non_private_loadings_are_the_exact_components(small_adata, tiny_fit):
    """Without noise the frozen loadings span the top eigenvectors 2..k+1 of sum_i u_i u_i^T."""
    model = dpsc.tl.fit(small_adata, epsilon=None, scope="full", input_pcs=5, return_model=True, **tiny_fit)
    U = np.asarray(unit_rows(small_adata.X).todense())
    eigval, eigvec = np.linalg.eigh(U.T @ U)
    expected = eigvec[:, np.argsort(eigval)[::-1][1:6]]  # the mean direction is dropped
    V = model.module.input_loadings.numpy().astype(np.float64)
    np.testing.assert_allclose(np.abs(np.sum(V * expected, axis=0)), 1.0, atol=1e-4)


@pytest.mark.slow
def test_shared_encoder_carries_the_loadings(small_adata, tmp_path, tiny_fit):
    model = dpsc.tl.fit(small_adata, epsilon=8.0, scope="full", return_model=True, **tiny_fit)
    model.export_shared(tmp_path / "share")
    state = torch.load(tmp_path / "share" / "shared_encoder.pt", weights_only=True)
    assert "input_loadings" in state and not any(k.startswith(("decoder.", "px_")) for k in state)
    shared = SharedEncoder.load(tmp_path / "share")
    np.testing.assert_allclose(
        shared.get_latent_representation(small_adata), model.get_latent_representation(), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_array_equal(shared.predict(small_adata), model.predict().astype(str))


@pytest.mark.parametrize("bad", [0, 200, 2.5, True])
def test_bad_input_pcs_fails_before_touching_adata(small_adata, bad):
    before = small_adata.copy()
    with pytest.raises(ValueError, match=r"input_pcs must be an integer in \[1, 199\]"):
        dpsc.tl.fit(small_adata, epsilon=8.0, scope="full", input_pcs=bad)
    assert small_adata.uns.keys() == before.uns.keys() and small_adata.obsm.keys() == before.obsm.keys()
    DPDCAN.setup_anndata(small_adata)
    with pytest.raises(ValueError, match="input_pcs"):
        DPDCAN(small_adata, input_pcs=bad)
