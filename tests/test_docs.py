"""Shared parameter docs: every public pp/tl docstring is filled, and a typo fails at import."""

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
