"""Ghost clipping: the sum of per-cell clipped gradients without materialising per-cell gradients."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from torch import nn
from torch.utils.hooks import RemovableHandle


class ModuleOutputs:
    """Keep the outputs of the private modules of one forward pass, with their gradients.

    A forward hook on each module stores its output (when autograd records it) and asks
    autograd to retain that output's gradient, so the clipped pass of
    :func:`ghost_clipped_backward` can start at the modules' outputs instead of the loss.
    """

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        self.modules = list(modules)
        self.outputs: list[list[torch.Tensor]] = [[] for _ in self.modules]
        self._handles: list[RemovableHandle] = [
            m.register_forward_hook(self._keeper(k)) for k, m in enumerate(self.modules)
        ]

    def _keeper(self, k: int):
        def keep(module: nn.Module, args, output) -> None:
            if isinstance(output, torch.Tensor) and output.requires_grad and torch.is_grad_enabled():
                output.retain_grad()
                self.outputs[k].append(output)

        return keep

    def forget_gradients(self) -> None:
        """Drop gradients left on kept outputs (by an earlier ``autograd.grad``, say)."""
        for kept in self.outputs:
            for o in kept:
                o.grad = None

    def rows_are_cells(self, n_cells: int) -> bool:
        """Return whether every kept output that received a gradient has one row per cell."""
        return all(o.shape[0] == n_cells for kept in self.outputs for o in kept if o.grad is not None)

    def clear(self) -> None:
        """Forget the kept outputs (at the end of every step)."""
        self.outputs = [[] for _ in self.modules]

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.clear()


def ghost_clipped_backward(
    gsm: GradSampleModuleFastGradientClipping,
    per_cell_loss: torch.Tensor,
    params: Sequence[torch.nn.Parameter],
    outputs: ModuleOutputs | None = None,
) -> None:
    r"""Leave :math:`\sum_i \mathrm{clip}_C(\nabla_\theta L_i)` in ``p.grad`` for ``params``.

    Two backward passes (Bu et al. 2023, as implemented by Opacus): the first, through Opacus's
    norm hooks, yields every cell's gradient norm :math:`\|g_i\|` without forming :math:`g_i`;
    the second, with hooks off, differentiates :math:`\sum_i c_i L_i` with the constants
    :math:`c_i = \min(1, C/\|g_i\|)`, whose gradient is the sum of clipped per-cell gradients.
    Gradients of parameters outside ``params`` keep the (unclipped) result of the first pass.

    With ``outputs`` (the private modules' outputs, kept by :class:`ModuleOutputs`), the second
    pass starts at each private module's output :math:`o^{(m)}` rather than at the loss. Row
    :math:`i` of :math:`o^{(m)}` depends on cell :math:`i` alone, and :math:`L_i` on the other
    cells' rows not at all (the per-cell independence every loss is tested for), so the first
    pass left :math:`\partial L_i/\partial o^{(m)}_i` in row :math:`i` of its gradient, and by
    the chain rule

    .. math:: \sum_i c_i \nabla_{\theta_m} L_i
        = \Big(\frac{\partial o^{(m)}}{\partial \theta_m}\Big)^{\!\top} \big(c_i\,
          \partial L_i/\partial o^{(m)}_i\big)_i ,

    one backward through module :math:`m` alone (autograd runs only the nodes between
    :math:`o^{(m)}` and :math:`\theta_m`). The loss's own graph (the ZINB likelihood over every
    gene) is differentiated once instead of twice. A module called several times in the forward
    contributes one root per call; when some kept output does not have one row per cell, the
    pass starts at the loss as above.
    """
    with warnings.catch_warnings():
        # Opacus's norm hooks are full backward hooks; the first layer's input (the data) needs
        # no gradient, which torch reports on every call.
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        if outputs is not None:
            outputs.forget_gradients()  # only this loss's graph refills them
        per_cell_loss.sum().backward(retain_graph=True)
        coef = gsm.get_clipping_coef().detach()
        for p in params:
            p.grad = None
        gsm.disable_hooks()
        try:
            if outputs is None or not outputs.rows_are_cells(len(coef)):
                torch.autograd.backward((coef * per_cell_loss).sum(), inputs=list(params))
            else:
                _clipped_pass_from_outputs(outputs, coef, set(map(id, params)))
        finally:
            gsm.enable_hooks()
            if outputs is not None:
                outputs.clear()


def _clipped_pass_from_outputs(outputs: ModuleOutputs, coef: torch.Tensor, wanted: set[int]) -> None:
    """Second pass of :func:`ghost_clipped_backward`, one module at a time from its outputs."""
    for module, kept in zip(outputs.modules, outputs.outputs, strict=True):
        own = [p for p in module.parameters() if id(p) in wanted]
        pairs = [(o, o.grad) for o in kept if o.grad is not None]
        if not own or not pairs:
            continue
        roots = [o for o, _ in pairs]
        grads = [g * coef.view(-1, *([1] * (g.dim() - 1))) for _, g in pairs]
        torch.autograd.backward(roots, grad_tensors=grads, inputs=own)


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
