"""Docs: every public pp/tl docstring is filled (a typo fails at import); benchmark tables come from rows."""

import pytest

import dpsc
from dpsc._docs import SHARED, doc_params

PUBLIC = [
    dpsc.tl.fit,
    dpsc.tl.annotate,
    dpsc.tl.private_regression,
    dpsc.tl.fit_federated,
    dpsc.tl.kmeans,
    dpsc.pp.pca,
]


@pytest.mark.parametrize("func", PUBLIC, ids=lambda f: f.__name__)
def test_public_docstrings_have_no_placeholder_left(func):
    assert "{doc_" not in func.__doc__
    if "copy" in func.__code__.co_varnames[: func.__code__.co_argcount + func.__code__.co_kwonlyargcount]:
        assert "\n    copy\n" in func.__doc__


def test_shared_text_is_indented_under_its_parameter():
    def f(copy=False):
        """Do it.

        Parameters
        ----------
        copy
            {doc_copy}
        """

    doc_params(f)
    first_line = SHARED["doc_copy"].splitlines()[0]
    assert f"\n            {first_line}\n" in f.__doc__
    assert all(line.startswith("            ") for line in f.__doc__.splitlines()[5:7])


def test_unknown_placeholder_fails_at_decoration():
    def f():
        """Do it.

        {doc_no_such_text}
        """

    with pytest.raises(KeyError, match="doc_no_such_text"):
        doc_params(f)


def test_other_braces_are_left_alone():
    def f():
        """Writes ``obs[f"{key_added}_confidence"]``."""

    assert "{key_added}" in doc_params(f).__doc__


def _benchmark_tables():
    """The docs build's table registry (``docs/benchmark_tables.py``), loaded from its file."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "docs" / "benchmark_tables.py"
    spec = importlib.util.spec_from_file_location("benchmark_tables", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_benchmark_table_is_built_from_committed_rows_and_shown():
    """Each table the benchmarks page includes is built from rows in the tree, and each is shown."""
    import re

    tables = _benchmark_tables()
    page = (tables.ROOT / "docs" / "benchmarks.md").read_text()
    included = set(re.findall(r"\{include\} _generated/benchmarks/([a-z_]+)\.md", page))
    shown = set(re.findall(r"\]\(_generated/benchmarks/([a-z_]+\.png)\)", page))
    assert included == set(tables.TABLES)
    assert shown == set(tables.FIGURES)
    for command in [*tables.TABLES.values(), *tables.FIGURES.values()]:
        script, *arguments = command.split()
        assert (tables.ROOT / "benchmarks" / script).is_file(), command
        for rows in (a.replace("R/", "benchmarks/results/", 1) for a in arguments if a.startswith("R/")):
            assert (tables.ROOT / rows).is_file(), command
    # the one committed table is the step timing, whose printed table is its record (it has no rows)
    committed = {path.name for path in (tables.ROOT / "benchmarks" / "results").glob("*.md")}
    assert committed == {"step_timing.md"}
