import warnings

import numpy as np
import pytest
import torch
from dp_accounting import dp_event, rdp

from dpsc.privacy import calibrate_noise_multiplier, epsilon_curve, make_accountant
from dpsc.privacy._accounting import spent_epsilon


def google_rdp_epsilon(sigma, q, steps, delta):
    acc = rdp.RdpAccountant()
    acc.compose(
        dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps
        )
    )
    return acc.get_epsilon(delta)


@pytest.mark.parametrize(
    ("sigma", "q", "steps"), [(1.2, 0.05, 2000), (3.0, 0.2, 100), ("eps8", 0.1, 913), ("eps4", 0.1, 913)]
)
def test_opacus_rdp_matches_google_dp_accounting(sigma, q, steps):
    if isinstance(sigma, str):  # the sigma a default PBMC fit calibrates to
        sigma = calibrate_noise_multiplier(float(sigma[3:]), 1e-5, q, steps)
    acc = make_accountant("rdp")
    acc.history = [(sigma, q, steps)]
    ours = spent_epsilon(acc, 1e-5)
    ref = google_rdp_epsilon(sigma, q, steps, 1e-5)
    assert abs(ours - ref) / ref < 0.02


@pytest.mark.parametrize("target", [1.0, 4.0, 8.0])
def test_calibrated_sigma_spends_at_most_target(target):
    sigma = calibrate_noise_multiplier(target, 1e-5, 0.1, 913)
    acc = make_accountant("rdp")
    acc.history = [(sigma, 0.1, 913)]
    spent = spent_epsilon(acc, 1e-5)
    assert spent <= target
    assert spent > target - 0.05
    # independent check of the same claim
    assert google_rdp_epsilon(sigma, 0.1, 913, 1e-5) <= target * 1.02


@pytest.mark.slow
def test_prv_accountant_is_selectable_and_close_to_rdp():
    sigma = calibrate_noise_multiplier(8.0, 1e-5, 0.1, 500, accountant="prv")
    acc = make_accountant("prv")
    acc.history = [(sigma, 0.1, 500)]
    assert spent_epsilon(acc, 1e-5) <= 8.0
    with pytest.raises(ValueError, match="Unknown accountant"):
        make_accountant("moments")


def test_epsilon_curve_is_monotone_and_ends_at_total():
    hist = [(1.0, 0.1, 300), (1.0, 0.1, 13)]
    steps, eps = epsilon_curve(hist, 1e-5, "rdp", n_points=10)
    assert steps[-1] == 313
    assert np.all(np.diff(eps) > 0)
    acc = make_accountant("rdp")
    acc.history = hist
    assert eps[-1] == pytest.approx(spent_epsilon(acc, 1e-5))


def test_accountant_hook_counts_each_optimizer_step():
    from opacus.optimizers import DPOptimizerFastGradientClipping

    p = torch.nn.Parameter(torch.zeros(3))
    opt = DPOptimizerFastGradientClipping(
        torch.optim.SGD([p], lr=0.1), noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=4
    )
    acc = make_accountant("rdp")
    opt.attach_step_hook(acc.get_optimizer_hook_fn(sample_rate=0.25))
    for _ in range(5):
        opt.zero_grad()
        p.grad = torch.zeros(3)
        opt.step()
    assert acc.history == [(1.0, 0.25, 5)]


def test_prv_accounting_of_a_large_noise_release_raises_no_order_notice():
    """PRV sizes its grid with an RDP bound; its "largest alpha" notice is not the user's concern."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Optimal order")
        sigma = calibrate_noise_multiplier(0.5, 1e-5, 0.05, 200, accountant="prv")
        accountant = make_accountant("prv")
        accountant.history = [(40.0, 0.25, 40)]  # far more noise than ε needs: a tiny ε
        assert 0 < spent_epsilon(accountant, 1e-5) < 0.5 and sigma > 0


def test_rdp_epsilon_is_opacus_accountant_to_the_last_bit():
    """The cached one-step RDP path returns exactly what Opacus's RDPAccountant returns."""
    from opacus.accountants import RDPAccountant

    from dpsc.privacy import _accounting

    rng = np.random.default_rng(0)
    for _ in range(100):
        history = [
            (
                float(rng.uniform(0.3, 20)),
                float(rng.choice([1.0, rng.uniform(1e-4, 0.5)])),
                int(rng.integers(1, 2000)),
            )
            for _ in range(rng.integers(1, 5))
        ]
        delta = float(rng.choice([1e-3, 1e-5, 1e-7]))
        reference = RDPAccountant()
        reference.history = list(history)
        orders = _accounting._orders("rdp", [q for _, q, _ in history])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = float(reference.get_epsilon(delta=delta, **orders))
            assert _accounting.history_epsilon(history, delta) == expected
