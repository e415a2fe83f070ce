"""A server's run configuration, one table per task: the keys each task takes and their defaults.

Flower gives every ServerApp (and FedSC's ClientApp) ``context.run_config``: the app's
configuration overridden by ``flwr run --run-config``. dpsc's apps read it through
:func:`run_settings`, over their task's table and the settings the apps were built with
(:func:`dpsc.federated.make_apps`), so a key the task does not take (a typo, or another task's
key) stops the run with the keys it does take, instead of running on a default. A site's own
privacy and cells are never here: they are its :class:`~dpsc.federated.SiteSettings`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The private clustering's server (``task="pipeline"``: ``dpsc federate``, ``tl.cluster_federated``).
PIPELINE: dict[str, Any] = {
    "task": "pipeline",
    "n-sites": 2,
    "mode": "secure",
    "threshold": 0,  # 0: every site (the central mechanism's noise exactly)
    "epsilon": 8.0,  # -1: no noise
    "delta": 1e-5,
    "n-clusters": 8,
    "n-vars": 0,  # 0: asked from the sites
    "n-obs": 0,  # the sites' cells in all (public; chooses the genes the PCA reads); 0: asked from the sites
    "random-state": 0,
    "markers": 0,  # 1: the plan ends with the release of each cluster's marker statistics
    "donor-unit": 0,  # 1: every site's ε is per donor with all their cells (sites with a donor_key)
    "reference-fingerprint": "",  # a public reference's sha256: every site computes its basis from its copy
    "out-dir": "",
    "timeout": 300.0,
}
#: FedSC and its self-supervised peers (``task="fedsc"``: ``tl.fit_federated``).
FEDSC: dict[str, Any] = {
    "method": "fedsc",
    "rounds": 250,
    "local-epochs": 1,
    "alpha": 0.7,
    "seed": 0,
    "out-dir": "",  # empty: the results go to the caller's sink (a simulation in memory)
    "n-sites": 0,  # the number of sites and of genes (each site's cells come from its own settings)
    "n-genes": 0,
    "lr": 0.032,
    "batch-size": 128,
    "mask-rate": 0.2,
    # one "query" round first: sites send per-gene sums, all z-score with the pooled statistics
    # (off for the bare apps; dpsc.tl.fit_federated turns it on unless the sites train with DP)
    "scale-genes": False,
    # client-level DP (off when "noise-multipliers" is empty): JSON list of σ per partition-id
    "noise-multipliers": "",
    "max-grad-norm": 1.0,
    # -1: every site seeds its DP noise and sampling from OS entropy (the server never sets it);
    # >= 0: an opt-in for tests and benchmarks, the guarantee then does not hold against its holder
    "noise-seed": -1,
    # the final federated DP k-means: JSON list of each site's noise multiplier, and k
    "kmeans-noise-multipliers": "",
    "n-clusters": 8,
    "dp-optimizer": "sgd",
    "dp-lr": 0.032,
}
#: Each task's keys and defaults.
RUN_CONFIG: dict[str, dict[str, Any]] = {"pipeline": PIPELINE, "fedsc": FEDSC}


def run_settings(task: str, *layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return ``task``'s defaults overridden by each of ``layers`` in turn (``None`` layers skipped).

    Raises ``ValueError`` naming the keys ``task`` does not take, and those it does.
    """
    defaults = RUN_CONFIG[task]
    settings = dict(defaults)
    for layer in layers:
        given = dict(layer or {})
        unknown = sorted(set(given) - set(defaults))
        if unknown:
            raise ValueError(
                f"The {task!r} run configuration has no setting {', '.join(unknown)}; it takes "
                f"{', '.join(sorted(defaults))} (flwr run --run-config, or make_apps({task!r}, settings))."
            )
        settings.update(given)
    return settings
