"""Flower's simulation engine, run quietly: one SuperNode per site, in this process's Ray."""

from __future__ import annotations

import logging
import warnings

#: Flower notices about how dpsc drives Flower, not about the user's run.
INTERNAL_NOTICES = (
    "The `run_simulation` function is deprecated",  # dpsc.tl's notebook path; deployments use flwr run
    "fraction_evaluate is set to 0.0",  # dpsc's strategies evaluate nothing on purpose
)


class _DropInternalNotices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(notice in message for notice in INTERNAL_NOTICES)


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
                    "init_args": {"num_cpus": n_cpus, "include_dashboard": False, "log_to_driver": False},
                },
            )
    finally:
        flwr_logger.setLevel(level)
        flwr_logger.removeFilter(notices)
