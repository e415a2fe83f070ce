"""Parameter descriptions shared by the ``pp`` and ``tl`` functions (scanpy's ``_doc_params`` idea).

A docstring puts a shared description under its parameter's name as ``{doc_copy}`` on a line of
its own; :func:`doc_params` replaces exactly those placeholders, so other braces in a docstring
(``f"{key_added}_…"``, math) are left alone. One text per parameter keeps the return rule and
the privacy caveats the same in every function that takes them.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

SHARED = {
    "doc_copy": """\
Leave ``adata`` untouched and return an annotated copy. ``adata``'s privacy ledger still
records the call: its cells were read.""",
    "doc_return_model": """\
Also return what was trained: the model alone, or ``(copy, model)`` with ``copy=True``.""",
    "doc_noise_seed": """\
For tests and benchmarks only: makes the DP noise and sampling repeatable. The record then
says that the guarantee does not hold against anyone who knows the seed. ``None`` (default):
the noise comes from the operating system's secure source and cannot be replayed.""",
    "doc_donor_key": """\
``obs`` column naming each cell's donor (patient, mouse): the guarantee is then per donor, with
respect to adding or removing one donor with all of their cells. Each cell's contribution to the
release is weighted by 1/(its donor's number of cells), so a donor's whole contribution keeps the
release's per-cell bound and the same σ gives the same ε per donor (:class:`dpsc.privacy.PrivacyUnit`).
``None``: per cell (a note says once when ``obs`` has a column that looks like a donor's).""",
    "doc_progress_bar": """\
Show one progress bar for the whole training, with the ε spent so far.""",
    "doc_delta": """\
δ of the guarantee; ``None`` (default): 10⁻⁵, or :math:`1/(10\\,n)` above 10⁴ cells, so
that δ stays well below :math:`1/n`; it reads only the number of cells.""",
    "doc_warns_few_clusters": """\
UserWarning
    When fewer than half of the ``n_clusters`` released centroids hold a share of the cells
    above the noise of the released counts (``clusters_in_use``; it reads only released values),
    with the likely causes and what helps.""",
    "doc_returns": """\
``None`` (results written into ``adata``); with ``copy=True`` the annotated copy; with
``return_model=True`` also the trained model (see ``return_model``).""",
}


def doc_params(func: F) -> F:
    """Fill the ``{doc_*}`` placeholders of ``func``'s docstring with :data:`SHARED`, indented.

    Each placeholder must stand alone on its line; the replacement takes that line's indentation.
    An unknown ``{doc_*}`` name raises ``KeyError`` at import time, so a typo cannot ship.
    """
    doc = func.__doc__ or ""
    lines = []
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped.startswith("{doc_") and stripped.endswith("}"):
            indent = line[: len(line) - len(line.lstrip())]
            lines.append(textwrap.indent(SHARED[stripped[1:-1]], indent))
        else:
            lines.append(line)
    func.__doc__ = "\n".join(lines)
    return func


__all__ = ["SHARED", "doc_params"]
