"""Optimizers by name, and Opacus ``DPOptimizer`` subclasses with a sign update."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from opacus.optimizers import DPOptimizer

from ._sign import SignAdam, SignSGD

OPTIMIZERS = ("sgd", "adam", "adadelta", "dpsignsgd", "dpsignadam")

DEFAULT_PRIVATE_LRS: dict[str, dict[str, float]] = {
    # The one table of learning rates of DP parameters, per update rule and per use:
    # DP-DCAN's instance and cluster stages, and the federated sites' local DP-SGD.
    # sgd/dpdcan: chosen on PBMC 4k (public, labelled): at cluster-stage lr 0.1 the DP fits
    # collapse to fewer clusters than at 0.01 (docs, Benchmarks: "DP-DCAN benchmark results");
    # federated: the paper's local SGD rate. The others are starting points, not tuned on
    # private data.
    "sgd": {"dpdcan_instance": 1.0, "dpdcan_cluster": 0.01, "federated": 0.032},
    "adam": {"dpdcan_instance": 1e-4, "dpdcan_cluster": 1e-5, "federated": 1e-3},
    "adadelta": {"dpdcan_instance": 1.0, "dpdcan_cluster": 0.1, "federated": 1.0},
    "dpsignsgd": {"dpdcan_instance": 1e-4, "dpdcan_cluster": 1e-5, "federated": 1e-3},
    "dpsignadam": {"dpdcan_instance": 1e-4, "dpdcan_cluster": 1e-5, "federated": 1e-3},
}


def check_optimizer(name: str) -> None:
    """Refuse an update rule dpsc does not have (the one place that says which ones exist)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {name!r}; choose one of {OPTIMIZERS}.")


def make_optimizer(name: str, params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """Return the update rule called ``name``; under DP, Opacus wraps it (clip + noise first).

    ``"sgd"`` is SGD with momentum 0.9, ``"adam"`` and ``"adadelta"`` are torch's, and
    ``"dpsignsgd"`` / ``"dpsignadam"`` are :class:`SignSGD` / :class:`SignAdam` (the "dp" names
    follow the paper; the sign update is only private inside a ``DPOptimizer``).
    """
    check_optimizer(name)
    params = list(params)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adadelta":
        return torch.optim.Adadelta(params, lr=lr)
    if name == "dpsignsgd":
        return SignSGD(params, lr=lr)
    return SignAdam(params, lr=lr)


class DPSignSGD(DPOptimizer):
    r"""DP-SignSGD (Ghosh & Das, Alg. 3): Opacus clipping and noise, then a sign step.

    .. math:: \tilde g = \frac1B\Big(\sum_i \mathrm{clip}_C(g_i) + N(0, \sigma^2C^2 I)\Big),
       \qquad \theta \leftarrow \theta - \alpha\,\operatorname{sign}(\tilde g).

    Parameters are those of :class:`opacus.optimizers.DPOptimizer` plus ``params`` and ``lr``.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-3, **dp_kwargs: Any) -> None:
        super().__init__(SignSGD(params, lr=lr), **dp_kwargs)


class DPSignAdam(DPOptimizer):
    r"""DP-SignAdam (Ghosh & Das, Alg. 4): Opacus clipping and noise, then :class:`SignAdam`'s step."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        **dp_kwargs: Any,
    ) -> None:
        super().__init__(SignAdam(params, lr=lr, betas=betas, eps=eps), **dp_kwargs)
