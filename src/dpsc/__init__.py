"""dpsc: differentially private single-cell analysis, an scverse plugin.

Submodules load on first use (``dpsc.tl``, ``dpsc.pl``, …), so ``import dpsc`` and the
command line's ``--help`` stay fast; torch and scvi-tools are imported only when needed.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

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


def __getattr__(name: str) -> Any:
    """Import the submodule ``dpsc.<name>`` on first access (PEP 562)."""
    if name in __all__:
        module = import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'dpsc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
