import numpy as np
import torch
from scipy.special import gammaln
from scvi.distributions import ZeroInflatedNegativeBinomial

from dpsc.module import (
    dec_kl_per_cell,
    instance_loss_per_cell,
    per_cell_target,
    separation_loss,
    student_t_assignment,
    zinb_nll_per_cell,
)


def _zinb_logpmf_numpy(x, mu, theta, pi):
    """Independent ZINB log-pmf (Eraslan et al. 2019, Eq. 2) in float64 numpy."""
    nb = (
        gammaln(x + theta)
        - gammaln(theta)
        - gammaln(x + 1)
        + theta * np.log(theta / (theta + mu))
        + x * np.log(mu / (theta + mu))
    )
    zero = np.log(pi + (1 - pi) * np.exp(theta * np.log(theta / (theta + mu))))
    return np.where(x == 0, zero, np.log(1 - pi) + nb)


def test_zinb_matches_scvi_and_the_formula():
    g = torch.Generator().manual_seed(0)
    x = torch.poisson(torch.rand(5, 7, generator=g) * 4)
    mu = torch.rand(5, 7, generator=g) * 3 + 0.1
    theta = torch.rand(5, 7, generator=g) * 5 + 0.2
    logits = torch.randn(5, 7, generator=g)
    ours = zinb_nll_per_cell(x, mu, theta, logits)
    scvi_value = -ZeroInflatedNegativeBinomial(mu=mu, theta=theta, zi_logits=logits).log_prob(x).mean(-1)
    torch.testing.assert_close(ours, scvi_value)
    pi = torch.sigmoid(logits).double().numpy()
    ref = -_zinb_logpmf_numpy(x.double().numpy(), mu.double().numpy(), theta.double().numpy(), pi).mean(-1)
    np.testing.assert_allclose(ours.double().numpy(), ref, rtol=1e-4)


def test_module_reconstruction_is_scvi_zinb(tiny_module, counts):
    inf = tiny_module.inference(counts)
    gen = tiny_module.generative(inf["z"], inf["library"])
    expected = -ZeroInflatedNegativeBinomial(**gen).log_prob(counts).mean(-1)
    got = tiny_module.reconstruction_per_cell(counts, tiny_module.represent(counts), inf["z"])
    torch.testing.assert_close(got, expected)


def test_instance_loss_is_per_cell_cosine():
    z = torch.randn(4, 2, 3)
    expected = -torch.nn.functional.cosine_similarity(z[:, 0], z[:, 1], dim=-1)
    torch.testing.assert_close(instance_loss_per_cell(z), expected)
    same = torch.randn(4, 1, 3).repeat(1, 2, 1)
    torch.testing.assert_close(instance_loss_per_cell(same), -torch.ones(4))


def test_student_t_and_target_are_row_stochastic():
    d = torch.rand(6, 4) * 5
    q = student_t_assignment(d)
    torch.testing.assert_close(q.sum(1), torch.ones(6))
    assert torch.all(q.argmax(1) == d.argmin(1))
    p = per_cell_target(q)
    torch.testing.assert_close(p.sum(1), torch.ones(6))
    # sharpening: the largest assignment grows
    assert torch.all(p.max(1).values >= q.max(1).values - 1e-7)
    assert torch.all(dec_kl_per_cell(q, p) >= -1e-7)
    torch.testing.assert_close(dec_kl_per_cell(q, q), torch.zeros(6), atol=1e-6, rtol=0)


def test_separation_loss_is_mean_offdiagonal_cosine():
    orth = torch.eye(3)
    assert abs(separation_loss(orth).item()) < 1e-7
    same = torch.ones(3, 2)
    assert abs(separation_loss(same).item() - 1.0) < 1e-6
