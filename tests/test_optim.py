import numpy as np
import pytest
import torch
from opacus.accountants import RDPAccountant
from opacus.optimizers import DPOptimizer

import dpsc
from dpsc.optim import DPSignAdam, DPSignSGD, SignAdam, make_optimizer


def _param_with_samples(values, batch=4, seed=0):
    torch.manual_seed(seed)
    p = torch.nn.Parameter(torch.zeros(3, 5))
    p.grad_sample = values.expand(batch, 3, 5).clone()
    return p


def _dp_kwargs(sigma, seed=0):
    return {
        "noise_multiplier": sigma,
        "max_grad_norm": 1.0,
        "expected_batch_size": 4,
        "generator": torch.Generator().manual_seed(seed),
    }


@pytest.mark.parametrize("cls", [DPSignSGD, DPSignAdam])
def test_noise_is_added_before_the_sign(cls):
    lr = 0.01
    # Zero per-sample gradients: without noise sign(0) = 0 and nothing moves ...
    p = _param_with_samples(torch.zeros(3, 5))
    opt = cls([p], lr=lr, **_dp_kwargs(0.0))
    opt.step()
    assert torch.count_nonzero(p) == 0
    # ... with noise, every coordinate moves by exactly lr: the sign is of the *noisy* gradient.
    p = _param_with_samples(torch.zeros(3, 5))
    opt = cls([p], lr=lr, **_dp_kwargs(1.0))
    opt.step()
    assert torch.allclose(p.abs(), torch.full_like(p, lr))


def test_sign_sgd_step_magnitude_and_direction():
    lr = 0.05
    grads = torch.randn(3, 5) * 0.01  # well inside the clipping norm
    p = _param_with_samples(grads)
    DPSignSGD([p], lr=lr, **_dp_kwargs(0.0)).step()
    assert torch.allclose(p, -lr * torch.sign(grads))


def test_sign_adam_matches_its_equations():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.zeros(4))
    opt = SignAdam([p], lr=0.1, betas=(0.5, 0.9))
    m = torch.zeros(4)
    expected = torch.zeros(4)
    for t in range(1, 4):
        g = torch.randn(4)
        p.grad = g.clone()
        opt.step()
        m = 0.5 * m + 0.5 * g
        expected -= 0.1 * torch.sign(m / (1 - 0.5**t))
        assert torch.allclose(p.detach(), expected)


def test_accountant_steps_identical_to_dp_optimizer():
    accountants = []
    for make in (
        lambda ps, kw: DPOptimizer(torch.optim.SGD(ps, lr=0.1), **kw),
        lambda ps, kw: DPSignSGD(ps, lr=0.1, **kw),
        lambda ps, kw: DPSignAdam(ps, lr=0.1, **kw),
    ):
        p = _param_with_samples(torch.randn(3, 5))
        opt = make([p], _dp_kwargs(1.1))
        acc = RDPAccountant()
        opt.attach_step_hook(acc.get_optimizer_hook_fn(sample_rate=0.05))
        for _ in range(7):
            opt.zero_grad(set_to_none=True)
            p.grad_sample = torch.randn(4, 3, 5)
            opt.step()
        accountants.append(acc)
    histories = [a.history for a in accountants]
    assert histories[0] == histories[1] == histories[2] == [(1.1, 0.05, 7)]
    eps = [a.get_epsilon(1e-5) for a in accountants]
    assert eps[0] == eps[1] == eps[2]


def test_unknown_optimizer_name():
    with pytest.raises(ValueError, match="Unknown optimizer"):
        make_optimizer("rmsprop", [torch.nn.Parameter(torch.zeros(1))], 0.1)


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["encoder", "full"])
def test_fit_with_sign_optimizer(small_adata, scope, fast_train):
    adata = small_adata.copy()
    dpsc.tl.fit(adata, epsilon=4.0, delta=1e-3, scope=scope, optimizer="dpsignadam", **fast_train)
    record = adata.uns["dpsc"]["X_dpdcan"]["privacy"]
    assert record["epsilon"] <= 4.0 + 1e-9
    assert adata.uns["dpsc"]["X_dpdcan"]["params"]["optimizer"] == "dpsignadam"
    assert np.isfinite(adata.obsm["X_dpdcan"]).all()


def test_fit_rejects_unknown_optimizer(small_adata, fast_train):
    adata = small_adata.copy()
    before = adata.copy()
    with pytest.raises(ValueError, match="Unknown optimizer"):
        dpsc.tl.fit(adata, epsilon=4.0, delta=1e-3, optimizer="lion", **fast_train)
    assert adata.obsm.keys() == before.obsm.keys() and "dpsc" not in adata.uns
