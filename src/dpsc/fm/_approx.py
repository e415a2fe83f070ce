"""Polynomial approximations of the softplus energy term of a hidden unit.

The free energy of an RBM hidden unit is ``softplus(z) = log(1 + e^z)`` with ``z = w·x + b``; its
derivative is ``σ(z) = P(h = 1 | x)``. The functional mechanism needs the objective as a
polynomial in the parameters, so ``softplus`` is replaced by a degree-``L`` polynomial in ``z``
(Phan, Wu & Dou 2017, §4.1: Chebyshev expansion; Taylor and piecewise-linear as ablations).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import factorial

import numpy as np
from numpy.polynomial import Chebyshev, Polynomial

APPROXIMATIONS = ("chebyshev", "taylor", "piecewise")


def softplus(z: np.ndarray) -> np.ndarray:
    """``log(1 + e^z)``, computed stably."""
    z = np.asarray(z, dtype=float)
    return np.logaddexp(0.0, z)


def sigmoid_derivative_polynomials(order: int) -> list[Polynomial]:
    """Polynomials ``P_k`` with ``σ^{(k)}(z) = P_k(σ(z))`` for ``k = 0, …, order``.

    From ``σ' = σ(1 − σ)``: ``P_0(s) = s`` and ``P_{k+1}(s) = P_k'(s) · s(1 − s)``.
    """
    logistic = Polynomial([0.0, 1.0, -1.0])  # s(1 - s)
    polys = [Polynomial([0.0, 1.0])]
    for _ in range(order):
        polys.append(polys[-1].deriv() * logistic)
    return polys


def softplus_derivative_bound(order: int, n_grid: int = 20001) -> float:
    """``max_z |softplus^{(order)}(z)| = max_{s∈[0,1]} |P_{order-1}(s)|`` (``order ≥ 1``)."""
    if order < 1:
        raise ValueError("order must be >= 1")
    poly = sigmoid_derivative_polynomials(order - 1)[-1]
    s = np.linspace(0.0, 1.0, n_grid)
    return float(np.abs(poly(s)).max())


def chebyshev_error_bound(degree: int, radius: float) -> float:
    r"""Uniform error bound of the degree-``L`` Chebyshev interpolant of softplus on ``[−R, R]``.

    For interpolation at the ``L + 1`` Chebyshev points of ``[a, b]`` (e.g. Trefethen, *Approximation
    Theory and Approximation Practice*, Thm. 15.1 in interval form)

    .. math:: \max_{|z|≤R} |f(z) − p_L(z)| ≤ \frac{((b − a)/2)^{L+1}}{2^L (L+1)!}
              \max |f^{(L+1)}| = \frac{R^{L+1}}{2^L (L+1)!} \max_s |P_L(s)|,

    with ``f^{(L+1)} = σ^{(L)} = P_L(σ)`` (:func:`sigmoid_derivative_polynomials`).
    """
    return (
        radius ** (degree + 1) / (2**degree * factorial(degree + 1)) * softplus_derivative_bound(degree + 1)
    )


@dataclass(frozen=True)
class PolynomialApproximation:
    """``softplus(z) ≈ Σ_l β_l z^l`` on ``[−radius, radius]``.

    Attributes
    ----------
    kind
        ``"chebyshev"``, ``"taylor"`` or ``"piecewise"``.
    degree
        ``L``.
    radius
        ``R``: the interval on which the approximation is meant to hold.
    coef
        Monomial coefficients ``β_0, …, β_L`` in ``z`` (``None`` for ``"piecewise"``, which is not
        a polynomial).
    """

    kind: str
    degree: int
    radius: float
    coef: np.ndarray | None

    def __call__(self, z: np.ndarray) -> np.ndarray:
        z = np.asarray(z, dtype=float)
        if self.kind == "piecewise":
            knots = np.linspace(-self.radius, self.radius, self.degree + 1)
            return np.interp(z, knots, softplus(knots))
        return Polynomial(self.coef)(z)

    def max_error(self, n_grid: int = 4001) -> float:
        """Largest ``|softplus(z) − p(z)|`` on a grid of ``[−R, R]``."""
        z = np.linspace(-self.radius, self.radius, n_grid)
        return float(np.abs(softplus(z) - self(z)).max())

    @property
    def is_polynomial(self) -> bool:
        """Whether the functional mechanism can use it (only polynomials in ``z`` can)."""
        return self.coef is not None


def approximate_softplus(
    kind: str = "chebyshev", degree: int = 7, radius: float = 4.0
) -> PolynomialApproximation:
    """Approximate ``softplus`` on ``[−R, R]`` by a polynomial of degree ``L``.

    Parameters
    ----------
    kind
        ``"chebyshev"``: interpolant at the Chebyshev points of ``[−R, R]``
        (:meth:`numpy.polynomial.Chebyshev.interpolate`), converted to monomials in ``z``; error
        bounded by :func:`chebyshev_error_bound`. ``"taylor"``: Taylor series at 0,
        ``β_l = σ^{(l−1)}(0)/l!`` (``β_0 = log 2``). ``"piecewise"``: linear interpolation at
        ``L + 1`` equispaced knots. It is not a polynomial in ``z``, so the functional mechanism
        cannot perturb an objective built on it (its data enter through which piece each cell falls
        in, which changes with the weights); it is available for comparing approximation errors only.
    degree
        ``L ≥ 1``.
    radius
        ``R > 0``.
    """
    if kind not in APPROXIMATIONS:
        raise ValueError(f"Unknown approximation {kind!r}; choose one of {APPROXIMATIONS}.")
    if int(degree) != degree or degree < 1:
        raise ValueError(f"degree must be an integer >= 1, got {degree}.")
    if not radius > 0:
        raise ValueError(f"radius must be > 0, got {radius}.")
    degree = int(degree)
    if kind == "chebyshev":
        series = Chebyshev.interpolate(softplus, degree, domain=[-radius, radius])
        coef = series.convert(kind=Polynomial).coef
        coef = np.pad(coef, (0, degree + 1 - coef.size))
    elif kind == "taylor":
        polys = sigmoid_derivative_polynomials(max(degree - 1, 0))
        coef = np.array([np.log(2.0)] + [polys[j - 1](0.5) / factorial(j) for j in range(1, degree + 1)])
    else:
        coef = None
    return PolynomialApproximation(kind, degree, float(radius), coef)
