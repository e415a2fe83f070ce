"""Module-level FedSC apps for a real deployment: what ``dpsc federate --task fedsc`` submits and runs.

The server's settings come from the run configuration (``FEDSC``: ``method``, ``rounds``,
``n-genes``, ``noise-multipliers``, …). Each site answers with these apps of its own installation
(:mod:`dpsc.federated._own_app`) and reads its cells and privacy from its own settings file, named
by its ``--node-config "settings='site.toml'"`` (:class:`~dpsc.federated.SiteSettings`), never
from the run configuration.
"""

from ._apps import make_apps

server_app, client_app = make_apps("fedsc")
