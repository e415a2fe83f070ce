"""Torch modules of dpsc: networks, the Student-t clustering layer, per-cell losses."""

from ._clustering import CentroidDistance
from ._dcan import DEFAULT_LATENT_SCALE, DCANModule, clean_input
from ._dcan import input_representation as input_representation  # for sibling packages
from ._dcan import mask_views as mask_views
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
    "DEFAULT_LATENT_SCALE",
    "CentroidDistance",
    "DCANModule",
    "clean_input",
    "dec_kl_per_cell",
    "gaussian_nll_per_cell",
    "instance_loss_per_cell",
    "per_cell_target",
    "separation_loss",
    "student_t_assignment",
    "zinb_nll_per_cell",
]
