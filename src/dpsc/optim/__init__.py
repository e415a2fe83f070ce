"""Optimizers: DP-SignSGD / DP-SignAdam and the name registry used by the training plans."""

from ._factory import DEFAULT_PRIVATE_LRS, OPTIMIZERS, DPSignAdam, DPSignSGD, check_optimizer, make_optimizer
from ._sign import SignAdam, SignSGD

__all__ = [
    "DEFAULT_PRIVATE_LRS",
    "OPTIMIZERS",
    "DPSignAdam",
    "DPSignSGD",
    "SignAdam",
    "SignSGD",
    "check_optimizer",
    "make_optimizer",
]
