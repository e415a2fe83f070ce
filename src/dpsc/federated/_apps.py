"""The one factory of dpsc's Flower apps: the federated clustering and FedSC, by task.

Both tasks share one frame: the Message API with rounds through :mod:`._rounds`, each site's own
:class:`~dpsc.federated.SiteSettings` (its privacy and cells; never the run configuration's), and
the sites' cells in memory in a simulation (the simulation). The module-level apps of a
deployment are built here too: :mod:`dpsc.federated.pipeline_app` (``task="pipeline"``, what
``dpsc federate`` submits and what a site runs from its own installation) and
:mod:`dpsc.federated.app` (``task="fedsc"``).
"""

from __future__ import annotations

from typing import Any

#: What the apps can run: the private clustering's release pipeline, and FedSC's training.
TASKS = ("pipeline", "fedsc")


def make_apps(
    task: str,
    settings: dict[str, Any] | None = None,
    site_settings: dict[int, Any] | None = None,
    sink: dict[str, Any] | None = None,
):
    """Return the ``(ServerApp, ClientApp)`` pair of ``task``.

    Parameters
    ----------
    task
        ``"pipeline"``: the private clustering over sites (``cluster_federated``,
        ``dpsc federate``); ``"fedsc"``: FedSC and its self-supervised peers
        (``fit_federated``).
    settings
        The server's defaults, overridden by Flower's ``run_config``: keys of the task's table in
        ``RUN_CONFIG`` (another key stops the run).
    site_settings
        Each partition id's :class:`~dpsc.federated.SiteSettings` (a simulation); ``None``: each
        SuperNode's ``node_config`` names its settings file (a deployment).
    sink
        A dict the server puts its results in (a simulation in this process).

    Each task's modules load only when its apps are built, so a site's process that serves the
    pipeline never imports FedSC's torch networks.
    """
    if task == "pipeline":  # a site's light path: the clustering's modules only, no torch or Opacus
        from ._pipeline import make_client_app, make_server_app

        return make_server_app(settings, sink), make_client_app(site_settings)
    if task == "fedsc":
        from ._flower import fedsc_apps

        return fedsc_apps(settings or {}, site_settings, sink)
    raise ValueError(f"Unknown task {task!r}; choose one of {TASKS}.")
