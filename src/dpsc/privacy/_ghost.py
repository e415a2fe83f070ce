"""Ghost clipping: the sum of per-cell clipped gradients without materialising per-cell gradients."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from opacus.grad_sample import GradSampleModuleFastGradientClipping


def ghost_clipped_backward(
    gsm: GradSampleModuleFastGradientClipping,
    per_cell_loss: torch.Tensor,
    params: Sequence[torch.nn.Parameter],
) -> None:
    r"""Leave :math:`\sum_i \mathrm{clip}_C(\nabla_\theta L_i)` in ``p.grad`` for ``params``.

    Two backward passes (Bu et al. 2023, as implemented by Opacus): the first, through Opacus's
    norm hooks, yields every cell's gradient norm :math:`\|g_i\|` without forming :math:`g_i`;
    the second, with hooks off, differentiates :math:`\sum_i c_i L_i` with the constants
    :math:`c_i = \min(1, C/\|g_i\|)`, whose gradient is the sum of clipped per-cell gradients.
    Gradients of parameters outside ``params`` keep the (unclipped) result of the first pass.
    """
    with warnings.catch_warnings():
        # Opacus's norm hooks are full backward hooks; the first layer's input (the data) needs
        # no gradient, which torch reports on every call.
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        per_cell_loss.sum().backward(retain_graph=True)
        coef = gsm.get_clipping_coef().detach()
        for p in params:
            p.grad = None
        gsm.disable_hooks()
        try:
            torch.autograd.backward((coef * per_cell_loss).sum(), inputs=list(params))
        finally:
            gsm.enable_hooks()


def release_privacy_hooks(
    gsm: GradSampleModuleFastGradientClipping, params: Sequence[torch.nn.Parameter]
) -> None:
    """Remove Opacus's hooks and per-parameter bookkeeping (state-dict keys never change)."""
    gsm._close()
    for p in params:
        for attr in ("grad_sample", "_norm_sample", "summed_grad", "_forward_counter"):
            if hasattr(p, attr):
                delattr(p, attr)
        p.grad = None
