"""Torch modules of dpsc: networks, the Student-t clustering layer, per-cell losses."""

from ._clustering import CentroidDistance
from ._dcan import DCANModule
from ._losses import (
    dec_kl_per_cell,
    gaussian_nll_per_cell,
    instance_loss_per_cell,
    per_cell_target,
    separation_loss,
    student_t_assignment,
    zinb_nll_per_cell,
)

__all__ = [
    "CentroidDistance",
    "DCANModule",
    "dec_kl_per_cell",
    "gaussian_nll_per_cell",
    "instance_loss_per_cell",
    "per_cell_target",
    "separation_loss",
    "student_t_assignment",
    "zinb_nll_per_cell",
]
