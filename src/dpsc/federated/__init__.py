"""Federated analysis on Flower: the private clustering over sites (SecAgg+), and FedSC.

Submodules load on first use, so that a site's per-message ClientApp process imports only the
federated clustering's light path (not torch or Opacus).
"""

from importlib import import_module
from typing import Any

_WHERE = {
    "calibrate_lambda": "._ema",
    "divergence": "._ema",
    "divergence_aware_update": "._ema",
    "ema_weight": "._ema",
    "DEFAULTS": "._flower",
    "make_apps": "._apps",
    "read_scaling": "._flower",
    "require_flwr": "._requires",
    "run_federation": "._flower",
    "simulate_federation": "._flower",
    "write_client_data": "._flower",
    "apply_scaling": "._scaling",
    "pooled_scaling": "._scaling",
    "site_sums": "._scaling",
    "METHODS": "._ssl",
    "PER_CELL_METHODS": "._ssl",
    "ClientDP": "._ssl",
    "SSLConfig": "._ssl",
    "SSLNet": "._ssl",
    "byol_loss": "._ssl",
    "dp_schedule": "._ssl",
    "embed": "._ssl",
    "info_nce": "._ssl",
    "local_train": "._ssl",
    "local_train_private": "._ssl",
    "nt_xent": "._ssl",
    "Site": "._site",
    "SiteRefusal": "._site",
    "SiteSettings": "._settings",
    "run_pipeline_simulation": "._pipeline",
    "site_record": "._site",
    "KMEANS_STEPS": "._fedsc_site",
    "FedSCPrivacy": "._fedsc_site",
    "federated_record": "._fedsc_site",
    "federation_plan": "._fedsc_site",
    "fedsc_noise": "._fedsc_site",
    "run_server": "._deploy",
    "write_site_settings": "._deploy",
    "read_result": "._pipeline",
    "run_site": "._deploy",
    "app_fingerprint": "._own_app",
}

#: What users call (each documented in docs/api.md): a site and a server, the FedSC federation
#: (deployed or simulated) and its settings. The other names of ``_WHERE`` (FedSC's network, losses,
#: local training, EMA and scaling steps) serve dpsc's own packages, tests and benchmarks:
#: importable, but not part of the API and free to change.
__all__ = [
    "METHODS",
    "SSLConfig",
    "Site",
    "SiteRefusal",
    "SiteSettings",
    "app_fingerprint",
    "make_apps",
    "run_federation",
    "run_pipeline_simulation",
    "run_server",
    "run_site",
    "simulate_federation",
]


def __getattr__(name: str) -> Any:
    """Import the submodule that defines ``name`` on first access (PEP 562)."""
    if name in _WHERE:
        value = getattr(import_module(_WHERE[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dpsc.federated' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
