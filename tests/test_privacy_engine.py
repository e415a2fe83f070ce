"""The privacy engine: secret noise, one DP-SGD path, the record, the per-AnnData ledger."""

import anndata as ad
import numpy as np
import pytest
import torch
from scipy.optimize import minimize

import dpsc
from dpsc import fm, linear
from dpsc.privacy import (
    BudgetExceededError,
    NoiseSource,
    PrivacyRecord,
    ReleasePlan,
    ledger_frame,
    set_budget,
    spent,
    write_record,
)


def write_result(adata, key: str, record) -> None:
    """Book a result's record in the ledger (check, reserve, settle), then write it under ``key``."""
    with ReleasePlan.reading(key).spend(adata, record, key) as spent:
        spent.booking.settle(record)
    write_record(adata, key, record)


def test_ledger_composes_gaussian_fits_like_dp_accounting(gaussian_record):
    dp_accounting = pytest.importorskip("dp_accounting")
    adata = ad.AnnData(np.zeros((5, 2)))
    runs = [(1.1, 0.1, 900), (2.0, 0.05, 500)]
    for i, run in enumerate(runs):
        write_result(adata, f"fit{i}", gaussian_record(*run))
    eps, delta = spent(adata)
    assert delta == pytest.approx(2e-5)
    accountant = dp_accounting.rdp.RdpAccountant()
    for sigma, q, steps in runs:
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
        accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    reference = accountant.get_epsilon(delta)
    assert eps == pytest.approx(reference, rel=0.02)
    entries = [float(e) for e in ledger_frame(adata)["epsilon"]]
    assert max(entries) <= eps <= sum(entries)
    assert ledger_frame(adata)["cumulative_epsilon"].iloc[-1] == pytest.approx(eps)


def test_ledger_adds_pure_epsilon_and_a_release_without_guarantee_makes_it_infinite(gaussian_record):
    adata = ad.AnnData(np.zeros((5, 2)))
    write_result(adata, "a", gaussian_record(1.0, 0.1, 100))
    gauss = spent(adata)[0]
    pure = PrivacyRecord(tool="r", epsilon=0.5, delta=0.0, guarantee="proven", statement="", pure_epsilon=0.5)
    write_result(adata, "b", pure)
    assert spent(adata)[0] == pytest.approx(gauss + 0.5)
    write_result(adata, "c", PrivacyRecord(tool="x", epsilon=None, delta=0.0, guarantee="none", statement=""))
    assert spent(adata)[0] == np.inf


def test_ledger_survives_h5ad_subset_and_copy(tmp_path, gaussian_record):
    adata = ad.AnnData(np.ones((6, 3)))
    write_result(adata, "a", gaussian_record(1.0, 0.1, 100))
    write_result(adata, "b", gaussian_record(1.5, 0.2, 50))
    total = spent(adata)
    adata.write_h5ad(tmp_path / "l.h5ad")
    back = ad.read_h5ad(tmp_path / "l.h5ad")
    assert spent(back) == pytest.approx(total)
    assert spent(back[:3].copy()) == pytest.approx(total)  # same people
    assert spent(adata.copy()) == pytest.approx(total)
    assert list(ledger_frame(back)["key"]) == ["a", "b"]


@pytest.mark.slow
def test_budget_refuses_before_any_work_and_leaves_adata_unchanged(small_adata, tiny_fit):
    adata = small_adata.copy()
    dpsc.tl.fit(adata, epsilon=4.0, **tiny_fit)
    set_budget(adata, 5.0)  # two ε = 4 fits compose to about 5.5 (RDP), more than 5
    before = adata.copy()
    with pytest.raises(BudgetExceededError, match="ε left") as err:
        dpsc.tl.fit(adata, epsilon=4.0, key_added="X_again", cluster_key="again", **tiny_fit)
    assert isinstance(err.value, ValueError)
    assert set(adata.obsm) == set(before.obsm) and set(adata.obs) == set(before.obs)
    assert set(adata.uns["dpsc"]) == set(before.uns["dpsc"]) and set(adata.uns) == set(before.uns)
    assert len(ledger_frame(adata)) == 1
    # within the budget, a second fit goes through and is composed with the first
    dpsc.tl.fit(adata, epsilon=1.0, key_added="X_small", cluster_key="small", **tiny_fit)
    eps, _ = spent(adata)
    assert 4.0 < eps <= 5.0 and len(ledger_frame(adata)) == 2
    assert "X_dpdcan" in adata.uns["dpsc"] and "X_small" in adata.uns["dpsc"]  # both records kept


def test_noise_source_streams():
    seeded = NoiseSource(3)
    again = NoiseSource(3)
    # a seeded run repeats: the k-th stream of a name is the same in every run with that seed
    assert np.array_equal(seeded.stream("dpsgd").words(4), again.stream("dpsgd").words(4))
    # ... and every release of a run draws independent noise: a second stream of the same name,
    # and streams of different names, differ (releases never share noise under a fixed seed)
    assert not np.array_equal(NoiseSource(3).stream("dpsgd").words(4), seeded.stream("dpsgd").words(4))
    assert not np.array_equal(
        NoiseSource(3).stream("pp.pca").words(4), NoiseSource(3).stream("tl.kmeans").words(4)
    )
    assert not np.array_equal(
        NoiseSource(3).stream("site", 0).words(4), NoiseSource(3).stream("site", 1).words(4)
    )
    secret = NoiseSource()
    x = secret.stream("laplace").normal(1.0, 4)
    y = secret.stream("laplace").normal(1.0, 4)
    assert not np.allclose(x, y)


