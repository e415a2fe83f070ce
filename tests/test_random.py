"""The secure samplers draw the distributions the accountants assume.

Each test reads a fixed-key stream, so it is deterministic: a correct sampler passes every time
and a wrong one (a shifted scale, a biased rejection step, a mis-scaled Box–Muller) fails every
time. The quick tests use 2·10⁵ draws; the slow ones 10⁶.
"""

import math

import numpy as np
import pytest
from scipy import stats

from dpsc.privacy import SecureRandom, derive_key


def stream(name: str) -> SecureRandom:
    return SecureRandom(derive_key("test_random", name))


def discrete_gaussian_pmf(sigma: float, support: np.ndarray) -> np.ndarray:
    span = np.arange(-int(40 * sigma) - 40, int(40 * sigma) + 41)
    norm = np.exp(-(span.astype(float) ** 2) / (2 * sigma**2)).sum()
    return np.exp(-(support.astype(float) ** 2) / (2 * sigma**2)) / norm


def discrete_laplace_pmf(scale: float, support: np.ndarray) -> np.ndarray:
    r = math.exp(-1 / scale)
    return (1 - r) / (1 + r) * r ** np.abs(support)


def chi_square_p(draws: np.ndarray, pmf) -> float:
    """P-value of Pearson's test of ``draws`` against ``pmf``, pooling cells expected below 20."""
    values, counts = np.unique(draws, return_counts=True)
    lo, hi = values.min(), values.max()
    support = np.arange(lo, hi + 1)
    observed = np.zeros(support.size)
    observed[values - lo] = counts
    expected = pmf(support) * draws.size
    keep = expected >= 20
    pooled_obs = np.append(observed[keep], observed[~keep].sum() + 0.0)
    tail = draws.size - expected[keep].sum()
    pooled_exp = np.append(expected[keep], tail)
    return float(stats.chisquare(pooled_obs, pooled_exp).pvalue)


@pytest.mark.parametrize("sigma", [0.7, 3.0, 41.5])
def test_discrete_gaussian_has_the_exact_pmf_quick(sigma):
    draws = stream(f"dg{sigma}").discrete_gaussian(sigma, 200_000)
    assert chi_square_p(draws, lambda y: discrete_gaussian_pmf(sigma, y)) > 1e-4
    assert abs(draws.mean()) < 5 * sigma / math.sqrt(draws.size)


@pytest.mark.parametrize("scale", [0.5, 4.0])
def test_discrete_laplace_has_the_exact_pmf_quick(scale):
    draws = stream(f"dl{scale}").discrete_laplace(scale, 200_000)
    assert chi_square_p(draws, lambda y: discrete_laplace_pmf(scale, y)) > 1e-4


def test_a_sampler_with_the_wrong_scale_fails_the_check():
    """The check has power: a discrete Gaussian 2 % too wide is rejected at 10⁶ draws."""
    draws = stream("wrong").discrete_gaussian(3.06, 1_000_000)
    assert chi_square_p(draws, lambda y: discrete_gaussian_pmf(3.0, y)) < 1e-4


def test_gaussian_samplers_are_normal_with_the_asked_std_quick():
    rng = stream("normal")
    for draws in (rng.normal(2.5, 200_000), rng.gaussian_tensor(2.5, (200_000,)).double().numpy()):
        assert stats.kstest(draws / 2.5, "norm").pvalue > 1e-4
        assert abs(draws.std() / 2.5 - 1) < 0.01


def test_uniform_and_poisson_mask_quick():
    rng = stream("uniform")
    u = rng.uniform(200_000)
    assert 0 < u.min() and u.max() < 1
    assert stats.kstest(u, "uniform").pvalue > 1e-4
    mask = rng.bernoulli_mask(200_000, 0.01)
    assert abs(mask.sum() - 2000) < 5 * math.sqrt(2000)


