"""The one way dpsc's servers talk to their sites: a round of Flower messages, plain or through SecAgg+.

Both federated methods (the private clustering of :mod:`._pipeline` and FedSC's k-means and gene
statistics in :mod:`._flower`) run as Message-API apps: a ``ServerApp`` whose ``main`` sends
rounds and a ``ClientApp`` whose handlers answer them. A round is:

- :func:`send_to_sites`: wait until enough sites are connected, send one message to each, collect
  the replies and the sites' errors (a refusal arrives as an error whose reason is the site's own
  words);
- :func:`plain_round`: a request of arrays and scalars to every site, each reply a list of arrays
  (the clustering's releases when each site's vector carries the full noise);
- :func:`secure_round`: the same request through Flower's SecAgg+ workflow
  (:func:`~._secagg.secagg_workflow`), the adapter to the only SecAgg+ implementation Flower has,
  which speaks the legacy fit protocol: the server learns only the sum over the sites.

Requests and replies use Flower's fit layout (:func:`request_content`, :func:`reply_content`) in
both modes, the layout SecAgg+ masks, so a site has one handler for both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._secagg import secagg_workflow

POLL_S = 0.2  # how often the connected sites are counted while waiting


@dataclass
class RoundResult:
    """What one round brought back.

    ``replies``: each answering site's arrays; ``failures``: the error reason of each site that
    answered with an error; ``sent``: the sites the round went to; ``aggregated``: whether the
    round got as far as summing (False when SecAgg+ halted in one of its stages).
    """

    replies: list[list[np.ndarray]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    sent: int = 0
    aggregated: bool = False


def connected_sites(grid, n_wait: int, timeout: float | None) -> list[int]:
    """Return the connected sites' node ids once ``n_wait`` are connected (or ``timeout`` s have passed)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while len(nodes := list(grid.get_node_ids())) < n_wait:
        if deadline is not None and time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    return nodes


def send_to_sites(grid, content, message_type: str, n_wait: int, timeout: float | None):
    """Send ``content`` to every connected site (after :func:`connected_sites`); return replies, errors, sent.

    ``content`` is a Flower ``RecordDict``; the replies are Flower ``Message`` objects without
    error, the errors their ``reason`` strings.
    """
    from flwr.app import Message

    nodes = connected_sites(grid, n_wait, timeout)
    messages = [Message(content=content, dst_node_id=node, message_type=message_type) for node in nodes]
    answers = list(grid.send_and_receive(messages, timeout=timeout))
    replies = [answer for answer in answers if not answer.has_error()]
    failures = [str(answer.error.reason) for answer in answers if answer.has_error()]
    return replies, failures, len(nodes)


def request_content(config: dict[str, Any], arrays: list[np.ndarray]):
    """Return a request in Flower's fit layout: the arrays as parameters, the scalars as its config."""
    from flwr.common import FitIns, ndarrays_to_parameters
    from flwr.compat.common import recorddict_compat as compat

    return compat.fitins_to_recorddict(FitIns(ndarrays_to_parameters(arrays), dict(config)), keep_input=True)


def read_request(content) -> tuple[list[np.ndarray], dict[str, Any]]:
    """Return the arrays and the config of a request (:func:`request_content`)."""
    from flwr.common import parameters_to_ndarrays
    from flwr.compat.common import recorddict_compat as compat

    fitins = compat.recorddict_to_fitins(content, keep_input=True)
    return parameters_to_ndarrays(fitins.parameters), dict(fitins.config)


def reply_content(arrays: list[np.ndarray]):
    """Return a site's reply in Flower's fit layout (one example, so SecAgg+'s weighting is 1)."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
    from flwr.compat.common import recorddict_compat as compat

    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), 1, {})
    return compat.fitres_to_recorddict(fitres, keep_input=False)


def read_reply(content) -> list[np.ndarray]:
    """Return the arrays of a site's reply (:func:`reply_content`)."""
    from flwr.common import parameters_to_ndarrays
    from flwr.compat.common import recorddict_compat as compat

    return parameters_to_ndarrays(compat.recorddict_to_fitres(content, keep_input=False).parameters)


def plain_round(
    grid, config: dict[str, Any], arrays: list[np.ndarray], n_wait: int, timeout: float | None
) -> RoundResult:
    """Send one request to every connected site; each site's reply comes back as it was sent."""
    replies, failures, sent = send_to_sites(grid, request_content(config, arrays), "train", n_wait, timeout)
    return RoundResult([read_reply(reply.content) for reply in replies], failures, sent, aggregated=True)


def secure_round(
    grid,
    context,
    config: dict[str, Any],
    arrays: list[np.ndarray],
    n_wait: int,
    timeout: float | None,
    threshold: int,
) -> RoundResult:
    """Send one request through SecAgg+; the one reply is the masked vectors' mean (:mod:`._secagg`).

    Flower's SecAgg+ workflow runs inside its legacy fit round (a ``LegacyContext`` with a strategy
    that hands out the request and keeps the aggregate): this function is the adapter, and the
    only place dpsc uses that protocol.
    """
    from flwr.server import ServerConfig
    from flwr.server.compat import LegacyContext
    from flwr.server.workflow import DefaultWorkflow

    strategy = _sum_strategy(config, arrays, n_wait, timeout)
    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=1), strategy=strategy)
    DefaultWorkflow(fit_workflow=secagg_workflow(threshold, timeout))(grid, legacy)
    return strategy.result


def _sum_strategy(config: dict[str, Any], arrays: list[np.ndarray], n_wait: int, timeout: float | None):
    """Return a one-round Flower strategy for :func:`secure_round`: it sends the request, keeps the sum.

    It first waits (up to ``timeout`` s) until ``n_wait`` sites are connected; ``num_available``
    asks the SuperLink for its node list (Flower's compat layer refreshes it on that call,
    otherwise only every 5 s), so it is polled rather than ``wait_for``.
    """
    from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import Strategy

    class SumStrategy(Strategy):
        def __init__(self) -> None:
            self.result = RoundResult()

        def initialize_parameters(self, client_manager):
            return ndarrays_to_parameters(arrays)

        def configure_fit(self, server_round, parameters, client_manager):
            deadline = None if timeout is None else time.monotonic() + timeout
            while client_manager.num_available() < n_wait:
                if deadline is not None and time.monotonic() >= deadline:
                    break
                time.sleep(POLL_S)
            clients = list(client_manager.all().values())
            self.result.sent = len(clients)
            return [(client, FitIns(parameters, dict(config))) for client in clients]

        def aggregate_fit(self, server_round, results, failures):
            self.result.aggregated = True
            self.result.replies = [parameters_to_ndarrays(res.parameters) for _, res in results]
            self.result.failures = [
                str(f if isinstance(f, BaseException) else f[1].status.message) for f in failures
            ]
            return None, {}

        def configure_evaluate(self, server_round, parameters, client_manager):
            return []

        def aggregate_evaluate(self, server_round, results, failures):
            return None, {}

        def evaluate(self, server_round, parameters):
            return None

    return SumStrategy()
