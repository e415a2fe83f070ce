"""``dpsc.tl.annotate``: cell-type labels for query cells from a private labelled reference."""

from __future__ import annotations

from typing import Any, Literal

import anndata as ad
import numpy as np
import pandas as pd
import torch

from dpsc._docs import doc_params

from .. import _blocks, fm
from .._api import DEFAULT_EPSILON, RENAMED_IN, renamed_arguments, result_target, store_result
from .._validation import get_matrix, resolve_delta
from ..module import clean_input, input_representation
from ..privacy import (
    REPLACE_ONE,
    PlannedRelease,
    PrivacyRecord,
    PrivacyUnit,
    ReleasePlan,
    donor_codes,
    no_guarantee_record,
    with_unit,
    write_record,
)

METHODS = ("dpsgd", "pcdbn", "mlp")
#: The default unit of privacy: one cell.
PER_CELL = PrivacyUnit()


Classifier = fm.DPSGDClassifier | fm.PrivateDBN
"""What ``tl.annotate(..., return_model=True)`` returns: the trained private classifier."""


def annotation_record(
    model_record: dict[str, Any], method: str, n_reference: int, individual: PrivacyUnit = PER_CELL
) -> PrivacyRecord:
    """Return the classifier's record, with what :func:`annotate` covers and does not (reference cells).

    ``individual``: the unit of privacy (per donor: a reference donor with all of their cells).
    """
    record = PrivacyRecord.from_dict(model_record)
    # the Laplace (functional) mechanism is proven for replacement; DP-SGD for adding or removing
    neighbours = "replacing" if method == "pcdbn" else "adding or removing"
    unit = f"{neighbours} one of the {n_reference} reference cells (its expression profile and its label)"
    if individual.donor_key is not None:
        unit = (
            f"adding or removing one reference donor (obs[{individual.donor_key!r}]) with all of their "
            f"cells and labels, of these {n_reference} reference cells"
        )
    covered = "the classifier and the labels and confidences it predicts for the query cells"
    not_covered = (
        "the query cells themselves (the feature map, a PCA, is fitted on them, and they are assumed to "
        "be yours); the number of reference cells and the set of label names (treated as public); the "
        "gene list"
    )
    restated = record.restate("annotate", unit=unit, covered=covered, not_covered=not_covered)
    return with_unit(restated, individual)


def _check_donor_annotation(
    adata_ref: ad.AnnData, donor_key: str | None, method: str, epsilon: float | None, fixed_noise: bool
) -> PrivacyUnit:
    """Return the reference's unit of privacy; refuse a donor level the method cannot give (reads obs)."""
    if donor_key is None:
        return PER_CELL
    if method != "dpsgd" or epsilon is None or fixed_noise:
        raise ValueError(
            "dpsc.tl.annotate: donor_key needs method='dpsgd' with an epsilon (DP-SGD drawing donors); "
            f"method={method!r}, epsilon={epsilon!r} cannot protect a donor. Nothing was spent."
        )
    donor_codes(adata_ref, donor_key, "dpsc.tl.annotate")  # the column checked before any work
    return PrivacyUnit(donor_key)


def query_record(n_query: int) -> PrivacyRecord:
    """Ledger record of the query cells: read without noise (the PCA is fitted on them)."""
    covered = "the PCA feature map of the classifier and the labels written for the query cells"
    return no_guarantee_record("annotate", unit=f"the {n_query} query cells", covered=covered)


class QueryPCA:
    """PCA fitted on the query cells block by block: mean and covariance summed, then eigenvectors.

    Exact (the principal axes of the query's covariance, as scikit-learn's PCA finds them, up to
    sign); no dense copy of either AnnData is made.
    """

    def __init__(self, n_components: int) -> None:
        self.n_components = n_components

    def fit(self, blocks) -> QueryPCA:
        """Sum the query's rows and outer products over ``blocks``; keep the top axes."""
        total, outer, n = 0.0, 0.0, 0
        for X in blocks:
            total = total + X.sum(0)
            outer = outer + X.T @ X
            n += X.shape[0]
        self.mean_ = total / n
        cov = outer / n - np.outer(self.mean_, self.mean_)
        eigval, eigvec = np.linalg.eigh(cov)
        order = np.argsort(eigval)[::-1][: self.n_components]
        self.components_ = eigvec[:, order].T
        self.scale_ = np.sqrt(np.clip(eigval[order], 0.0, None))  # std of each score over the query
        return self

    def transform(self, blocks) -> np.ndarray:
        """Scores of the rows of ``blocks`` (stacked; only cells × components are held)."""
        return np.vstack([(X - self.mean_) @ self.components_.T for X in blocks])


