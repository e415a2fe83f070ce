r"""One shape for every private release: per-cell contributions, a sum, calibrated noise.

Every proven release in dpsc is the sum over cells of a per-cell contribution with a stated
bound, plus noise calibrated to that bound:

.. math:: T(D) = \sum_{i \in D} f(x_i), \qquad \lVert f(x)\rVert_2 \le \Delta,

so adding or removing one cell moves :math:`T` by at most :math:`\Delta` (the *sensitivity*).
:class:`GaussianSum` states :math:`(d, \Delta, \sigma)` and does the rest:

**Lattice and noise** (releases of all cells, ``sample_rate=1``). The sum is rounded to the
lattice :math:`g\mathbb Z^d`, :math:`g` a power of two (so the scaling is exact in floating
point), and integer noise from the multivariate discrete Gaussian is added:

.. math:: \tilde T = g\,\bigl(\lfloor T/g\rceil + Z\bigr), \qquad
          Z \sim \mathcal N_{\mathbb Z}(0, \sigma^2\Delta_{\mathbb Z}^2 I_d), \qquad
          \Delta_{\mathbb Z} = \Delta/g + \sqrt d .

Rounding moves each coordinate by at most ½, so the rounded sums of neighbouring data sets
differ by at most :math:`\Delta_{\mathbb Z}` in L2. The multivariate discrete Gaussian with that
sensitivity has the Rényi divergence of the continuous Gaussian mechanism with noise multiplier
:math:`\sigma`, :math:`D_\alpha \le \alpha/(2\sigma^2)` (Canonne, Kamath & Steinke 2020, Prop. 5
and Thm 15), so the release is accounted as the Opacus history entry :math:`(\sigma, 1, 1)`.
:math:`g = 2^{\lfloor\log_2(\Delta/(1000\sqrt d))\rfloor}` keeps the cost of the lattice at most
0.1 % of the noise (:attr:`GaussianSum.noise_std` is :math:`\sigma\Delta_{\mathbb Z} g \le
1.001\,\sigma\Delta`). Integer outputs also close the floating-point attacks on noise samplers
(:mod:`dpsc.privacy._random`).

**A sum over sites.** Because the noise is added to an integer vector, the sum can be split:
site :math:`k` encodes its own sum :math:`\lfloor T_k/g\rceil` and adds a *share* of the noise,
:math:`Z_k \sim \mathcal N_{\mathbb Z}(0, \sigma^2\Delta_{\mathbb Z}^2/t)`; secure aggregation
adds the integer vectors exactly. One cell changes one site's rounded sum by at most
:math:`\Delta_{\mathbb Z}`, and the sum of the :math:`t` honest shares is, up to a slack that
:func:`distributed_slack` bounds (Kairouz, Liu & Steinke 2021, Thm 1), the central discrete
Gaussian: the federated release is the central one, up to the round-off of :math:`K` rounded
sums instead of one (at most :math:`Kg/2` per coordinate).

**Sampled releases** (``sample_rate < 1``: the DP k-means start and the cluster frequencies of
DP-DCAN, which read a Poisson sample of the cells like a DP-SGD step) add continuous Gaussian
noise :math:`\mathcal N(0, \sigma^2\Delta^2)` from the secure sampler instead: the sampled
Gaussian's accounting (Mironov, Talwar & Zhang 2019), which Opacus implements, is proven for the
continuous Gaussian. They are never split over sites.

:class:`LaplaceSum` is the pure-ε counterpart: L1 sensitivity, lattice
:math:`g = 2^{\lfloor\log_2(\Delta_1/(1000 d))\rfloor}`, discrete Laplace noise of scale
:math:`\Delta_{1,\mathbb Z}/\varepsilon` with :math:`\Delta_{1,\mathbb Z} = \Delta_1/g + d`
(the geometric mechanism, Ghosh, Roughgarden & Sundararajan 2012), which is
:math:`\varepsilon`-DP for the rounded sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._random import SecureRandom

#: Lattice points per unit of sensitivity and per sqrt(d) (per d for L1): the lattice adds at most
#: 1/RESOLUTION to the noise's scale.
RESOLUTION = 1000.0


def _power_of_two_below(x: float) -> float:
    return 2.0 ** math.floor(math.log2(x))


@dataclass(frozen=True)
class GaussianSum:
    """The Gaussian release of a sum over cells of contributions with L2 norm at most ``sensitivity``.

    Attributes
    ----------
    name
        What is released (used in records and to name the noise stream).
    size
        d, the number of released coordinates.
    sensitivity
        Δ, the largest L2 norm of one cell's contribution.
    noise_multiplier
        σ; 0 releases the exact sum (a non-private run).
    sample_rate
        q of the Poisson sample the sum runs over (1: every cell).
    """

    name: str
    size: int
    sensitivity: float
    noise_multiplier: float
    sample_rate: float = 1.0

    def __post_init__(self) -> None:
        if not self.sensitivity > 0 or self.size < 1 or self.noise_multiplier < 0:
            raise ValueError(
                f"A Gaussian release needs sensitivity > 0, size >= 1 and sigma >= 0; got "
                f"{self.sensitivity}, {self.size}, {self.noise_multiplier}."
            )

    @property
    def on_lattice(self) -> bool:
        """Whether the release is lattice-encoded (every release of all cells)."""
        return self.sample_rate >= 1.0

    @property
    def lattice(self) -> float:
        """g, the power-of-two spacing of the lattice."""
        return _power_of_two_below(self.sensitivity / (RESOLUTION * math.sqrt(self.size)))

    @property
    def lattice_sensitivity(self) -> float:
        r""":math:`\Delta_{\mathbb Z} = \Delta/g + \sqrt d`, the L2 sensitivity of the rounded sum."""
        return self.sensitivity / self.lattice + math.sqrt(self.size)

    @property
    def lattice_std(self) -> float:
        """Standard deviation of the integer noise (lattice units)."""
        return self.noise_multiplier * self.lattice_sensitivity

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise on each released coordinate, in the data's units."""
        if not self.on_lattice:
            return self.noise_multiplier * self.sensitivity
        return self.lattice_std * self.lattice

    def history(self) -> tuple[float, float, int]:
        """Return the Opacus history entry of this release: ``(σ, q, 1)``."""
        return (float(self.noise_multiplier), float(self.sample_rate), 1)

    # -- the lattice, for sums over cells or over sites ---------------------------------------
    def encode(self, exact: np.ndarray) -> np.ndarray:
        """Round a sum (over all cells, or one site's cells) to the lattice: int64 coordinates."""
        if not self.on_lattice:
            raise ValueError(f"{self.name}: a sampled release (q < 1) is not split over sites.")
        values = np.asarray(exact, dtype=np.float64).reshape(-1)
        if values.size != self.size:
            raise ValueError(f"{self.name}: expected {self.size} values, got {values.size}.")
        if not np.isfinite(values).all():  # rint(NaN) cast to int64 would be INT64_MIN
            raise ValueError(f"{self.name}: a sum that is not finite cannot be released.")
        return np.rint(values / self.lattice).astype(np.int64)

    def noise(self, rng: SecureRandom, shares: int = 1) -> np.ndarray:
        """Integer noise: the whole of it (``shares=1``) or one of ``shares`` equal shares."""
        if shares < 1:
            raise ValueError(f"shares must be >= 1, got {shares}.")
        return rng.discrete_gaussian(self.lattice_std / math.sqrt(shares), self.size)

    def decode(self, total: np.ndarray) -> np.ndarray:
        """Lattice coordinates (a noisy sum) back to the data's units."""
        return np.asarray(total, dtype=np.float64) * self.lattice

    def release(self, exact: np.ndarray, rng: SecureRandom) -> np.ndarray:
        """Return the central release of a sum over all the cells (module docstring)."""
        if not self.on_lattice:
            values = np.asarray(exact, dtype=np.float64).reshape(-1)
            return values + rng.normal(self.noise_std, values.size)
        return self.decode(self.encode(exact) + self.noise(rng))


