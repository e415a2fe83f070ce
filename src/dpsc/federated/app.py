"""Module-level FedSC apps for a real deployment: ``flwr run`` with ``dpsc.federated.app:server_app``.

Settings come from the Flower run config (``[tool.flwr.app.config]`` of the launching project):
``method``, ``rounds``, ``local-epochs``, ``alpha``, ``seed``, ``n-sites``, ``n-genes`` and
``out-dir``. Each SuperNode reads its cells and its privacy from its own settings file, named by
its ``--node-config "settings='site.toml'"`` (:class:`~dpsc.federated.SiteSettings`: ``data`` is its
``.h5ad`` of raw counts), never from the run configuration.
"""

from ._apps import make_apps

server_app, client_app = make_apps("fedsc")