def _expression_blocks(adata: ad.AnnData, layer: str | None, genes: list[str], log_normalize: bool):
    """Log-normalised expression of ``genes``, one dense row block at a time (never all cells)."""
    columns = adata.var_names.get_indexer(genes)
    for block in _blocks.dense_blocks(get_matrix(adata, layer), columns=columns, dtype=np.float64):
        if log_normalize:
            block = input_representation(clean_input(torch.as_tensor(block), "zinb"), "zinb").numpy()
        else:
            block = np.nan_to_num(block, nan=0.0, posinf=0.0, neginf=0.0)
        yield block


def _reference_plan(
    method: str, epsilon, delta: float, n_ref: int, kwargs: dict
) -> tuple[ReleasePlan, PrivacyRecord]:
    """Return the reference's plan and what its ledger will get, computed before any cell is read.

    The classifier accounts for itself: a stated release of its ε (pure ε-DP for pCDBN, the
    reservation of the DP-SGD classifier's (ε, δ), settled by its record), or, with a fixed
    ``noise_multiplier``, the Gaussian release of its Poisson steps; ``"mlp"`` reads without noise.
    """
    if method == "mlp":
        unit = f"the {n_ref} reference cells"
        return ReleasePlan.reading("classifier"), no_guarantee_record(
            "annotate", unit=unit, covered="the classifier"
        )
    sigma = kwargs.get("noise_multiplier")
    if method == "pcdbn" or epsilon is not None or sigma is None:
        plan = ReleasePlan.stated("classifier", float(epsilon))
        return plan, plan.reservation("annotate", REPLACE_ONE if method == "pcdbn" else None)
    batch = int(kwargs.get("batch_size", 128))
    q = min(1.0, batch / n_ref)
    steps = int(kwargs.get("epochs", 30)) * max(1, round(1.0 / q))
    release = PlannedRelease("classifier", sample_rate=q, steps=steps, sigma=float(sigma))
    plan = ReleasePlan.of(release, accountant=kwargs.get("accountant", "prv"), delta=delta)
    return plan, plan.reservation("annotate", cap=kwargs.get("max_epsilon"))


def _check_order(adata: ad.AnnData, adata_ref: ad.AnnData, label_key: str) -> None:
    """Refuse dpsc 0.2's reference-first order, read from the metadata only (no cell is read).

    A call whose first data set holds ``obs[label_key]`` and whose second does not can only have
    meant ``annotate(adata_ref, adata, label_key)``, the order before 0.3.
    """
    if (
        isinstance(adata, ad.AnnData)
        and isinstance(adata_ref, ad.AnnData)
        and label_key in adata.obs
        and label_key not in adata_ref.obs
    ):
        raise ValueError(
            f"dpsc.tl.annotate takes the cells to label first and the labelled reference second, as "
            f"sc.tl.ingest (after dpsc {RENAMED_IN}): only the first holds obs[{label_key!r}]; call "
            f"dpsc.tl.annotate(adata, adata_ref, {label_key!r}) with the reference second."
        )