def distributed_slack(release: GaussianSum, honest_sites: int) -> float:
    r"""log10 of the extra concentrated-DP :math:`\tau d/4` when ``honest_sites`` add noise shares.

    Kairouz, Liu & Steinke (2021, Thm 1): the sum of :math:`t` independent
    :math:`\mathcal N_{\mathbb Z}(0, s^2)` (here :math:`s^2 = \sigma^2\Delta_{\mathbb Z}^2/t`)
    satisfies :math:`\rho`-zCDP with :math:`\rho = \Delta_{\mathbb Z}^2/(2ts^2) + \tau d/4`,
    :math:`\tau = 10\sum_{k=1}^{t-1} e^{-2\pi^2 s^2 k/(k+1)}`; the first term is the central
    mechanism's. Returns ``-inf`` for one site (no slack). At dpsc's lattice :math:`s` is of the
    order of :math:`10^5` or more, and the slack is below :math:`10^{-10^9}`.
    """
    t = int(honest_sites)
    if t <= 1 or release.noise_multiplier == 0:
        return -math.inf if t <= 1 else math.inf
    s2 = release.lattice_std**2 / t
    exponents = np.array([-2.0 * math.pi**2 * s2 * k / (k + 1) for k in range(1, t)])
    top = exponents.max()
    log_tau = math.log(10.0) + top + math.log(np.exp(exponents - top).sum())
    return (log_tau + math.log(release.size / 4.0)) / math.log(10.0)