@pytest.mark.slow
@pytest.mark.parametrize("sigma", [0.3, 1.0, 7.2, 300.0])
def test_discrete_gaussian_has_the_exact_pmf(sigma):
    draws = stream(f"slow-dg{sigma}").discrete_gaussian(sigma, 1_000_000)
    assert chi_square_p(draws, lambda y: discrete_gaussian_pmf(sigma, y)) > 1e-4
    assert abs(draws.var() / discrete_gaussian_var(sigma) - 1) < 0.01


def discrete_gaussian_var(sigma: float) -> float:
    span = np.arange(-int(40 * sigma) - 40, int(40 * sigma) + 41).astype(float)
    weights = np.exp(-(span**2) / (2 * sigma**2))
    return float((weights * span**2).sum() / weights.sum())


@pytest.mark.slow
@pytest.mark.parametrize("scale", [0.2, 1.0, 25.0])
def test_discrete_laplace_has_the_exact_pmf(scale):
    draws = stream(f"slow-dl{scale}").discrete_laplace(scale, 1_000_000)
    assert chi_square_p(draws, lambda y: discrete_laplace_pmf(scale, y)) > 1e-4


@pytest.mark.slow
def test_gaussian_tensor_tails_match_the_normal():
    """10⁶ float32 draws: KS on the whole law and the frequency beyond 4σ (where float32 could bite)."""
    draws = stream("slow-tensor").gaussian_tensor(1.0, (1_000_000,)).double().numpy()
    assert stats.kstest(draws, "norm").pvalue > 1e-4
    beyond = (np.abs(draws) > 4).sum()
    expected = 2 * stats.norm.sf(4) * draws.size
    assert abs(beyond - expected) < 5 * math.sqrt(expected)


# -- no truncated tails: every value of the pure-ε samplers stays possible ------------------------
def forced_uniforms(rng: SecureRandom, calls: int) -> SecureRandom:
    """Make the first ``calls`` uniform draws of ``rng`` the smallest value of the grid."""
    real, left = rng.uniform, [calls]

    def uniform(size):
        if left[0] > 0:
            left[0] -= 1
            return np.full(size, 0.5 * 2.0**-52)
        return real(size)

    rng.uniform = uniform
    return rng


def test_uniform_stays_inside_the_open_interval():
    rng = stream("grid")
    rng.words = lambda n: np.full(int(n), np.iinfo(np.uint64).max, dtype=np.uint64)
    assert rng.uniform(3).max() < 1.0  # the top word: 1 - 2^-53, not 1.0
    rng.words = lambda n: np.zeros(int(n), dtype=np.uint64)
    assert rng.uniform(3).min() > 0.0


def test_geometric_and_discrete_laplace_draw_beyond_37_scales():
    """The inverse-CDF sampler never drew past ~37 scales (so a pure-ε release was only (ε, δ))."""
    for scale in (1.0, 0.37, 1234.5):
        value = forced_uniforms(stream(f"tail{scale}"), 3).geometric(scale, 1)[0]
        assert value >= 40 * scale - 1  # three draws at the grid's floor: past the old largest value
    magnitude = np.abs(forced_uniforms(stream("laplace tail"), 3).discrete_laplace(2.0, 1))[0]
    assert magnitude >= 79


def test_bernoulli_exp_keeps_far_tails_possible_and_has_the_right_rate():
    forced = forced_uniforms(stream("bexp forced"), 1000)
    assert forced.bernoulli_exp(np.array([50.0, 700.0, 800.0])).all()  # e^-800 underflows; still possible
    rng = stream("bexp")
    for gamma, n in ((0.3, 200_000), (3.7, 400_000), (11.0, 4_000_000)):
        hits = int(rng.bernoulli_exp(np.full(n, gamma)).sum())
        expected = n * math.exp(-gamma)
        assert abs(hits - expected) < 5 * math.sqrt(expected), (gamma, hits, expected)


@pytest.mark.parametrize("scale", [0.2, 1.0, 7.3])
def test_geometric_has_the_exact_pmf_quick(scale):
    r = math.exp(-1 / scale)
    draws = stream(f"geometric{scale}").geometric(scale, 200_000)
    assert chi_square_p(draws, lambda k: (1 - r) * r ** k.astype(float)) > 1e-4
