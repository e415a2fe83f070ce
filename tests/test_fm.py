"""Functional mechanism / pCDBN: approximations, sensitivities, epoch-free privacy, annotate."""

from __future__ import annotations

import itertools

import anndata
import numpy as np
import pytest
import torch

import dpsc
from dpsc import fm
from dpsc.privacy import NoiseSource


@pytest.mark.parametrize("degree", [3, 5, 7, 9])
def test_chebyshev_error_below_stated_bound(degree):
    approx = fm.approximate_softplus("chebyshev", degree, 4.0)
    bound = fm.chebyshev_error_bound(degree, 4.0)
    assert approx.max_error() <= bound
    # and Chebyshev beats Taylor (which diverges beyond |z| = π) on the interval
    assert approx.max_error() < fm.approximate_softplus("taylor", degree, 4.0).max_error()


def test_taylor_coefficients_of_softplus():
    coef = fm.approximate_softplus("taylor", 4, 1.0).coef
    np.testing.assert_allclose(coef, [np.log(2), 1 / 2, 1 / 8, 0.0, -1 / 192], atol=1e-12)


def test_sigmoid_derivative_polynomials_match_autograd():
    z = torch.linspace(-3, 3, 7, dtype=torch.float64, requires_grad=True)
    values = torch.sigmoid(z)
    polys = fm.sigmoid_derivative_polynomials(3)
    s = torch.sigmoid(z).detach().numpy()
    for k in range(1, 4):
        (grad,) = torch.autograd.grad(values.sum(), z, create_graph=True)
        np.testing.assert_allclose(grad.detach().numpy(), polys[k](s), atol=1e-10)
        values = grad


def test_moment_tensors_and_contraction_match_brute_force():
    rng = np.random.default_rng(0)
    patches = fm.scale_patches(rng.normal(size=(5, 3, 4)))
    moments = fm.moment_tensors(patches, 4, chunk_entries=7)  # force several chunks
    rows = patches.reshape(-1, 4)
    for k, M in enumerate(moments, start=1):
        brute = sum(_outer(r, k) for r in rows)
        np.testing.assert_allclose(M, brute, atol=1e-12)
    W = torch.as_tensor(rng.normal(size=(3, 4)))
    for k, M in enumerate(moments, start=1):
        direct = ((torch.as_tensor(rows) @ W.T) ** k).sum(0)
        np.testing.assert_allclose(
            fm.contract_powers(torch.as_tensor(M), W).numpy(), direct.numpy(), atol=1e-10
        )


def _outer(r, k):
    out = r
    for _ in range(k - 1):
        out = np.multiply.outer(out, r)
    return out


def test_polynomial_objective_from_moments_equals_direct_sum():
    """Σ_{t,p} p(κ w·u + b) computed from the moments is the objective on the data itself."""
    rng = np.random.default_rng(1)
    patches = fm.scale_patches(rng.uniform(size=(20, 4, 3)), l1_bound=3.0)
    approx = fm.approximate_softplus("chebyshev", 5, 4.0)
    kappa, w, b = 12.0, rng.normal(size=3) * 0.2, 0.3
    moments = fm.moment_tensors(patches, 5)
    W = torch.as_tensor(w[None, :])
    contractions = [patches.shape[0] * patches.shape[1]] + [
        kappa**k * float(fm.contract_powers(torch.as_tensor(M), W)[0]) for k, M in enumerate(moments, 1)
    ]
    from math import comb

    from_moments = sum(
        approx.coef[j] * comb(j, k) * b ** (j - k) * contractions[k] for j in range(6) for k in range(j + 1)
    )
    direct = approx(kappa * patches @ w + b).sum()
    assert from_moments == pytest.approx(direct, rel=1e-10)


