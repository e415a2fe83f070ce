import subprocess
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch

import dpsc
from dpsc.federated import SSLConfig
from dpsc.federated._ema import calibrate_lambda, divergence, divergence_aware_update, ema_weight
from dpsc.federated._scaling import apply_scaling, pooled_scaling, site_sums
from dpsc.federated._ssl import (
    PER_CELL_METHODS,
    ClientDP,
    SSLNet,
    byol_loss,
    dp_schedule,
    local_train,
    local_train_private,
)

matplotlib.use("Agg")


@pytest.mark.parametrize(("types_per_site", "n_sites"), [(2, 4), (3, 4), (4, 2)])
def test_partition_types_per_site_and_coverage(small_adata, types_per_site, n_sites):
    adata = small_adata.copy()
    n_types = adata.obs["cell_type"].nunique()
    dpsc.pp.partition(adata, n_sites, label_key="cell_type", types_per_site=types_per_site)
    assert adata.obs["site"].notna().all()  # every cell exactly once (one label per row)
    per_site = adata.obs.groupby("site", observed=True)["cell_type"].nunique()
    assert len(per_site) == n_sites
    assert (per_site <= types_per_site).all() and per_site.max() == min(types_per_site, n_types)
    # all types are covered
    assert adata.obs.groupby("cell_type", observed=True)["site"].nunique().min() >= 1


def test_partition_iid_is_balanced(small_adata):
    adata = small_adata.copy()
    dpsc.pp.partition(adata, 3)
    counts = adata.obs["site"].value_counts()
    assert counts.sum() == adata.n_obs and counts.max() - counts.min() <= 1


def test_partition_bad_input(small_adata):
    with pytest.raises(ValueError, match="cannot cover"):
        dpsc.pp.partition(small_adata.copy(), 2, label_key="cell_type", types_per_site=1)
    with pytest.raises(ValueError, match="label_key"):
        dpsc.pp.partition(small_adata.copy(), 2, types_per_site=2)


def test_ema_weight_and_update_on_toy_tensors():
    local = {"w": torch.tensor([1.0, 1.0]), "b": torch.tensor([0.0])}
    glob = {"w": torch.tensor([0.0, 1.0]), "b": torch.tensor([0.0])}
    div = divergence(glob, local)
    assert div == pytest.approx(1.0)
    lam = calibrate_lambda(0.7, div)
    assert ema_weight(lam, div) == pytest.approx(0.7)  # μ = α when λ is calibrated
    assert ema_weight(lam, 10 * div) == 1.0  # capped at 1
    assert 0.0 <= ema_weight(lam, 0.3 * div) <= 1.0
    new = divergence_aware_update(local, glob, 0.7)
    assert torch.allclose(new["w"], torch.tensor([0.7, 1.0]))
    with pytest.raises(ValueError, match="alpha"):
        calibrate_lambda(1.5, 1.0)


def test_byol_loss_per_cell_and_training_lowers_it():
    p = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert torch.allclose(byol_loss(p, p), torch.zeros(2))
    assert torch.allclose(byol_loss(p, -p), torch.full((2,), 4.0))
    rng = np.random.default_rng(0)
    X = np.log1p(rng.poisson(2.0, size=(64, 30)).astype(np.float32))
    for method in ("fedsc", "fedsimsiam", "fedsimclr", "fedmoco", "fedmocov2"):
        torch.manual_seed(0)
        net = SSLNet(30, SSLConfig(method=method, batch_size=32))
        assert set(net.shared_state()) == {k for k in net.state_dict() if not k.startswith("target.")}
        first = local_train(net, X, 1, random_state=0)
        last = local_train(net, X, 15, random_state=1)
        assert np.isfinite(first) and np.isfinite(last)


@pytest.mark.slow
@pytest.mark.optional_extra
def test_fit_federated_two_clients_two_rounds(small_adata):
    pytest.importorskip("flwr")
    adata = small_adata.copy()
    dpsc.pp.partition(adata, 2, label_key="cell_type", types_per_site=4)
    dpsc.tl.fit_federated(adata, epsilon=None, rounds=2, local_epochs=1, n_clusters=4)
    record = adata.uns["dpsc"]["X_fedsc"]
    assert adata.obsm["X_fedsc"].shape == (adata.n_obs, 60)
    assert adata.obs["dp_cluster"].nunique() <= 4
    assert len(record["loss"]) == 2 and np.isfinite(record["loss"]).all()
    assert record["mu"][0] == 0.0 and record["mu"][1] == pytest.approx(0.7)  # EMA from round 2 on
    # default without epsilon: no guarantee, and the statement names the noise-free gene sums
    assert record["scale_genes"] and "per-gene sums" in record["privacy"]["statement"]
    assert record["privacy"]["guarantee"] == "none" and dpsc.privacy.spent(adata)[0] == np.inf
    assert dpsc.pl.federated(adata, show=False).get_xlabel() == "round"


