"""Lazy exports of a package (PEP 562): each name imported from its submodule on first use.

dpsc's packages keep ``import dpsc`` and a federated site's per-message process light (no torch,
no Opacus until a name that needs them is used); one helper makes every such package face.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(
    package: str, where: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return a package's ``__getattr__`` and ``__dir__`` that load each exported name on first use.

    ``where`` maps each exported name to the relative module that defines it (``".ledger"``); a
    name mapped to ``"." + name`` is that submodule itself (``dpsc.tl``). The value is cached in
    the package's ``namespace`` (its ``globals()``), so the import runs once.
    """

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = import_module(where[name], package)
        value = module if where[name] == f".{name}" else getattr(module, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *where])

    return __getattr__, __dir__
