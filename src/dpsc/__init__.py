"""dpsc: differentially private single-cell analysis, an scverse plugin.

Submodules load on first use (``dpsc.tl``, ``dpsc.pl``, …), so ``import dpsc`` and the
command line's ``--help`` stay fast; torch and scvi-tools are imported only when needed.
"""

from importlib.metadata import PackageNotFoundError, version

from .privacy import lazy_exports

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
    "methods",
    "model",
    "module",
    "optim",
    "pl",
    "pp",
    "privacy",
    "tl",
    "train",
]


__getattr__, __dir__ = lazy_exports(__name__, {name: f".{name}" for name in __all__}, globals())
