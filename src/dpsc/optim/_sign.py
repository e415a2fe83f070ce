r"""Sign optimizers: the update step of DP-SignSGD / DP-SignAdam (Ghosh & Das, Alg. 3/4).

These are plain torch optimizers that read ``p.grad`` as it is. Inside an Opacus
:class:`~opacus.optimizers.DPOptimizer` ``p.grad`` is already the clipped, summed, noised and
averaged gradient :math:`\tilde g`, so the sign is taken *after* the noise and is
post-processing of the sampled Gaussian mechanism: the accounting does not change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


class SignSGD(torch.optim.Optimizer):
    r"""Sign descent: :math:`\theta \leftarrow \theta - \alpha\,\operatorname{sign}(\tilde g)`.

    Every coordinate with a non-zero gradient moves by exactly ``lr``.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-3) -> None:
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}.")
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(torch.sign(p.grad), alpha=-group["lr"])
        return loss


class SignAdam(torch.optim.Optimizer):
    r"""Adam moments with a sign step (Ghosh & Das, Alg. 4).

    .. math::
        m_t = \beta_1 m_{t-1} + (1-\beta_1)\tilde g_t,\quad
        v_t = \beta_2 v_{t-1} + (1-\beta_2)\tilde g_t^2,\quad
        \hat m_t = \frac{m_t}{1-\beta_1^t},\ \hat v_t = \frac{v_t}{1-\beta_2^t},\quad
        \theta_t = \theta_{t-1}
        - \alpha\,\operatorname{sign}\!\Big(\frac{\hat m_t}{\sqrt{\hat v_t}+\epsilon}\Big).

    Since :math:`\sqrt{\hat v_t}+\epsilon > 0` the step equals :math:`\alpha\operatorname{sign}(\hat m_t)`:
    sign descent on the momentum of the noisy gradient. We keep :math:`v_t` so the state matches
    the paper's algorithm.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}.")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                state["m"].mul_(beta1).add_(p.grad, alpha=1 - beta1)
                state["v"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                m_hat = state["m"] / (1 - beta1**t)
                v_hat = state["v"] / (1 - beta2**t)
                p.add_(torch.sign(m_hat / (v_hat.sqrt() + group["eps"])), alpha=-group["lr"])
        return loss
