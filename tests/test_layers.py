"""The package's layering, checked on its source: what may import what (the redesign's rules)."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
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


def test_no_package_reaches_into_another_packages_private_modules_or_names():
    """A sibling is used through its face: its ``__init__`` or, for ``dpsc.methods`` (one analysis
    per module), its public modules; never a private module or a private name of another package."""
    reached = []
    for path in ROOT.rglob("*.py"):
        here = _where(path)
        for line, name in _imports(path):
            parts = name.split(".")
            if len(parts) < 3 or parts[0] != "dpsc" or parts[1] == here:
                continue
            if parts[1] in SUBPACKAGES and any(part.startswith("_") for part in parts[2:]):
                reached.append(f"{path.relative_to(ROOT)}:{line} {name}")
    assert reached == []


def test_tests_and_benchmarks_use_the_faces_of_methods():
    """Tests and benchmarks import ``dpsc.methods`` as the other packages may (no private module,
    no private name), and benchmarks ``dpsc.privacy`` too; the privacy tests alone patch its seams
    (the OS entropy, the Poisson draw) to watch them."""
    packages = {"tests": "methods", "benchmarks": "methods|privacy"}
    reached = []
    for folder, names in packages.items():
        private = re.compile(
            rf"dpsc\.(?:{names})(?:\.\w+)*\._\w+|from dpsc\.(?:{names})(?:\.\w+)* import \(?\s*_\w+"
        )
        for path in (Path(__file__).parents[1] / folder).rglob("*.py"):
            reached += [f"{folder}/{path.name}: {m.group(0)}" for m in private.finditer(path.read_text())]
    assert reached == []


def _module_graph() -> dict[str, set[str]]:
    """Module → the dpsc modules it imports (any import, at any depth, ``TYPE_CHECKING`` ones too)."""
    modules = {
        ".".join(path.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__"): path
        for path in ROOT.rglob("*.py")
    }
    graph = {}
    for module, path in modules.items():
        targets = set()
        for _, name in _imports(path):
            while name and name not in modules:  # ``from pkg import name`` names pkg.name
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_anywhere():
    graph = _module_graph()
    assert len(graph) > 100 and "dpsc.privacy" in graph["dpsc.methods.cluster_plan"]
    assert _circles(graph) == []
    # the check itself finds a circle when there is one
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_privacy_is_the_ground_floor_and_methods_stand_on_it_alone():
    """``privacy/`` imports no other dpsc package; ``methods/`` imports only ``privacy``'s face and
    the row blocks, and no AnnData at module level (the tools read and write it)."""
    graph = _module_graph()
    privacy_out = {
        target
        for module, targets in graph.items()
        if module.startswith("dpsc.privacy")
        for target in targets
        if not target.startswith("dpsc.privacy")
    }
    assert privacy_out == set()
    methods_out = {
        target
        for module, targets in graph.items()
        if module.startswith("dpsc.methods")
        for target in targets
        if not target.startswith("dpsc.methods")
    }
    assert methods_out - {"dpsc"} <= {"dpsc.privacy", "dpsc._blocks"}  # ``from .. import _blocks``
    anndata_at_top = [
        path.name
        for path in (ROOT / "methods").glob("*.py")
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.Import | ast.ImportFrom)
        and "anndata" in {getattr(node, "module", None), *(a.name for a in node.names)}
    ]
    assert anndata_at_top == []


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


def _code_lines(source: list[str], function: ast.FunctionDef) -> int:
    """Lines of a function's body that hold code: no docstring, blank line or comment."""
    body = function.body
    docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    start = body[0].end_lineno + 1 if docstring else body[0].lineno
    return sum(
        1
        for line in source[start - 1 : function.end_lineno]
        if line.strip() and not line.strip().startswith("#")
    )


def test_every_public_tool_is_thin():
    """Each public ``pp``/``tl``/``pl`` function validates, calls its method, spends and stores:
    at most 60 code lines; the steps of a longer recipe are named functions of their own."""
    long = []
    for path in sorted(ROOT.rglob("*.py")):
        if _where(path) not in ("pp", "tl", "pl"):
            continue
        source = path.read_text()
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                lines = _code_lines(source.splitlines(), node)
                if lines > 60:
                    long.append(f"{path.relative_to(ROOT)}:{node.name} ({lines} lines)")
    assert long == []


def test_public_docstrings_point_at_no_private_module():
    """What a user reads (``help`` or the API page) of a public name links only to public names."""
    private = re.compile(r"dpsc(?:\.\w+)*\._[a-z]\w*|(?<![\w.])~?\._[a-z]\w*")
    found = []
    for package in ("tl", "pp", "pl", "privacy", "datasets", "model", "federated", "audit", "methods"):
        module = importlib.import_module(f"dpsc.{package}")
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            members = vars(obj).items() if inspect.isclass(obj) else ()
            docs = [(name, obj)] + [(f"{name}.{m}", v) for m, v in members if not m.startswith("_")]
            for where, value in docs:
                text = inspect.getdoc(value) or ""
                found += [f"dpsc.{package}.{where}: {m}" for m in private.findall(text)]
    assert found == []
