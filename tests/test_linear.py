import anndata as ad
import numpy as np
import pandas as pd
import pytest

import dpsc
from dpsc import linear
from dpsc.privacy import NoiseSource


def _data(n=200, d=5, seed=0):
    return linear.synthetic_auxiliary(n, d, np.random.default_rng(seed))


def test_projection_bounds_hold():
    X = np.random.default_rng(0).normal(size=(50, 4)) * 3
    P = linear.project(X, 0.7)
    assert P.max() <= 0.7 and P.min() >= -0.7
    inside = np.abs(X) <= 0.7
    assert np.array_equal(P[inside], X[inside])


@pytest.mark.parametrize("bound_x", [0.05, 0.3, 2.0])
def test_sensitivity_bound_holds_on_neighbours(bound_x):
    d, bound_y = 6, 1.5
    sens = linear.sensitivities(d, bound_x, bound_y, row_norm=1.0)
    rng = np.random.default_rng(1)
    worst = {"xx": 0.0, "xy": 0.0, "yy": 0.0}
    iu = np.triu_indices(d)
    for _ in range(2000):
        # Two single samples after normalisation + projection; adversarial-ish: sparse and dense rows.
        rows = []
        for _ in range(2):
            x = rng.normal(size=d) * (rng.random(d) < rng.random())
            x = linear.normalise_rows(x[None], None)[0]
            rows.append((linear.project(x, bound_x), linear.project(rng.normal(0, 3), bound_y)))
        (x1, y1), (x2, y2) = rows
        worst["xx"] = max(worst["xx"], np.abs(np.outer(x1, x1)[iu] - np.outer(x2, x2)[iu]).sum())
        worst["xy"] = max(worst["xy"], np.abs(x1 * y1 - x2 * y2).sum())
        worst["yy"] = max(worst["yy"], abs(y1**2 - y2**2))
    for key in worst:
        assert worst[key] <= sens[key] + 1e-12, (key, worst[key], sens[key])
    # The bound is not vacuous: random neighbours reach a good part of it.
    assert worst["yy"] > 0.9 * sens["yy"]


def test_noise_scale_matches_sensitivity_and_split():
    d, eps = 3, 2.0
    sens = linear.sensitivities(d, 0.5, 1.0, row_norm=1.0)
    split = {"xx": 0.35, "xy": 0.60, "yy": 0.05}
    scales = linear.laplace_scales(sens, eps, split)
    for key in split:
        assert scales[key] == pytest.approx(sens[key] / (split[key] * eps))
    stats = linear.Statistics(np.eye(d), np.zeros(d), 0.0, 10)
    rng = NoiseSource(0).stream("test")
    draws = [linear.perturb(stats, scales, rng) for _ in range(4000)]
    xx_noise = np.array([s.xx[0, 1] for s in draws])
    xy_noise = np.array([s.xy[0] for s in draws])
    yy_noise = np.array([s.yy for s in draws])
    for noise, key in ((xx_noise, "xx"), (xy_noise, "xy"), (yy_noise, "yy")):
        assert noise.var() == pytest.approx(2 * scales[key] ** 2, rel=0.1)
    # symmetrised
    assert all(np.allclose(s.xx, s.xx.T) for s in draws[:10])


@pytest.mark.parametrize("prior", ["fixed", "gamma"])
def test_epsilon_composition_sums_to_target(prior, monkeypatch):
    if prior == "gamma":  # keep the VI short in the unit tests
        orig = linear._private_fit.gamma_prior_posterior_mean

        def short(*a, **k):
            return orig(*a, **k, n_steps=200, n_samples=50)

        monkeypatch.setattr(linear._private_fit, "gamma_prior_posterior_mean", short)
    X, y = _data()
    model = linear.RobustPrivateLR(1.5, bounds=(0.5, 2.0), prior=prior, y_center=0.0, y_scale=1.0).fit(X, y)
    assert model.spent_epsilon_ == pytest.approx(1.5)
    assert sum(model.budget_split_.values()) == pytest.approx(1.0)
    assert set(model.budget_split_) == ({"xx", "xy", "yy"} if prior == "gamma" else {"xx", "xy"})
    assert np.all(np.isfinite(model.coef_))
    record = model.privacy_record()
    assert record["epsilon"] == pytest.approx(1.5) and record["delta"] == 0.0
    assert record["statement"].startswith(
        "Proven 1.5-differential privacy with respect to replacing one of the 200"
    )


def test_infinite_epsilon_equals_non_private_bayesian_lr():
    X, y = _data(300, 4)
    priv = linear.RobustPrivateLR(np.inf, bounds=(10.0, 100.0), y_center=0.0, y_scale=1.0).fit(X, y)
    ref = linear.BayesianLR(y_center=0.0, y_scale=1.0).fit(X, y)
    np.testing.assert_allclose(priv.predict(X), ref.predict(X), rtol=1e-10, atol=1e-12)
    for model in (priv, ref):  # no noise: the record must not claim a guarantee
        assert model.privacy_record()["statement"].startswith("No differential privacy")
    # and the projection is really applied when bounds bite
    clipped = linear.RobustPrivateLR(np.inf, bounds=(0.05, 100.0), y_center=0.0, y_scale=1.0).fit(X, y)
    assert not np.allclose(clipped.coef_, ref.coef_)


