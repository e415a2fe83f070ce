"""dpsc: differentially private single-cell analysis, an scverse plugin."""

from importlib.metadata import PackageNotFoundError, version

from . import audit, datasets, federated, fm, linear, model, module, optim, pl, pp, privacy, tl, train

try:
    __version__ = version("dpsc")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "audit",
    "datasets",
    "federated",
    "fm",
    "linear",
    "model",
    "module",
    "optim",
    "pl",
    "pp",
    "privacy",
    "tl",
    "train",
]
