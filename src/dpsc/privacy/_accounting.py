r"""Noise calibration and ε accounting, delegated to Opacus's accountants.

Every ε dpsc reports is computed by an Opacus accountant (RDP: Mironov 2017, Mironov, Talwar &
Zhang 2019; PRV: Gopi, Lee & Wutschitz 2021) from a history of Gaussian releases
``[(σ, q, steps), …]``; no Rényi divergence is written by hand here. The RDP accountant is asked
for more orders than Opacus's default (which stops at 63): integers to 256 always, and to 10⁴ when
every release reads all cells (q = 1, where RDP is closed-form), so releases with a large noise
multiplier find their optimal order instead of being cut off at the last one (Opacus then warns
"Optimal order is the largest alpha"; the ε it returns is still a valid, looser bound).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator

import numpy as np
from opacus.accountants import IAccountant, create_accountant
from opacus.accountants.analysis.rdp import compute_rdp
from opacus.accountants.analysis.rdp import get_privacy_spent as rdp_privacy_spent
from opacus.accountants.utils import get_noise_multiplier

ACCOUNTANTS = ("rdp", "prv")

#: Rényi orders of the RDP accountant: Opacus's defaults and integers to 256; releases of all
#: cells (q = 1, whose RDP is closed-form and cheap at any order) also get orders up to 10⁴.
_BASE_ORDERS = [1.01, 1.02, 1.05] + [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
RDP_ORDERS = [*_BASE_ORDERS, 64, 80, 96, 128, 160, 192, 256]
RDP_ORDERS_FULL_BATCH = RDP_ORDERS + [int(x) for x in np.unique(np.geomspace(320, 1e4, 16).astype(int))]

History = list[tuple[float, float, int]]


def make_accountant(name: str) -> IAccountant:
    """Return a fresh Opacus accountant (``"rdp"`` or ``"prv"``)."""
    if name not in ACCOUNTANTS:
        raise ValueError(f"Unknown accountant {name!r}; choose one of {ACCOUNTANTS}.")
    return create_accountant(mechanism=name)


def _orders(name: str, sample_rates) -> dict:
    if name != "rdp":
        return {}
    full_batch = all(float(q) >= 1.0 for q in sample_rates)
    return {"alphas": RDP_ORDERS_FULL_BATCH if full_batch else RDP_ORDERS}


@contextlib.contextmanager
def _order_notices_quiet(name: str, *, searching: bool = False) -> Iterator[None]:
    """Silence Opacus's notices about which RDP order was optimal where they say nothing of ε.

    With the PRV accountant, an RDP bound only sizes the PRV's discretisation domain (Gopi et al.
    2021, §5): the ε returned does not depend on which order was optimal there. While
    ``searching`` for σ, Opacus's bracket tries very small σ first, whose optimal order is the
    smallest one; the σ it returns is found at orders where the bound is tight.
    """
    with warnings.catch_warnings():
        if name == "prv":
            warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        if searching:
            warnings.filterwarnings("ignore", message="Optimal order is the smallest alpha")
        yield


@functools.lru_cache(maxsize=1024)
def _rdp_of_one_step(sigma: float, sample_rate: float, orders: tuple) -> np.ndarray:
    """Opacus's RDP of one sampled-Gaussian step at every order (read-only; cached per (σ, q))."""
    rdp = np.asarray(compute_rdp(q=sample_rate, noise_multiplier=sigma, steps=1, orders=list(orders)))
    rdp.setflags(write=False)
    return rdp


def _rdp_epsilon(history: History, delta: float, orders: list) -> float:
    r"""ε of an RDP history: Opacus's :class:`RDPAccountant` sum, with each (σ, q)'s RDP computed once.

    Opacus's ``compute_rdp(q, σ, n, orders)`` is the one-step vector times n, and its accountant
    sums those vectors over the history and converts the sum with ``get_privacy_spent``; this is
    the same arithmetic in the same order (the same float result), without recomputing the
    one-step vector at every call (a fit asks for ε after every epoch and along its curve).
    """
    key = tuple(orders)
    rdp = sum([_rdp_of_one_step(float(s), float(q), key) * int(n) for s, q, n in history])
    eps, _ = rdp_privacy_spent(orders=orders, rdp=rdp, delta=delta)
    return float(eps)


def spent_epsilon(accountant: IAccountant, delta: float) -> float:
    """ε spent so far by ``accountant`` at ``delta`` (0 when nothing was spent)."""
    if not accountant.history:
        return 0.0
    name = accountant.mechanism()
    orders = _orders(name, [entry[1] for entry in accountant.history])
    with _order_notices_quiet(name):
        if name == "rdp":
            return _rdp_epsilon(accountant.history, delta, orders["alphas"])
        return float(accountant.get_epsilon(delta=delta, **orders))


def history_epsilon(history: History, delta: float, accountant: str = "rdp") -> float:
    """ε of a history of Gaussian releases ``[(σ, q, steps), …]`` at ``delta``."""
    acc = make_accountant(accountant)
    acc.history = [(float(s), float(q), int(n)) for s, q, n in history]
    return spent_epsilon(acc, delta)


