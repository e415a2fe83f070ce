"""Federated analysis on Flower: the private clustering over sites (SecAgg+), and FedSC.

Submodules load on first use, so that a site's per-message ClientApp process imports only the
federated clustering's light path (not torch or Opacus).
"""

from ..privacy import lazy_exports

#: What users call (docs/api.md, "Federated learning"): a site and a server, the tasks they deploy by
#: name, the FedSC federation (deployed or simulated) and its settings.
_USER = {
    "METHODS": "._ssl",
    "SSLConfig": "._ssl",
    "Site": "._site",
    "SiteRefusal": "._site",
    "SiteSettings": "._settings",
    "TASKS": "._apps",
    "app_fingerprint": "._own_app",
    "make_apps": "._apps",
    "run_federation": "._flower",
    "run_pipeline_simulation": "._pipeline",
    "run_server": "._deploy",
    "run_site": "._deploy",
    "simulate_federation": "._flower",
}

#: What dpsc's federated tools (``tl.fit_federated``, ``tl.cluster_federated``, ``dpsc federate``) are
#: built from (docs/api.md, "Building a federated tool"): FedSC's network, schedule, plan and record,
#: the pooled gene scaling, a site's record and the deployment's files.
_BUILDING_BLOCKS = {
    "FedSCPrivacy": "._fedsc_site",
    "PER_CELL_METHODS": "._ssl",
    "SSLNet": "._ssl",
    "apply_scaling": "._scaling",
    "dp_schedule": "._ssl",
    "embed": "._ssl",
    "federated_record": "._fedsc_site",
    "federation_plan": "._fedsc_site",
    "fedsc_plan": "._fedsc_site",
    "read_result": "._pipeline",
    "represent_cells": "._flower",
    "require_flwr": "._requires",
    "site_record": "._site",
    "write_site_settings": "._deploy",
}

#: Where each exported name lives; nothing else is exported (FedSC's losses and training steps, the
#: EMA and the sites' other helpers are dpsc's own, in their modules).
_WHERE = {**_USER, **_BUILDING_BLOCKS}
__all__ = sorted(_WHERE, key=str.lower)


__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