def test_seeded_pipeline_releases_use_independent_noise():
    """HVG then PCA with the same noise_seed: their noise streams differ (they used to coincide)."""
    from dpsc.privacy import GaussianSum

    a = GaussianSum("a", 1000, 1.0, 2.0).noise(NoiseSource(7).stream("pp.highly_variable_genes"))
    b = GaussianSum("a", 1000, 1.0, 2.0).noise(NoiseSource(7).stream("pp.pca"))
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.15


def _patched_twice(monkeypatch, fit):
    import dpsc.privacy._random as random

    monkeypatch.setattr(random, "secure_key", lambda: bytes(range(32)))
    return fit(), fit()


def test_laplace_and_functional_mechanisms_draw_from_the_secure_source(monkeypatch):
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(80, 4)), rng.normal(size=80)
    Xp, yp = rng.normal(size=(10, 4)), rng.normal(size=10)

    def lr():
        return linear.RobustPrivateLR(epsilon=1.0, random_state=0).fit(X, y, Xp, yp).coef_

    free_a, free_b = lr(), lr()
    assert not np.allclose(free_a, free_b)  # secret: same random_state, different noise
    a, b = _patched_twice(monkeypatch, lr)
    np.testing.assert_array_equal(a, b)  # only the secure source was random

    labels = (X[:, 0] > 0).astype(int)

    def dbn():
        return fm.PrivateDBN((4,), epsilon=1.0, epochs=3, random_state=0).fit(X, labels).top_.coef_

    a, b = _patched_twice(monkeypatch, dbn)
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_dpsgd_classifier_takes_a_noisy_accounted_step_on_an_empty_batch(monkeypatch):
    from dpsc.privacy import PoissonSampling

    monkeypatch.setattr(PoissonSampling, "batches", lambda self, n, steps, rank=0: [[] for _ in range(steps)])
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(100, 3)).astype(np.float32), rng.integers(0, 2, 100)
    model = fm.DPSGDClassifier(epsilon=2.0, epochs=2, batch_size=20, noise_seed=1).fit(X, y)
    torch.manual_seed(0)  # the classifier's initialisation (random_state=0)
    init = torch.nn.Sequential(torch.nn.Linear(3, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    # every draw was empty, and every draw was a noisy, accounted step: 2 epochs x round(1/q) = 10
    assert [tuple(h) for h in model.privacy_record()["history"]] == [(model.noise_multiplier_, 0.2, 10)]
    assert not torch.equal(model.network_[0].weight, init[0].weight)


def _upper_l1_change(x, x2):
    iu = np.triu_indices(len(x))
    return np.abs(np.outer(x, x)[iu] - np.outer(x2, x2)[iu]).sum()


@pytest.mark.parametrize("d", [2, 3])
def test_xx_sensitivity_holds_at_the_worst_case(d):
    """Maximise the L1 change of the upper triangle over pairs of unit rows: it stays below Δ_xx."""
    sens = linear.sensitivities(d, bound_x=1.0, bound_y=1.0, row_norm=1.0)["xx"]

    def negative_change(v):
        x, x2 = v[:d], v[d:]
        x, x2 = x / max(np.linalg.norm(x), 1e-12), x2 / max(np.linalg.norm(x2), 1e-12)
        return -_upper_l1_change(x, x2)

    rng = np.random.default_rng(0)
    worst = max(
        -minimize(negative_change, rng.normal(size=2 * d), method="Nelder-Mead").fun for _ in range(40)
    )
    assert worst <= sens + 1e-9
    if d == 2:
        # the pair that broke the former bound d·r² = 2
        assert _upper_l1_change(np.array([0.973, 0.230]), np.array([-0.230, 0.973])) > 2.0
        assert worst > 2.0


@pytest.mark.slow
def test_paper_scope_save_warns_and_keeps_no_losses(small_adata, tmp_path, caplog, tiny_fit):
    model = dpsc.tl.fit(small_adata, epsilon=8.0, scope="paper", **tiny_fit, return_model=True)
    with caplog.at_level("WARNING"):
        model.save(tmp_path / "m", overwrite=True)
    assert "noise-free decoder" in caplog.text
    assert model.history_ is None


@pytest.mark.parametrize("guarantee", ["proven", "heuristic", "none"])
def test_a_stated_record_says_what_its_fields_hold(guarantee):
    noise = NoiseSource(3)
    eps = None if guarantee == "none" else 2.5
    record = PrivacyRecord.stated(
        "t",
        guarantee=guarantee,
        epsilon=eps,
        delta=1e-5,
        unit="adding or removing one of the 9 cells",
        mechanism="one Gaussian release of a sum",
        covered="the released sum",
        not_covered="the cells' own labels",
        noise=noise,
        reason="the decoder is hidden state",
        steps=4,
    )
    assert (record.covered, record.not_covered, record.steps) == (
        "the released sum",
        "the cells' own labels",
        4,
    )
    assert record.noise == noise.to_dict()
    assert "the released sum" in record.statement and "9 cells" in record.statement
    assert record.guarantee_reason == ("the decoder is hidden state" if guarantee == "heuristic" else "")
    if guarantee == "none":
        assert "2.5" not in record.statement and noise.describe() not in record.statement
    else:
        assert "2.5" in record.statement and noise.describe() in record.statement
        assert "the cells' own labels" in record.statement