def test_pooled_gene_scaling_equals_statistics_of_all_cells():
    rng = np.random.default_rng(0)
    X = rng.gamma(2.0, size=(60, 7))
    X[:, 3] = 1.5  # a constant gene: centred, not divided by 0
    parts = [X[:10], X[10:35], X[35:]]
    mean, std = pooled_scaling([site_sums(p) for p in parts])
    np.testing.assert_allclose(mean, X.mean(0), rtol=1e-12)
    np.testing.assert_allclose(std, X.std(0), atol=1e-12)
    Z = apply_scaling(X, mean, std)
    np.testing.assert_allclose(Z.mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(np.delete(Z.std(0), 3), 1.0, rtol=1e-4)
    assert np.all(Z[:, 3] == 0.0)
    assert apply_scaling(X, mean, std, clip=0.5).max() == pytest.approx(0.5)


@pytest.mark.slow
@pytest.mark.optional_extra
def test_fit_federated_with_pooled_gene_scaling(small_adata):
    pytest.importorskip("flwr")
    adata = small_adata.copy()
    adata.X = adata.X.toarray()
    adata.X[:, 0] = 0  # a gene with no count: centred only, nothing to filter on the private cells
    dpsc.pp.partition(adata, 2, label_key="cell_type", types_per_site=4)
    dpsc.tl.fit_federated(adata, epsilon=None, rounds=2, local_epochs=1, n_clusters=4, scale_genes=True)
    record = adata.uns["dpsc"]["X_fedsc"]
    assert record["scale_genes"] and "per-gene sums" in record["privacy"]["statement"]
    assert np.isfinite(adata.obsm["X_fedsc"]).all() and len(record["loss"]) == 2
    with pytest.raises(ValueError, match="scale_genes=True sends"):
        dpsc.tl.fit_federated(adata, rounds=1, local_epochs=1, epsilon=8.0, scale_genes=True)


def test_flower_apps_refuse_gene_sums_with_client_level_dp():
    from dpsc.federated._flower import check_settings
    from dpsc.federated._run_config import FEDSC

    check_settings({**FEDSC, "scale-genes": True})
    check_settings({**FEDSC, "noise-multipliers": "[1.0, 1.0]"})
    with pytest.raises(ValueError, match="set scale-genes to false"):
        check_settings({**FEDSC, "scale-genes": True, "noise-multipliers": "[1.0, 1.0]"})


def test_a_run_configuration_refuses_a_key_its_task_does_not_take():
    """One table per task: defaults, then each layer; a typo or another task's key stops the run."""
    from dpsc.federated._run_config import FEDSC, PIPELINE, run_settings

    settings = run_settings("fedsc", {"rounds": 3}, None, {"lr": 0.1})
    assert (settings["rounds"], settings["lr"], settings["alpha"]) == (3, 0.1, FEDSC["alpha"])
    assert run_settings("pipeline") == PIPELINE and run_settings("pipeline") is not PIPELINE
    with pytest.raises(ValueError, match="has no setting epsilon; it takes alpha, batch-size"):
        run_settings("fedsc", {"epsilon": 8.0})  # the clustering's key
    with pytest.raises(ValueError, match="has no setting n-cluster;"):
        run_settings("pipeline", {"n-clusters": 4}, {"n-cluster": 4})


def test_one_factory_builds_the_apps_of_both_tasks():
    """``make_apps(task)``: the clustering's pipeline (one train handler behind the SecAgg+ mod) and
    FedSC (train and query), and the deployments' module-level apps are its products."""
    pytest.importorskip("flwr")
    from dpsc.federated import make_apps

    registered = {}
    for task in ("pipeline", "fedsc"):
        server_app, client_app = make_apps(task)
        assert server_app._main is not None
        registered[task] = set(client_app._registered_funcs)
    assert registered == {"pipeline": {"train.default"}, "fedsc": {"train.default", "query.default"}}
    with pytest.raises(
        ValueError, match="Unknown federated task 'fedavg' \\(task\\); choose one of pipeline, fedsc"
    ):
        make_apps("fedavg")
    sources = {
        name: (Path(dpsc.__file__).parent / "federated" / f"{name}.py").read_text()
        for name in ("app", "pipeline_app")
    }
    assert 'make_apps("fedsc")' in sources["app"] and 'make_apps("pipeline")' in sources["pipeline_app"]
    light = "import sys, dpsc.federated.pipeline_app; print('torch' in sys.modules, 'opacus' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", light], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]  # a site's per-message process stays light


def test_fit_federated_bad_input(small_adata):
    adata = small_adata.copy()
    with pytest.raises(ValueError, match="assign cells to sites"):
        dpsc.tl.fit_federated(adata, epsilon=None)
    dpsc.pp.partition(adata, 2)
    with pytest.raises(ValueError, match="Unknown method"):
        dpsc.tl.fit_federated(adata, epsilon=None, method="fedprox")
    adata.obs["tiny"] = ["a"] + ["b"] * (adata.n_obs - 1)
    with pytest.raises(ValueError, match="fewer than 2 cells"):
        dpsc.tl.fit_federated(adata, epsilon=None, site_key="tiny")
    assert "X_fedsc" not in adata.obsm


