"""The one rule for what ``dpsc.pp``/``dpsc.tl`` functions default to, write and return.

scanpy's rule, everywhere: a function writes its result into the AnnData it was given and returns
``None``; with ``copy=True`` it leaves that AnnData's data alone and returns an annotated copy.
Functions that train something reachable afterwards (a model, an estimator) return it only when
asked, with ``return_model=True``: then the model, or ``(copy, model)`` with ``copy=True``.
``tl.audit`` is an evaluation, not an annotation: it returns its table (and writes it too).

Privacy comes first, also under ``copy=True``: the cells of the original AnnData were read, so
its privacy ledger (:mod:`dpsc.privacy`) gains the entry as well, and nothing else of it changes.
"""

from __future__ import annotations

from typing import Any

import anndata as ad

from .privacy import PrivacyRecord, write_result
from .privacy._ledger import append

DEFAULT_EPSILON = 8.0
"""The default ε of every dpsc workflow: one call that trains (``tl.fit``, ``tl.fit_federated``,
``tl.annotate``, ``tl.private_regression``, and the fits ``tl.audit`` audits) spends 8; the two
steps of the linear pipeline (``pp.pca`` then ``tl.kmeans``) spend half of it each."""


def store_result(
    adata: ad.AnnData,
    annotated: ad.AnnData,
    key: str,
    record: PrivacyRecord,
    params: dict[str, Any] | None = None,
    *,
    copy: bool,
    model: Any = None,
    return_model: bool = False,
    **extra: Any,
) -> Any:
    """Write a result's record into ``annotated``, book the read in ``adata``'s ledger, return by the rule.

    Parameters
    ----------
    adata
        The AnnData the user passed.
    annotated
        Where the result was written: ``adata`` itself, or its copy when ``copy=True``.
    key, record, params, extra
        Passed to :func:`dpsc.privacy.write_result` for ``annotated``.
    copy, model, return_model
        The call's arguments and what it trained (module docstring).

    Returns
    -------
    ``None``; ``annotated`` with ``copy=True``; ``model`` (or ``(annotated, model)``) with
    ``return_model=True``.
    """
    write_result(annotated, key, record, params, **extra)
    if annotated is not adata:
        append(adata, record, key)
    if return_model:
        return (annotated, model) if copy else model
    return annotated if copy else None