def _check_inputs(
    adata_ref: ad.AnnData, adata_query: ad.AnnData, label_key: str, epsilon: float | None, method: str
) -> np.ndarray:
    for name, adata in (("adata_ref", adata_ref), ("adata", adata_query)):
        if not isinstance(adata, ad.AnnData):
            raise TypeError(f"{name} must be an AnnData object, got {type(adata).__name__}.")
    if method not in METHODS:
        raise ValueError(f"Unknown method {method!r}; choose one of {METHODS}.")
    if method != "mlp" and (epsilon is None or not float(epsilon) > 0):
        raise ValueError(
            f"epsilon must be > 0 for method={method!r}, got {epsilon}. Use method='mlp' for no privacy."
        )
    if label_key not in adata_ref.obs:
        raise ValueError(
            f"label_key={label_key!r} is not a column of adata_ref.obs; the reference must be labelled."
        )
    labels = adata_ref.obs[label_key]
    if labels.isna().any():
        raise ValueError(
            f"{int(labels.isna().sum())} reference cells have no {label_key!r}; drop them "
            f"(adata_ref = adata_ref[adata_ref.obs[{label_key!r}].notna()].copy())."
        )
    if labels.nunique() < 2:
        raise ValueError(f"adata_ref.obs[{label_key!r}] has fewer than 2 labels; nothing to classify.")
    missing = adata_ref.var_names.difference(adata_query.var_names)
    extra = adata_query.var_names.difference(adata_ref.var_names)
    if len(missing) or len(extra):
        raise ValueError(
            f"Genes differ between reference and query: {len(missing)} reference genes are not in the "
            f"query (e.g. {list(missing[:3])}) and {len(extra)} query genes are not in the reference. "
            "Subset both to the shared genes first: genes = adata_ref.var_names.intersection("
            "adata.var_names); adata, adata_ref = adata[:, genes].copy(), adata_ref[:, genes].copy()."
        )
    return labels.astype(str).to_numpy()