@dataclass(frozen=True)
class LaplaceSum:
    """The pure ε-DP release of a sum with L1 sensitivity ``l1_sensitivity`` (discrete Laplace).

    Attributes
    ----------
    name
        What is released.
    size
        d, the number of released coordinates.
    l1_sensitivity
        Δ₁, the largest L1 change one row (under the estimator's neighbouring relation) makes.
    epsilon
        ε of this release.
    """

    name: str
    size: int
    l1_sensitivity: float
    epsilon: float

    @property
    def lattice(self) -> float:
        """g, the power-of-two spacing of the lattice."""
        return _power_of_two_below(self.l1_sensitivity / (RESOLUTION * self.size))

    @property
    def lattice_scale(self) -> float:
        r"""Discrete Laplace scale :math:`(\Delta_1/g + d)/\varepsilon` (lattice units)."""
        return (self.l1_sensitivity / self.lattice + self.size) / self.epsilon

    @property
    def scale(self) -> float:
        """The noise's Laplace scale in the data's units (at most 1.001 Δ₁/ε)."""
        return self.lattice_scale * self.lattice

    def release(self, exact: np.ndarray, rng: SecureRandom) -> np.ndarray:
        """``g (round(x / g) + Y)`` with Y discrete Laplace, in the shape of ``exact``."""
        values = np.asarray(exact, dtype=np.float64)
        if values.size != self.size:
            raise ValueError(f"{self.name}: expected {self.size} values, got {values.size}.")
        noise = rng.discrete_laplace(self.lattice_scale, self.size).reshape(values.shape)
        return (np.rint(values / self.lattice) + noise) * self.lattice


def laplace_release(values: np.ndarray, scale: float, rng: SecureRandom) -> np.ndarray:
    """Release ``values`` with Laplace noise of ``scale`` = Δ₁/ε through :class:`LaplaceSum`.

    The lattice adds at most 0.1 % to the scale (the release is ε-DP for the L1 sensitivity
    ``scale · ε``); ``scale = 0`` returns the values unchanged (a non-private fit).
    """
    values = np.asarray(values, dtype=np.float64)
    if scale == 0 or values.size == 0:
        return values.copy()
    return LaplaceSum("laplace", values.size, float(scale), 1.0).release(values, rng)
