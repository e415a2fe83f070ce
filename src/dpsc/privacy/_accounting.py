"""Noise calibration and ε accounting, delegated to Opacus's accountants."""

from __future__ import annotations

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