def test_auto_bounds_do_not_read_private_values():
    X, y = _data(120, 4, seed=1)
    X2, y2 = _data(120, 4, seed=2)
    a = linear.RobustPrivateLR(2.0, y_center=0.0, y_scale=1.0).fit(X, y)
    b = linear.RobustPrivateLR(2.0, y_center=0.0, y_scale=1.0).fit(X2, y2)
    assert a.bounds_ == b.bounds_


def test_private_methods_beat_chance_with_enough_data():
    X, y = _data(3000, 5, seed=3)
    test_X, test_y = _data(500, 5, seed=4)
    # same true beta is not shared across draws, so fit and test on one draw
    Xtr, ytr, Xte, yte = X[:2500], y[:2500], X[2500:], y[2500:]
    for model in (
        linear.RobustPrivateLR(2.0, y_center=0.0, y_scale=1.0),
        linear.OutputPerturbationLR(2.0, y_center=0.0, y_scale=1.0),
        linear.BayesianLR(y_center=0.0, y_scale=1.0),
    ):
        rho = linear.spearman(yte, model.fit(Xtr, ytr).predict(Xte))
        assert rho > 0.3, (type(model).__name__, rho)
    del test_X, test_y


@pytest.mark.optional_extra
def test_functional_mechanism_baseline_runs():
    pytest.importorskip("diffprivlib")
    X, y = _data()
    model = linear.FunctionalMechanismLR(2.0, y_center=0.0, y_scale=1.0).fit(X, y)
    assert model.coef_.shape == (X.shape[1],) and model.spent_epsilon_ == 2.0


def test_c_index_and_wpc():
    y = np.arange(10.0)
    assert linear.probabilistic_c_index(y, y) == 1.0
    assert linear.probabilistic_c_index(y, -y) == 0.0
    assert linear.probabilistic_c_index(y, np.zeros(10)) == 0.5
    noisy = linear.probabilistic_c_index(y, y, noise_sd=5.0)
    assert 0.5 < noisy < 1.0
    assert linear.wpc_index({"a": 1.0, "b": 0.5}, {"a": 0.1, "b": 0.1}) == pytest.approx(0.75)
    assert linear.wpc_index({"a": 1.0, "b": 0.5}, {"a": 0.1, "b": 1.0}) == pytest.approx((10 + 0.5) / 11)


@pytest.mark.parametrize(
    ("kwargs", "fit_args", "match"),
    [
        ({"epsilon": 0.0}, None, "epsilon must be > 0"),
        ({"epsilon": -1.0}, None, "epsilon must be > 0"),
        ({"budget_split": (0.5, 0.6, 0.1)}, None, "summing to 1"),
        ({}, "nan", "NaN"),
        ({}, "shape", "samples but its target"),
        ({}, "one", "at least 2 private samples"),
        ({"y_center": None}, None, "y_center"),
    ],
)
def test_bad_input_errors(kwargs, fit_args, match):
    X, y = _data(50, 3)
    params = {"y_center": 0.0, "y_scale": 1.0, "bounds": (0.5, 1.0), **kwargs}
    model = linear.RobustPrivateLR(**params)
    if fit_args == "nan":
        X = X.copy()
        X[0, 0] = np.nan
    elif fit_args == "shape":
        y = y[:-1]
    elif fit_args == "one":
        X, y = X[:1], y[:1]
    with pytest.raises(ValueError, match=match):
        model.fit(X, y)


def _gdsc_like(n=40, g=30, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, g))
    y = X[:, :3] @ np.array([1.0, -1.0, 0.5]) + rng.normal(0, 0.3, n)
    y[0] = np.nan
    obs = pd.DataFrame({"drug": y, "public": np.arange(n) < 8}, index=[f"c{i}" for i in range(n)])
    return ad.AnnData(X=X, obs=obs, var=pd.DataFrame(index=[f"g{i}" for i in range(g)]))


def test_tl_private_regression_writes_results():
    adata = _gdsc_like()
    model = dpsc.tl.private_regression(
        adata, "drug", epsilon=2.0, n_genes=5, public_mask="public", return_model=True
    )
    assert "drug_dp_pred" in adata.obs and np.isfinite(adata.obs["drug_dp_pred"]).all()
    result = adata.uns["dpsc"]["drug_dp_pred"]
    record = result["privacy"]
    assert record["epsilon"] == pytest.approx(2.0) and record["n_public"] == 7 and record["n_private"] == 32
    assert len(result["genes"]) == 5 and "Not covered" in record["statement"]
    assert dpsc.privacy.spent(adata) == (pytest.approx(2.0), 0.0)
    assert model.spent_epsilon_ == pytest.approx(2.0)


def test_tl_private_regression_bad_input_leaves_adata_untouched():
    adata = _gdsc_like()
    before = adata.copy()
    with pytest.raises(ValueError, match="leak private"):
        dpsc.tl.private_regression(adata, "drug")  # no public samples and no gene list
    with pytest.raises(ValueError, match="Unknown method"):
        dpsc.tl.private_regression(adata, "drug", method="magic", public_mask="public")
    with pytest.raises(ValueError, match="not a column"):
        dpsc.tl.private_regression(adata, "nope", public_mask="public")
    with pytest.raises(ValueError, match="epsilon"):
        dpsc.tl.private_regression(adata, "drug", epsilon=0, public_mask="public")
    assert list(adata.obs.columns) == list(before.obs.columns) and "dpsc" not in adata.uns
