"""Bayesian linear regression from (noisy) sufficient statistics."""

from __future__ import annotations

import numpy as np

from .._api import renamed_arguments


def nearest_psd(matrix: np.ndarray) -> np.ndarray:
    """Project a symmetric matrix onto the PSD cone by clipping negative eigenvalues (post-processing)."""
    sym = (matrix + matrix.T) / 2
    values, vectors = np.linalg.eigh(sym)
    return (vectors * np.clip(values, 0.0, None)) @ vectors.T


def fixed_precision_posterior(
    xx: np.ndarray, xy: np.ndarray, prior_precision: float, noise_precision: float
) -> tuple[np.ndarray, np.ndarray]:
    r"""Posterior of :math:`\beta` with fixed precisions (Honkela et al. 2018, Eq. 4).

    With prior :math:`\beta \sim N(0, I/\lambda_0)` and likelihood
    :math:`y \mid x \sim N(x^\top\beta, 1/\lambda)`:

    .. math:: \Lambda = \lambda_0 I + \lambda X^\top X, \qquad \mu = \Lambda^{-1}\lambda X^\top y.

    The (noisy) :math:`X^\top X` is first projected onto the PSD cone so that :math:`\Lambda`
    is positive definite. Returns ``(mu, Lambda)``.
    """
    d = xx.shape[0]
    precision = prior_precision * np.eye(d) + noise_precision * nearest_psd(xx)
    mean = np.linalg.solve(precision, noise_precision * xy)
    return mean, precision


@renamed_arguments("dpsc.linear.gamma_prior_posterior_mean", seed="random_state")
def gamma_prior_posterior_mean(
    xx: np.ndarray,
    xy: np.ndarray,
    yy: float,
    n: int,
    *,
    shape: float = 2.0,
    rate: float = 2.0,
    n_steps: int = 1500,
    n_samples: int = 500,
    random_state: int = 0,
) -> np.ndarray:
    r"""Posterior mean of :math:`\beta` with Gamma priors on both precisions, by variational inference.

    Model: :math:`\lambda, \lambda_0 \sim \mathrm{Gamma}(2, 2)`,
    :math:`\beta \mid \lambda_0 \sim N(0, I/\lambda_0)` and the Gaussian likelihood written in
    the sufficient statistics only,

    .. math:: \log p(y \mid X, \beta, \lambda) = \tfrac n2 \log\tfrac{\lambda}{2\pi}
       - \tfrac\lambda2 (y^\top y - 2\beta^\top X^\top y + \beta^\top X^\top X \beta).

    The noisy augmented matrix :math:`[[X^\top X, X^\top y], [y^\top X, y^\top y]]` is projected
    onto the PSD cone first so that the quadratic form is non-negative for every :math:`\beta`.
    Fitted with Pyro's SVI and a multivariate-normal guide (on the log precisions); the returned
    vector averages ``n_samples`` posterior draws of :math:`\beta`. Pyro's RNG is forked, so the
    caller's global torch RNG state is not changed.
    """
    import pyro
    import pyro.distributions as dist
    import torch
    from pyro.infer import SVI, Trace_ELBO
    from pyro.infer.autoguide import AutoMultivariateNormal

    d = xx.shape[0]
    aug = np.zeros((d + 1, d + 1))
    aug[:d, :d], aug[:d, d], aug[d, :d], aug[d, d] = xx, xy, xy, yy
    aug = nearest_psd(aug)
    t_xx = torch.as_tensor(aug[:d, :d], dtype=torch.float64)
    t_xy = torch.as_tensor(aug[:d, d], dtype=torch.float64)
    t_yy = torch.as_tensor(aug[d, d], dtype=torch.float64)
    conc = torch.tensor(shape, dtype=torch.float64)
    rt = torch.tensor(rate, dtype=torch.float64)

    def model() -> None:
        lam = pyro.sample("lam", dist.Gamma(conc, rt))
        lam0 = pyro.sample("lam0", dist.Gamma(conc, rt))
        beta = pyro.sample("beta", dist.Normal(torch.zeros(d, dtype=torch.float64), lam0.rsqrt()).to_event(1))
        quad = t_yy - 2 * beta @ t_xy + beta @ t_xx @ beta
        pyro.factor("likelihood", 0.5 * n * torch.log(lam / (2 * torch.pi)) - 0.5 * lam * quad)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(random_state)
        pyro.clear_param_store()
        guide = AutoMultivariateNormal(model)
        svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), loss=Trace_ELBO())
        for _ in range(n_steps):
            svi.step()
        with torch.no_grad():
            draws = torch.stack([guide()["beta"] for _ in range(n_samples)])
        pyro.clear_param_store()
    return draws.mean(0).numpy()
