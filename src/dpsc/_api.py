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

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import anndata as ad

from .privacy import PrivacyRecord, Spending, write_record

Function = TypeVar("Function", bound=Callable[..., Any])

DEFAULT_EPSILON = 8.0
"""The default ε of every dpsc call that reads private cells: each call spends 8 unless told
otherwise (``pp.highly_variable_genes``, ``pp.pca`` and ``tl.kmeans`` included: a whole proven
clustering in one budget is :func:`dpsc.tl.cluster`, which splits 8 among its steps)."""


def result_target(adata: Any, copy: bool) -> Any:
    """Return where a call writes its results: ``adata``, or (``copy=True``) a copy in memory.

    A backed AnnData is copied into memory, its ``X`` read whole (anndata's ``copy`` of a backed
    object needs a file name, and its ``to_memory`` closes the file the call still reads); a
    warning says so, with the call that keeps ``X`` on disk.
    """
    if not copy:
        return adata
    if not getattr(adata, "isbacked", False):
        return adata.copy()
    import copy as copying

    warnings.warn(
        f"copy=True reads the backed file's X ({adata.n_obs} × {adata.n_vars}) into memory for the copy. "
        "To keep X on disk, call without copy=True: the results go into this AnnData's annotations "
        "(obs, obsm, uns), as scanpy does in place.",
        UserWarning,
        stacklevel=3,
    )

    X = adata.X[:]
    return ad.AnnData(
        X=X.to_memory() if hasattr(X, "to_memory") else X,
        obs=adata.obs.copy(),
        var=adata.var.copy(),
        uns=copying.deepcopy(dict(adata.uns)),
        obsm={k: copying.deepcopy(v) for k, v in adata.obsm.items()},
        varm={k: copying.deepcopy(v) for k, v in adata.varm.items()},
        layers={k: copying.deepcopy(v) for k, v in adata.layers.items()},
    )


def store_result(
    adata: ad.AnnData,
    annotated: ad.AnnData,
    key: str,
    record: PrivacyRecord,
    params: dict[str, Any] | None = None,
    *,
    copy: bool,
    booking: Spending,
    model: Any = None,
    return_model: bool = False,
    **extra: Any,
) -> Any:
    """Write a result's record into ``annotated``, settle its ledger booking, return by the rule.

    Parameters
    ----------
    adata
        The AnnData the user passed (its ledger holds the booking).
    annotated
        Where the result was written: ``adata`` itself, or its copy when ``copy=True``.
    key, record, params, extra
        Passed to :func:`dpsc.privacy.write_record` for ``annotated``.
    copy, model, return_model
        The call's arguments and what it trained (module docstring).
    booking
        The call's booking (:class:`dpsc.privacy.Spending`, from :meth:`dpsc.privacy.ReleasePlan.spend`);
        settled here with ``record``, in ``adata``'s ledger and in the copy's.

    Returns
    -------
    ``None``; ``annotated`` with ``copy=True``; ``model`` (or ``(annotated, model)``) with
    ``return_model=True``.
    """
    _mark_replaced_labels(annotated, key, (params or {}).get("cluster_key", key))
    write_record(annotated, key, record, params, **extra)
    booking.settle(record, *([annotated] if annotated is not adata else []))
    if return_model:
        return (annotated, model) if copy else model
    return annotated if copy else None


def _mark_replaced_labels(annotated: ad.AnnData, key: str, column: str) -> None:
    """Mark every earlier result whose labels were ``obs[column]`` as replaced by result ``key``.

    dpsc's clustering tools share one default column (``obs["dp_cluster"]``), so a fit after a
    clustering (or the reverse) replaces the labels another result's record describes. That record
    stays (its other outputs and the ledger are unchanged) with ``labels_replaced_by`` set, and
    :func:`dpsc.pl.embedding` no longer names its ε on the column; a warning says how to keep both.
    """
    if column not in annotated.obs:
        return
    replaced = [
        name
        for name, result in annotated.uns.get("dpsc", {}).items()
        if name != key
        and isinstance(result, dict)
        and "privacy" in result
        and "labels_replaced_by" not in result
        and column in (name, result.get("params", {}).get("cluster_key"))
    ]
    for name in replaced:
        annotated.uns["dpsc"][name]["labels_replaced_by"] = key
    if replaced:
        warnings.warn(
            f"obs[{column!r}] held the clusters of the earlier result {replaced[0]!r}; this call replaces "
            "them (that result's other outputs and the ledger are kept). Pass another key_added "
            "(cluster_key for dpsc.tl.fit) to keep both.",
            UserWarning,
            stacklevel=4,
        )


RENAMED_IN = "0.2"
"""The last release with the old argument names listed by :func:`renamed_arguments`."""


def renamed_arguments(function: str, **renames: str) -> Callable[[Function], Function]:
    """Refuse dpsc 0.2's argument names with the call that works now, before anything runs.

    ``renames`` maps each old keyword to its new name (``n_clients="n_sites"``). A call that
    still passes an old name gets a :class:`TypeError` that names the new one and the value to
    pass: the check reads only the call's keywords, so no cell is read and no ε is spent.
    """

    def decorate(wrapped: Function) -> Function:
        @functools.wraps(wrapped)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old in sorted(kwargs.keys() & renames.keys()):
                new, value = renames[old], kwargs[old]
                shown = repr(value) if isinstance(value, (bool, int, float, str)) else "..."
                raise TypeError(
                    f"{function}: {old}= was renamed {new}= after dpsc {RENAMED_IN}; pass {new}={shown}."
                )
            return wrapped(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
