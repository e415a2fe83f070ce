"""dpsc's federated tasks, by name: each one's Flower apps, run configuration and deployment.

Both tasks share one frame: the Message API with rounds through :mod:`._rounds`, each site's own
:class:`~dpsc.federated.SiteSettings` (its privacy and cells; never the run configuration's), one
site guard (:class:`~dpsc.federated._guard.SiteGuard`), and the sites' cells in memory in a
simulation. A :class:`FederatedTask` names what a deployment of the task needs: the module whose
``server_app`` / ``client_app`` a site runs from its own installation (:mod:`._own_app`), the
run-configuration table the server's settings are checked against (:mod:`._run_config`), and the
file the server writes last. ``dpsc federate server --task NAME`` and ``dpsc federate site --task
NAME`` deploy a task by its name (:func:`~dpsc.federated.run_server`,
:func:`~dpsc.federated.run_site`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._run_config import RUN_CONFIG

#: The file every task's server writes last in its ``out-dir``: the run's summary (JSON).
SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class FederatedTask:
    """One federated task that ``dpsc federate`` deploys by name.

    Attributes
    ----------
    name
        The task's name (``--task``; the key of its run-configuration table).
    app_module
        The module whose ``server_app`` and ``client_app`` a deployment runs: the server submits a
        bundle that names it, and each site answers with the one of its own installation.
    description
        What the task computes, in a user's words (``dpsc federate --help``).
    check
        Refuses, before anything starts, a run configuration the task cannot run (``ValueError``).
    builder
        ``"module:function"`` that builds the task's ``(ServerApp, ClientApp)`` pair from the
        server's settings, the sites' settings and a sink (:func:`make_apps`); imported only then,
        so a site that serves the clustering never imports FedSC's torch networks.
    """

    name: str
    app_module: str
    description: str
    check: Callable[[dict[str, Any], int], None]
    builder: str

    @property
    def run_config(self) -> dict[str, Any]:
        """The task's run-configuration keys and their defaults."""
        return RUN_CONFIG[self.name]

    def client_app(self) -> Any:
        """Return this installation's ClientApp of the task (never code that a server sent)."""
        return importlib.import_module(self.app_module).client_app

    def apps(self, settings: dict[str, Any] | None, site_settings: dict[int, Any] | None, sink: Any) -> tuple:
        """Return the task's ``(ServerApp, ClientApp)`` pair, built by its own modules only."""
        module, function = self.builder.split(":")
        return getattr(importlib.import_module(module), function)(settings, site_settings, sink)


def _check_pipeline(settings: dict[str, Any], n_sites: int) -> None:
    if settings["mode"] == "secure" and n_sites < 2:
        raise ValueError(
            f"Secure aggregation needs at least 2 sites (got {n_sites}): with one site, run mode='plain' "
            "(--mode plain), where the site adds its full noise, or add sites."
        )


def _check_fedsc(settings: dict[str, Any], n_sites: int) -> None:
    from ._flower import check_settings

    if int(settings["n-genes"]) < 1:
        raise ValueError(
            "FedSC's server builds the network before any site answers: give the number of genes every "
            "site holds (n_genes=…, --n-vars on the command line)."
        )
    check_settings(settings)


#: Every federated task, by name: ``"pipeline"`` (the private clustering over sites, as
#: ``tl.cluster_federated`` runs it) and ``"fedsc"`` (FedSC, as ``tl.fit_federated`` runs it), each a
#: ``FederatedTask`` (its apps' module, run configuration and check) that
#: ``dpsc federate server/site --task NAME`` deploys.
TASKS: dict[str, FederatedTask] = {
    task.name: task
    for task in (
        FederatedTask(
            "pipeline",
            "dpsc.federated.pipeline_app",
            "the private clustering over sites (SecAgg+), as tl.cluster_federated runs it",
            _check_pipeline,
            "dpsc.federated._pipeline:pipeline_apps",
        ),
        FederatedTask(
            "fedsc",
            "dpsc.federated.app",
            "FedSC's self-supervised model and its federated DP k-means, as tl.fit_federated runs it",
            _check_fedsc,
            "dpsc.federated._flower:fedsc_apps",
        ),
    )
}


def federated_task(name: str, flag: str = "task") -> FederatedTask:
    """Return the task ``name``; an unknown name raises ``ValueError`` naming the tasks there are."""
    if name not in TASKS:
        raise ValueError(f"Unknown federated task {name!r} ({flag}); choose one of {', '.join(TASKS)}.")
    return TASKS[name]


def make_apps(
    task: str,
    settings: dict[str, Any] | None = None,
    site_settings: dict[int, Any] | None = None,
    sink: dict[str, Any] | None = None,
):
    """Return the ``(ServerApp, ClientApp)`` pair of ``task``.

    Each task's modules load only when its apps are built (:attr:`FederatedTask.builder`), so a
    site's process that serves the pipeline never imports FedSC's torch networks.

    Parameters
    ----------
    task
        ``"pipeline"``: the private clustering over sites (``cluster_federated``,
        ``dpsc federate``); ``"fedsc"``: FedSC and its self-supervised peers
        (``fit_federated``, ``dpsc federate --task fedsc``).
    settings
        The server's defaults, overridden by Flower's ``run_config``: keys of the task's table in
        ``RUN_CONFIG`` (another key stops the run).
    site_settings
        Each partition id's :class:`~dpsc.federated.SiteSettings` (a simulation); ``None``: each
        SuperNode's ``node_config`` names its settings file (a deployment).
    sink
        A dict the server puts its results in (a simulation in this process).
    """
    return federated_task(task).apps(settings, site_settings, sink)
