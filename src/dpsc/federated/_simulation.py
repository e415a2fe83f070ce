"""Flower's simulation engine, run quietly: one SuperNode per site, in this process's Ray.

Data reaches the simulated sites in memory: :func:`ray_session` starts the Ray that Flower's
engine then uses, :func:`shared` puts a site's cells in Ray's object store once, and the site
resolves the reference where it runs (:func:`resolve_shared`; Ray maps it read-only, nothing is
written to disk by dpsc).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

#: Flower notices about how dpsc drives Flower, not about the user's run.
INTERNAL_NOTICES = (
    "The `run_simulation` function is deprecated",  # dpsc.tl's notebook path; deployments use flwr run
    "fraction_evaluate is set to 0.0",  # dpsc's strategies evaluate nothing on purpose
)


class _DropInternalNotices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(notice in message for notice in INTERNAL_NOTICES)


def _init_args(n_cpus: int) -> dict[str, Any]:
    # Ray's own INFO lines ("Started a local Ray instance") say nothing about the user's run
    return {
        "num_cpus": n_cpus,
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
    }


@contextlib.contextmanager
def ray_session(n_cpus: int) -> Iterator[None]:
    """Start Ray for one simulation (as Flower's engine would start it) and stop it afterwards.

    Flower's engine uses a Ray that is already running and stops it when the simulation ends;
    starting it here first lets :func:`shared` place the sites' cells in its object store.
    """
    import ray

    started = not ray.is_initialized()
    if started:
        pythonpath = os.pathsep.join(sys.path)  # the actors import what this process imports
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module="ray")
            ray.init(runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}, **_init_args(n_cpus))
    try:
        yield
    finally:
        if started and ray.is_initialized():
            ray.shutdown()


def shared(value: Any) -> Any:
    """Return a reference to ``value`` in Ray's object store (inside :func:`ray_session`)."""
    import ray

    return ray.put(value)


def is_shared(value: Any) -> bool:
    """Whether ``value`` is a :func:`shared` reference (a Ray object reference)."""
    return type(value).__module__.startswith("ray") and hasattr(value, "hex")


def resolve_shared(value: Any) -> Any:
    """Return the object a :func:`shared` reference points to; any other value unchanged."""
    if is_shared(value):
        import ray

        return ray.get(value)
    return value


def simulate(server_app, client_app, n_sites: int, n_cpus: int) -> None:
    """Run ``server_app`` with ``n_sites`` SuperNodes of ``client_app`` in Flower's simulation engine.

    Flower's per-round INFO log and its notices about dpsc's own use of Flower
    (:data:`INTERNAL_NOTICES`) are not shown; its warnings and errors are.
    """
    from flwr.simulation import run_simulation

    flwr_logger = logging.getLogger("flwr")
    level, notices = flwr_logger.level, _DropInternalNotices()
    flwr_logger.setLevel(logging.WARNING)
    flwr_logger.addFilter(notices)
    try:
        with warnings.catch_warnings():
            # Ray's notice that a later Ray will stop hiding GPUs from CPU-only workers
            warnings.filterwarnings("ignore", category=FutureWarning, module="ray")
            run_simulation(
                server_app=server_app,
                client_app=client_app,
                num_supernodes=n_sites,
                backend_config={
                    "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                    "init_args": _init_args(n_cpus),
                },
            )
    finally:
        flwr_logger.setLevel(level)
        flwr_logger.removeFilter(notices)