def calibrate_noise_multiplier(
    epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str = "rdp"
) -> float:
    r"""Smallest noise multiplier σ whose ``steps`` sampled-Gaussian steps stay within ε.

    Composes ``steps`` applications of the Poisson-subsampled Gaussian mechanism with rate
    :math:`q` = ``sample_rate`` and noise :math:`\mathcal N(0, \sigma^2 C^2)` and returns the σ
    found by :func:`opacus.accountants.utils.get_noise_multiplier` (bisection; the resulting
    ε is at most ``epsilon`` and within 0.01 of it). The search reads public settings
    only, so its answer is remembered per settings: the two branches of a gated plan, which share
    every release but their k-means, search each shared σ once.
    """
    return _searched_sigma(float(epsilon), float(delta), float(sample_rate), int(steps), accountant)


@functools.lru_cache(maxsize=256)
def _searched_sigma(epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str) -> float:
    with _order_notices_quiet(accountant, searching=True):
        return float(
            get_noise_multiplier(
                target_epsilon=epsilon,
                target_delta=delta,
                sample_rate=sample_rate,
                steps=steps,
                accountant=accountant,
                **_orders(accountant, [sample_rate]),
            )
        )


def nominal_sigma(
    epsilon: float,
    delta: float,
    parts: dict[str, tuple[float, float, int]],
    name: str,
    accountant: str = "rdp",
) -> float:
    r"""σ of part ``name`` of :func:`split_budget`'s ``parts`` at its nominal share, alone.

    :math:`\sigma_k^0` spends :math:`w_k\varepsilon` at :math:`\delta/K` (one σ search). Every
    calibration of these parts gives the part :math:`c\,\sigma_k^0` with :math:`c \le 1`, so
    :math:`\sigma_k^0` bounds its σ from above before the others are searched.
    """
    shares = np.array([share for share, _, _ in parts.values()], dtype=float)
    share, sample_rate, steps = parts[name]
    weight = share / shares.sum()
    return calibrate_noise_multiplier(weight * epsilon, delta / len(parts), sample_rate, steps, accountant)


def split_budget(
    epsilon: float,
    delta: float,
    parts: dict[str, tuple[float, float, int]],
    accountant: str = "rdp",
    tolerance: float = 1e-3,
    keep: tuple[str, ...] | None = None,
) -> dict[str, tuple[float, float]]:
    r"""Noise multipliers of several releases that share one (ε, δ) in fixed proportions.

    ``parts`` maps a name to ``(share, sample_rate, steps)``. Each part is calibrated once, alone,
    to its nominal share: :math:`\sigma_k^0` spends :math:`w_k\varepsilon` at :math:`\delta/K`
    (:func:`calibrate_noise_multiplier`; by basic composition the parts together spend at most ε
    at δ). Composition in one Opacus accountant is tighter than that sum, so all parts are then
    scaled by the smallest common factor :math:`c \le 1`, :math:`\sigma_k = c\,\sigma_k^0`, whose
    composition still spends at most ε at δ (bisection to relative ``tolerance``; each step is one
    accountant evaluation, no calibration). Returns ``name -> (ε_k, σ_k)``, ε_k the part's own ε
    at δ/K.

    ``keep``: the parts that run, when some do not (decided from public sizes and a
    :func:`nominal_sigma`). Only they are searched and scaled; the shares of the others go to
    them (their nominal σ alone spend at most ε at δ, so c ≤ 1 is still feasible).
    """
    names = tuple(parts) if keep is None else tuple(n for n in parts if n in keep)
    shares = np.array([share for share, _, _ in parts.values()], dtype=float)
    if np.any(shares <= 0) or not np.all(np.isfinite(shares)):
        raise ValueError(f"Every share must be a positive number; got {shares.tolist()}.")
    if not epsilon > 0 or not 0 < delta < 1:
        raise ValueError(f"split_budget needs epsilon > 0 and 0 < delta < 1, got {epsilon}, {delta}.")
    part_delta = delta / len(parts)
    base = [nominal_sigma(epsilon, delta, parts, n, accountant) for n in names]

    scale = common_scale(
        [(s, parts[n][1], parts[n][2]) for s, n in zip(base, names, strict=True)],
        epsilon,
        delta,
        accountant,
        tolerance,
    )
    return {
        n: (history_epsilon([(scale * s, parts[n][1], parts[n][2])], part_delta, accountant), scale * s)
        for s, n in zip(base, names, strict=True)
    }


def common_scale(
    history: History, epsilon: float, delta: float, accountant: str = "rdp", tolerance: float = 1e-3
) -> float:
    r"""Smallest factor :math:`c \le 1` such that the history with every σ times c spends at most ε at δ.

    The history ``[(σ_k, q_k, T_k), …]`` must itself spend at most ε (c = 1 feasible). Bisection
    to relative ``tolerance`` on c, each step one accountant evaluation of the composed history
    (no σ search); the result is the upper end of the bracket, so the scaled history spends at
    most ε.
    """

    def composed(c: float) -> float:
        return history_epsilon([(c * s, q, n) for s, q, n in history], delta, accountant)

    lo, hi = 0.05, 1.0
    if composed(lo) <= epsilon:
        hi = lo
    while hi - lo > tolerance * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if composed(mid) <= epsilon else (mid, hi)
    return hi


def epsilon_curve(history: History, delta: float, accountant: str, n_points: int = 40) -> tuple[list, list]:
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
        steps_out.append(int(mark))
        eps_out.append(history_epsilon(prefix, delta, accountant))
    return steps_out, eps_out