@renamed_arguments("dpsc.tl.annotate", n_components="n_comps", adata_query="adata")
@doc_params
def annotate(
    adata: ad.AnnData,
    adata_ref: ad.AnnData,
    label_key: str,
    *,
    epsilon: float | None = DEFAULT_EPSILON,
    method: Literal["dpsgd", "pcdbn", "mlp"] = "dpsgd",
    delta: float | None = None,
    n_comps: int = 8,
    layer: str | None = None,
    log_normalize: bool = True,
    key_added: str = "dp_label",
    random_state: int = 0,
    donor_key: str | None = None,
    copy: bool = False,
    return_model: bool = False,
    **method_kwargs: Any,
) -> ad.AnnData | Classifier | tuple[ad.AnnData, Classifier] | None:
    """Label cells with a classifier trained on a private, labelled reference (as ``sc.tl.ingest``).

    Both data sets are log-normalised per cell (``log1p(10⁴ x / Σx)``, no cross-cell statistics);
    a PCA with ``n_comps`` is fitted on the **query** cells and applied to both, so the
    feature map never reads the private reference. Then, by ``method``:

    - ``"dpsgd"`` (default): :class:`dpsc.fm.DPSGDClassifier` (Opacus DP-SGD MLP) on the PCA
      scores divided by the query's per-component standard deviation; ``(epsilon, delta)``-DP.
      The more accurate of the two private methods (docs, Benchmarks: "Functional mechanism").
    - ``"pcdbn"``: :class:`dpsc.fm.PrivateDBN` (functional mechanism; each cell's PCA vector
      is scaled to unit L1 norm, the bound the sensitivity assumes); ``epsilon`` is pure ε-DP.
    - ``"mlp"``: the same MLP without privacy (a reference point, no guarantee).

    Parameters
    ----------
    adata
        Cells to label (the query: yours, not protected), first as in ``sc.tl.ingest``.
    adata_ref
        Labelled reference cells (the private data), counts in ``X`` or ``layers[layer]``.
    label_key
        Column of ``adata_ref.obs`` with the labels.
    method
        ``"dpsgd"`` (default), ``"pcdbn"`` or ``"mlp"``, as above.
    epsilon, delta
        Privacy budget of the reference cells (``delta`` only for ``"dpsgd"``); default 8, the
        default of every dpsc workflow. For ``"dpsgd"``, ``epsilon=None`` with
        ``noise_multiplier=σ`` (and optionally ``max_epsilon``) trains with a fixed σ and records
        the ε spent. ``delta=None``: 10⁻⁵, or 1/(10 n) above 10⁴ reference cells.
    n_comps
        PCA dimensions. pCDBN's moment tensors have ``n_comps**degree`` entries.
    layer, log_normalize
        Where the counts are, and whether to log-normalise (``False`` for data already
        transformed).
    key_added
        ``adata.obs`` columns ``key_added`` (label) and ``f"{key_added}_confidence"``
        (predicted probability of that label).
    random_state
        Seed of the query PCA and of the classifier's initialisation; never of the noise, which
        is secret unless ``noise_seed=`` is passed in ``method_kwargs`` (tests and benchmarks only).
    donor_key
        A column of ``adata_ref.obs`` naming each reference cell's donor: the reference's guarantee
        is then per donor, with all of their cells (``method="dpsgd"`` with ``epsilon``): each
        DP-SGD step draws donors and one random cell of each donor drawn, and 2 % of ε releases the
        number of donors (:class:`dpsc.fm.DPSGDClassifier`).
    copy
        Leave ``adata`` untouched and return an annotated copy (the reference's privacy
        ledger records the training either way).
    return_model
        {doc_return_model}
        The model is the fitted classifier.
    **method_kwargs
        Passed to the classifier (e.g. ``hidden=(16,)``, ``epochs=50``, ``epsilon_split=...``).

    Returns
    -------
    ``None``; the annotated copy of ``adata`` with ``copy=True``; the classifier (or
    ``(copy, classifier)``) with ``return_model=True``. Writes the labels to
    ``adata.obs[key_added]``, the
    classifier's privacy record to ``adata_ref.uns["dpsc"][key_added]`` (and a ledger entry
    for the reference cells), and to ``adata.uns["dpsc"][key_added]`` a record with
    ``guarantee="none"`` for the query cells (the PCA is fitted on them) plus the reference's
    record. Nothing is written if an error occurs.
    """
    _check_order(adata, adata_ref, label_key)
    fixed_noise = method == "dpsgd" and method_kwargs.get("noise_multiplier") is not None and epsilon is None
    labels = _check_inputs(adata_ref, adata, label_key, 1.0 if fixed_noise else epsilon, method)
    unit = _check_donor_annotation(adata_ref, donor_key, method, epsilon, fixed_noise)
    genes = list(adata_ref.var_names)
    if not 1 <= n_comps <= min(len(genes), adata.n_obs):
        limit = min(len(genes), adata.n_obs)
        raise ValueError(f"n_comps must be in [1, {limit}], got {n_comps}.")
    delta = resolve_delta(delta, adata_ref.n_obs)
    plan, planned = _reference_plan(method, epsilon, delta, adata_ref.n_obs, method_kwargs)
    planned = with_unit(planned, unit)
    query = query_record(adata.n_obs)
    with (
        plan.spend(adata_ref, planned, key_added) as reference_spent,
        ReleasePlan.reading("query PCA").spend(adata, query, key_added) as query_spent,
    ):
        pca = QueryPCA(n_comps).fit(_expression_blocks(adata, layer, genes, log_normalize))
        Z_ref = pca.transform(_expression_blocks(adata_ref, layer, genes, log_normalize))
        Z_query = pca.transform(_expression_blocks(adata, layer, genes, log_normalize))
        if method == "pcdbn":
            model = fm.PrivateDBN(epsilon=float(epsilon), random_state=random_state, **method_kwargs)
        else:
            scale = np.where(pca.scale_ > 0, pca.scale_, 1.0)
            Z_ref, Z_query = Z_ref / scale, Z_query / scale
            model = fm.DPSGDClassifier(
                epsilon=None if method == "mlp" or fixed_noise else float(epsilon),
                delta=delta,
                random_state=random_state,
                **method_kwargs,
            )
        codes = None if unit.donor_key is None else donor_codes(adata_ref, donor_key, "dpsc.tl.annotate")
        model.fit(Z_ref, labels, **({} if codes is None else {"donors": codes}))
        proba = model.predict_proba(Z_query)
        record = annotation_record(model.privacy_record(), method, adata_ref.n_obs, unit)
        extra = {
            "method": method,
            "label_key": label_key,
            "n_reference": int(adata_ref.n_obs),
            "n_query": int(adata.n_obs),
            "n_genes": len(genes),
            "features": f"log-normalised, PCA ({n_comps} components) fitted on the query cells",
        }
        target = result_target(adata, copy)
        target.obs[key_added] = pd.Categorical(np.asarray(model.classes_)[proba.argmax(1)])
        target.obs[f"{key_added}_confidence"] = proba.max(1)
        write_record(adata_ref, key_added, record, **extra)
        reference_spent.booking.settle(record)
        return store_result(
            adata,
            target,
            key_added,
            query,
            copy=copy,
            booking=query_spent.booking,
            model=model,
            return_model=return_model,
            reference=record.to_dict(),
            **extra,
        )