@pytest.mark.parametrize("shape,l1_bound", [((30, 1, 4), None), ((30, 9, 4), 4.0)])
def test_moment_sensitivity_holds_on_random_neighbours(shape, l1_bound):
    rng = np.random.default_rng(2)
    degree = 5
    delta = fm.moment_sensitivity(degree, shape[1])
    worst = 0.0
    for trial in range(300):
        data = rng.uniform(0, 1, size=shape) if l1_bound else rng.normal(size=shape)
        if trial % 3 == 0:  # extreme records: one-hot patches at full value
            data[0] = 1.0
        other = data.copy()
        other[0] = rng.uniform(0, 1, size=shape[1:]) if l1_bound else -data[0]
        a = fm.moment_tensors(fm.scale_patches(data, l1_bound), degree)
        b = fm.moment_tensors(fm.scale_patches(other, l1_bound), degree)
        worst = max(worst, sum(np.abs(x - y).sum() for x, y in zip(a, b, strict=True)))
    assert worst <= delta
    assert worst > 0.2 * delta  # the bound is not vacuous


def test_softmax_sensitivity_holds_on_random_neighbours():
    rng = np.random.default_rng(3)
    worst = 0.0
    for _ in range(300):
        a = fm.softmax_features(rng.uniform(size=(10, 6)))
        y = rng.integers(0, 3, 10)
        b, y2 = a.copy(), y.copy()
        b[0] = fm.softmax_features(rng.integers(0, 2, size=(1, 6)).astype(float))[0]
        y2[0] = (y[0] + 1) % 3
        stats = [np.eye(3)[y].T @ a, a.T @ a]
        stats2 = [np.eye(3)[y2].T @ b, b.T @ b]
        worst = max(worst, sum(np.abs(s - t).sum() for s, t in zip(stats, stats2, strict=True)))
    assert worst <= fm.softmax_sensitivity()


def test_release_noise_scale_is_sensitivity_over_epsilon():
    moments = [np.zeros(200_000)]
    noisy, scale = fm.release_moments(moments, 0.5, NoiseSource(0).stream("test"))
    assert scale == fm.moment_sensitivity(1) / 0.5
    assert np.var(noisy[0]) == pytest.approx(2 * scale**2, rel=0.02)


def test_input_bound_is_enforced():
    with pytest.raises(ValueError, match="bound the sensitivity assumes"):
        fm.PrivateRBM(2, epochs=1).fit(np.full((3, 2, 2), 0.3))
    with pytest.raises(ValueError, match="not a polynomial"):
        fm.PrivateRBM(2, epochs=1, approximation="piecewise").fit(np.full((3, 2, 2), 0.1))


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return X[:400] / 16.0, y[:400]


def test_spent_epsilon_and_released_coefficients_do_not_depend_on_epochs(digits):
    X, y = digits
    models = [
        fm.PrivateDBN((4,), epsilon=0.5, image_shape=(8, 8), kernel_size=2, pool=3, degree=3, epochs=e).fit(
            X, y
        )
        for e in (1, 50)
    ]
    assert models[0].spent_epsilon_ == models[1].spent_epsilon_ == 0.5
    assert (
        models[0].privacy_record()["layers"]["rbm_0"]["laplace_scale"]
        == models[1].privacy_record()["layers"]["rbm_0"]["laplace_scale"]
    )
    assert not np.allclose(models[0].layers_[0].weights_, models[1].layers_[0].weights_)  # training did run
    layers = models[1].privacy_record()["layers"]
    assert sum(layer["epsilon"] for layer in layers.values()) == pytest.approx(0.5)
    # used directly, the estimator still says what its ε covers
    statement = models[1].privacy_record()["statement"]
    assert statement.startswith("Proven 0.5-differential privacy with respect to replacing one of the ")
    assert f" {len(y)} private training rows" in statement and "Not covered" in statement


def test_convolutional_dbn_learns_digits_without_noise(digits):
    X, y = digits
    model = fm.PrivateDBN((4,), epsilon=1e8, image_shape=(8, 8), kernel_size=2, pool=3, degree=3, epochs=60)
    model.fit(X[:300], y[:300])
    assert (model.predict(X[300:]) == y[300:]).mean() > 0.5  # chance is 0.1


