"""Module-level Flower apps of the federated private clustering, for a real deployment.

``dpsc federate server`` submits a Flower app whose components are these two objects; every
SuperNode's ClientApp reads its site's own settings from the TOML file its ``node_config``
names (``settings='site.toml'``), never from the server.
"""

from ._apps import make_apps

server_app, client_app = make_apps("pipeline")