def test_per_cell_loss_couples_no_cells():
    torch.manual_seed(0)
    for method in PER_CELL_METHODS:
        net = SSLNet(20, SSLConfig(method=method))
        x1 = torch.rand(6, 20, requires_grad=True)
        x2 = torch.rand(6, 20, requires_grad=True)
        loss = net.per_cell_loss(x1, x2)
        assert loss.shape == (6,)
        loss[0].backward()
        assert torch.all(x1.grad[1:] == 0) and torch.all(x2.grad[1:] == 0)
        assert x1.grad[0].abs().sum() > 0
    with pytest.raises(ValueError, match="no per-cell loss"):
        SSLNet(20, SSLConfig(method="fedsimclr")).per_cell_loss(x1, x2)


def test_local_train_private_steps_noise_and_clean_state():
    rng = np.random.default_rng(0)
    X = np.log1p(rng.poisson(2.0, size=(300, 30)).astype(np.float32))
    q, per_epoch = dp_schedule(300, 128)
    assert q == pytest.approx(128 / 300) and per_epoch == 3
    weights = []
    for sigma, opt in ((0.0, "sgd"), (5.0, "sgd"), (5.0, "dpsignadam")):
        torch.manual_seed(0)
        net = SSLNet(30, SSLConfig(method="fedsc"))
        keys = set(net.state_dict())
        steps = local_train_private(net, X, 2, seed=0, dp=ClientDP(sigma, 1.0, opt, 0.01), noise_seed=1)
        assert steps == 2 * per_epoch
        assert set(net.state_dict()) == keys
        assert not any(hasattr(p, "grad_sample") for p in net.parameters())
        weights.append(net.online[0].weight.detach().clone())
    assert not torch.allclose(weights[0], weights[1])  # the noise reaches the update


@pytest.mark.slow
@pytest.mark.optional_extra
def test_fit_federated_with_client_level_dp(small_adata, tmp_path):
    pytest.importorskip("flwr")
    adata = small_adata.copy()
    dpsc.pp.partition(adata, 2)
    out, net = dpsc.tl.fit_federated(
        adata,
        rounds=2,
        local_epochs=1,
        n_clusters=4,
        epsilon=4.0,
        optimizer="dpsignadam",
        copy=True,
        return_model=True,
    )
    assert isinstance(net, SSLNet) and "X_fedsc" not in adata.obsm
    assert dpsc.privacy.spent(adata) == dpsc.privacy.spent(out)  # the original's ledger books it too
    adata = out
    record = adata.uns["dpsc"]["X_fedsc"]
    privacy = record["privacy"]
    assert set(privacy["epsilon_per_site"]) == set(adata.obs["site"].astype(str))
    assert 0 < privacy["epsilon"] <= 4.0
    assert privacy["optimizer"] == "dpsignadam"
    assert record["scale_genes"] is False  # the default turns the noise-free sums off with epsilon
    assert "adding or removing one cell of its site" in privacy["statement"]
    assert privacy["guarantee"] == "proven" and "never by the server" in privacy["statement"]
    assert record["mean_dp_steps_per_round_reported"] > 0
    # the sites' messages carry the DP weights and public counts only: no un-noised loss
    assert list(record["loss"]) == []
    assert set(record["reported_metrics"]) == {"dp-steps", "mu"}  # num-examples: FedAvg weights
    assert dpsc.privacy.spent(adata)[0] == pytest.approx(privacy["epsilon"])
    adata.write_h5ad(tmp_path / "fed.h5ad")  # the record must survive a round trip to disk
    with pytest.raises(ValueError, match="compares cells within a batch"):
        dpsc.tl.fit_federated(adata, method="fedsimclr", epsilon=4.0)
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        dpsc.tl.fit_federated(adata, epsilon=0.0)


def test_ghost_clipping_equals_explicit_per_cell_clipping():
    """Σ_i clip_C(g_i) from Opacus's ghost clipping equals the loop over cells, one at a time."""
    from opacus.grad_sample import GradSampleModuleFastGradientClipping

    from dpsc.privacy._ghost import ghost_clipped_backward, release_privacy_hooks

    torch.manual_seed(0)
    net = SSLNet(12, SSLConfig(method="fedsc", hidden=(8,), n_latent=4))
    v1, v2 = torch.rand(5, 12), torch.rand(5, 12)
    params = [p for p in [*net.online.parameters(), *net.predictor.parameters()]]
    C = 0.05
    expected = [torch.zeros_like(p) for p in params]
    for i in range(5):
        grads = torch.autograd.grad(net.per_cell_loss(v1[i : i + 1], v2[i : i + 1]).sum(), params)
        norm = torch.sqrt(sum((g**2).sum() for g in grads))
        for e, g in zip(expected, grads, strict=True):
            e += g * min(1.0, C / float(norm))
    container = torch.nn.ModuleList([net.online, net.predictor])
    gsm = GradSampleModuleFastGradientClipping(
        container, loss_reduction="sum", max_grad_norm=C, use_ghost_clipping=True
    )
    ghost_clipped_backward(gsm, net.per_cell_loss(v1, v2), params)
    for e, p in zip(expected, params, strict=True):
        torch.testing.assert_close(p.grad, e, rtol=1e-4, atol=1e-7)
    release_privacy_hooks(gsm, params)