def test_dpsgd_classifier_stops_at_budget():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 5)).astype(np.float32)
    y = (X[:, 0] > 0).astype(int)
    model = fm.DPSGDClassifier(
        epsilon=None, noise_multiplier=1.0, max_epsilon=2.0, epochs=40, batch_size=50
    ).fit(X, y)
    assert model.epochs_trained_ < 40
    assert model.spent_epsilon_ <= 2.0
    assert np.all(np.diff(model.epsilon_history_) > 0)
    statement = model.privacy_record()["statement"]
    assert "adding or removing one of the 200 private training rows" in statement  # Opacus: add/remove
    assert f"({model.spent_epsilon_:.3g}, 1.0e-05)-differential privacy" in statement


@pytest.fixture
def ref_query(pbmc_full):
    rng = np.random.default_rng(0)
    cells = rng.choice(pbmc_full.n_obs, 500, replace=False)
    adata = pbmc_full[np.sort(cells), :300].copy()
    return adata[:350].copy(), adata[350:].copy()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["pcdbn", "dpsgd"])
def test_annotate_writes_valid_labels_and_records(ref_query, method, tmp_path):
    ref, query = ref_query
    dpsc.tl.annotate(query, ref, "cell_type", epsilon=1.0, method=method, epochs=5)
    assert set(query.obs["dp_label"].astype(str)) <= set(ref.obs["cell_type"].astype(str))
    conf = query.obs["dp_label_confidence"].to_numpy()
    assert np.all((conf > 0) & (conf <= 1))
    result = ref.uns["dpsc"]["dp_label"]
    record = result["privacy"]
    assert result["method"] == method and 0 < record["epsilon"] <= 1.0 + 1e-9
    assert record["guarantee"] == "proven" and "query cells" in record["statement"]
    assert dpsc.privacy.spent(ref)[0] == pytest.approx(record["epsilon"])
    # the query cells were read without noise (the PCA is fitted on them): their ledger says so
    on_query = query.uns["dpsc"]["dp_label"]
    assert on_query["privacy"]["guarantee"] == "none" and dpsc.privacy.spent(query)[0] == np.inf
    assert on_query["reference"]["epsilon"] == record["epsilon"]
    path = tmp_path / "query.h5ad"
    query.write_h5ad(path)  # the record must survive a round trip to disk
    assert anndata.read_h5ad(path).uns["dpsc"]["dp_label"]["method"] == method


def test_annotate_bad_input_is_rejected_and_leaves_data_untouched(ref_query):
    ref, query = ref_query
    obs_before, uns_before = query.obs.copy(), dict(query.uns)
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        dpsc.tl.annotate(query, ref, "cell_type", epsilon=0)
    with pytest.raises(ValueError, match="not a column"):
        dpsc.tl.annotate(query, ref, "nope")
    ref_missing = ref.copy()
    ref_missing.obs["cell_type"] = ref_missing.obs["cell_type"].astype(object)
    ref_missing.obs.iloc[0, ref_missing.obs.columns.get_loc("cell_type")] = np.nan
    with pytest.raises(ValueError, match="have no 'cell_type'"):
        dpsc.tl.annotate(query, ref_missing, "cell_type")
    with pytest.raises(ValueError, match="Genes differ"):
        dpsc.tl.annotate(ref, query[:, :250].copy(), "cell_type")
    with pytest.raises(ValueError, match="Unknown method"):
        dpsc.tl.annotate(query, ref, "cell_type", method="svm")
    assert query.obs.equals(obs_before) and dict(query.uns) == uns_before
    assert "annotation" not in ref.uns.get("dpsc", {})


def test_dense_tensor_size_guard():
    with pytest.raises(ValueError, match="entries"):
        fm.moment_tensors(np.zeros((2, 1, 40)), 7)


def test_every_parameter_combination_of_split_is_validated():
    for split in [(0.5,), (0.7, 0.7), (1.0, 0.0)]:
        with pytest.raises(ValueError, match="epsilon_split"):
            fm.PrivateDBN((3,), epsilon_split=split)._split()
    assert list(itertools.accumulate(fm.PrivateDBN((3, 3))._split()))[-1] == pytest.approx(1.0)
