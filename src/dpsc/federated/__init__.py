"""FedSC: federated self-supervised single-cell clustering on Flower."""

from ._ema import calibrate_lambda, divergence, divergence_aware_update, ema_weight
from ._flower import DEFAULTS, make_apps, read_scaling, require_flwr, run_federation, write_client_data
from ._scaling import apply_scaling, pooled_scaling, site_sums
from ._ssl import (
    METHODS,
    PER_CELL_METHODS,
    ClientDP,
    SSLConfig,
    SSLNet,
    byol_loss,
    dp_schedule,
    embed,
    info_nce,
    local_train,
    local_train_private,
    nt_xent,
)

__all__ = [
    "DEFAULTS",
    "METHODS",
    "PER_CELL_METHODS",
    "ClientDP",
    "SSLConfig",
    "SSLNet",
    "apply_scaling",
    "byol_loss",
    "calibrate_lambda",
    "divergence",
    "divergence_aware_update",
    "dp_schedule",
    "ema_weight",
    "embed",
    "info_nce",
    "local_train",
    "local_train_private",
    "make_apps",
    "nt_xent",
    "pooled_scaling",
    "read_scaling",
    "require_flwr",
    "run_federation",
    "site_sums",
    "write_client_data",
]
