"""Plain multilayer perceptrons (no BatchNorm: it couples the cells of a batch)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from torch import nn


def mlp(dims: Sequence[int], *, last_activation: bool) -> nn.Sequential:
    """Build ``Linear → ReLU → … → Linear`` through ``dims``.

    Parameters
    ----------
    dims
        Layer widths, input first, e.g. ``(2000, 256, 64, 32)``.
    last_activation
        Whether the last linear layer is followed by a ReLU.

    Returns
    -------
    nn.Sequential
        Only ``nn.Linear`` and ``nn.ReLU`` layers, so that every parameter belongs to a layer
        whose per-sample gradient norm Opacus computes without materialising it.
    """
    layers: list[nn.Module] = []
    for i, (d_in, d_out) in enumerate(itertools.pairwise(dims)):
        layers.append(nn.Linear(d_in, d_out))
        if i < len(dims) - 2 or last_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)
