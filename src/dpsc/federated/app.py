"""Module-level FedSC apps for a real deployment: ``flwr run`` with ``dpsc.federated.app:server_app``.

Settings come from the Flower run config (``[tool.flwr.app.config]`` of the launching project):
``method``, ``rounds``, ``local-epochs``, ``alpha``, ``seed``, ``data-dir`` (each SuperNode reads
``client_{partition-id}.npy`` there) and ``out-dir``.
"""

from ._apps import make_apps

server_app, client_app = make_apps("fedsc")
