"""Noise calibration and ε accounting, delegated to Opacus's accountants."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from opacus.accountants import IAccountant, create_accountant
from opacus.accountants.utils import get_noise_multiplier

ACCOUNTANTS = ("rdp", "prv")


def make_accountant(name: str) -> IAccountant:
    """Return a fresh Opacus accountant (``"rdp"`` or ``"prv"``)."""
    if name not in ACCOUNTANTS:
        raise ValueError(f"Unknown accountant {name!r}; choose one of {ACCOUNTANTS}.")
    return create_accountant(mechanism=name)


def calibrate_noise_multiplier(
    epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str = "rdp"
) -> float:
    r"""Smallest noise multiplier σ whose ``steps`` sampled-Gaussian steps stay within ε.

    Composes ``steps`` applications of the Poisson-subsampled Gaussian mechanism with rate
    :math:`q` = ``sample_rate`` and noise :math:`\mathcal N(0, \sigma^2 C^2)` and returns the σ
    found by :func:`opacus.accountants.utils.get_noise_multiplier` (bisection; the resulting
    ε is at most ``epsilon`` and within 0.01 of it).
    """
    return float(
        get_noise_multiplier(
            target_epsilon=epsilon,
            target_delta=delta,
            sample_rate=sample_rate,
            steps=steps,
            accountant=accountant,
        )
    )


def split_budget(
    epsilon: float,
    delta: float,
    parts: dict[str, tuple[float, float, int]],
    accountant: str = "rdp",
    tolerance: float = 0.01,
) -> dict[str, tuple[float, float]]:
    r"""Noise multipliers of several releases that share one (ε, δ) in fixed proportions.

    ``parts`` maps a name to ``(share, sample_rate, steps)``. Part :math:`k` gets the σ that
    spends :math:`s\,w_k\,\varepsilon` alone at :math:`\delta/K`
    (:func:`calibrate_noise_multiplier`), where the scale :math:`s` is the largest (found by
    bisection) for which the composition of all parts in one Opacus accountant spends at most
    ε at δ. Composition is tighter than the sum of the parts' ε, so :math:`s \ge 1`
    usually. Returns ``name -> (ε_k, σ_k)`` with :math:`\varepsilon_k = s\,w_k\,\varepsilon`.
    """
    names = tuple(parts)
    split = _split_budget(epsilon, delta, tuple(parts.values()), accountant, tolerance)
    return dict(zip(names, split, strict=True))


@lru_cache(maxsize=32)  # a fit plans twice (budget check, then training): calibrate once
def _split_budget(
    epsilon: float,
    delta: float,
    parts: tuple[tuple[float, float, int], ...],
    accountant: str,
    tolerance: float,
) -> tuple[tuple[float, float], ...]:
    shares = np.array([p[0] for p in parts], dtype=float)
    if np.any(shares <= 0):
        raise ValueError(f"Every share must be positive; got {shares.tolist()}.")
    part_delta = delta / len(parts)

    def sigmas(scale: float) -> list[float]:
        return [
            calibrate_noise_multiplier(scale * w * epsilon, part_delta, q, steps, accountant)
            for w, (_, q, steps) in zip(shares / shares.sum(), parts, strict=True)
        ]

    def composed(scale: float) -> float:
        acc = make_accountant(accountant)
        acc.history = [(sigma, q, steps) for sigma, (_, q, steps) in zip(sigmas(scale), parts, strict=True)]
        return float(acc.get_epsilon(delta=delta))

    lo, hi = 1.0, 4.0  # basic composition holds at scale 1; RDP composition is usually tighter
    while composed(lo) > epsilon:
        lo, hi = lo / 2, lo
    while hi - lo > tolerance * lo:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if composed(mid) <= epsilon else (lo, mid)
    weights = shares / shares.sum()
    return tuple((float(lo * w * epsilon), s) for w, s in zip(weights, sigmas(lo), strict=True))


def spent_epsilon(accountant: IAccountant, delta: float) -> float:
    """ε spent so far by ``accountant`` at ``delta`` (0 when nothing was spent)."""
    if not accountant.history:
        return 0.0
    return float(accountant.get_epsilon(delta=delta))


def epsilon_curve(
    history: list[tuple[float, float, int]], delta: float, accountant: str, n_points: int = 40
) -> tuple[list[int], list[float]]:
    """ε spent after each of ``n_points`` step counts along a recorded Opacus history.

    Replays prefixes of the history through a fresh Opacus accountant of the same kind, so the
    curve is exact at every plotted step (no interpolation of ε).
    """
    total = int(sum(h[2] for h in history))
    if total == 0:
        return [0], [0.0]
    marks = np.unique(np.linspace(1, total, num=min(n_points, total)).round().astype(int))
    steps_out, eps_out = [], []
    for mark in marks:
        prefix, left = [], int(mark)
        for sigma, q, n in history:
            take = min(n, left)
            if take > 0:
                prefix.append((sigma, q, take))
            left -= take
        acc = make_accountant(accountant)
        acc.history = prefix
        steps_out.append(int(mark))
        eps_out.append(float(acc.get_epsilon(delta=delta)))
    return steps_out, eps_out
