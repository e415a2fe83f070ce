"""The package's layering, checked on its source: what may import what (the redesign's rules)."""

from __future__ import annotations

import ast
from pathlib import Path

import dpsc

ROOT = Path(dpsc.__file__).parent
SUBPACKAGES = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every ``from … import`` of a module, as the absolute dotted module it names."""
    package = path.relative_to(ROOT.parent).with_suffix("").parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            found += [(node.lineno, target)] + [(node.lineno, f"{target}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return found


def _where(path: Path) -> str:
    parts = path.relative_to(ROOT).parts
    return parts[0] if len(parts) > 1 else ""


def test_nothing_below_tl_imports_tl():
    upward = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in ROOT.rglob("*.py")
        if _where(path) in SUBPACKAGES - {"tl"}
        for line, name in _imports(path)
        if name.startswith("dpsc.tl")
    ]
    assert upward == []


def test_no_package_reaches_into_another_packages_private_modules_except_privacy():
    """A sibling is used through its ``__init__``; only dpsc.privacy's mechanism modules are shared."""
    reached = []
    for path in ROOT.rglob("*.py"):
        here = _where(path)
        for line, name in _imports(path):
            parts = name.split(".")
            if len(parts) < 3 or parts[0] != "dpsc" or parts[1] in (here, "privacy"):
                continue
            if parts[1] in SUBPACKAGES and parts[2].startswith("_"):
                reached.append(f"{path.relative_to(ROOT)}:{line} {name}")
    assert reached == []


def test_tools_write_no_temporary_files():
    """``pp``/``tl`` are thin tools: no tool passes data through files (the federated simulation
    keeps the sites' cells and the server's result in memory)."""
    writes = ("tempfile", "write_h5ad", "np.save", "savez", "mkdtemp", "write_text")
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for folder in ("pp", "tl")
        for path in (ROOT / folder).rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(word in line for word in writes)
    ]
    assert found == []


def test_one_federated_frame():
    """Both federated methods are Message-API apps that talk to their sites through ``_rounds``: no
    legacy client (``client_fn``, ``NumPyClient``), and Flower's legacy fit round only inside the
    SecAgg+ adapter."""
    legacy = ("client_fn", "NumPyClient", "LegacyContext", "DefaultWorkflow", "send_and_receive")
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in (ROOT / "federated").rglob("*.py")
        if path.name != "_rounds.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(word in line for word in legacy)
    ]
    assert found == []
