"""``dpsc.tl.private_regression``: drug-response regression released through noisy statistics."""

from __future__ import annotations

from typing import Any, Literal

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp
from sklearn.base import RegressorMixin

from dpsc._docs import doc_params

from .. import _blocks, linear
from .._api import DEFAULT_EPSILON, result_target, store_result
from .._validation import get_matrix
from ..privacy import REPLACE_ONE, PrivacyRecord, ReleasePlan, no_guarantee_record

METHODS = {
    "robust": linear.RobustPrivateLR,
    "output_perturbation": linear.OutputPerturbationLR,
    "functional_mechanism": linear.FunctionalMechanismLR,
    "non_private": linear.BayesianLR,
    "lasso": linear.LassoLR,
}
_NON_PRIVATE = ("non_private", "lasso")


def regression_record(model: Any, method: str, n_private: int, n_public: int) -> PrivacyRecord:
    """Return the estimator's record, with what :func:`private_regression` covers and does not."""
    record = PrivacyRecord.from_dict(model.privacy_record())
    covered = "the regression coefficients and anything computed from them alone"
    not_covered = (
        f"the {n_public} public samples (used exactly), the number of private samples (public under "
        "replacement), the gene choice and the centring constants (taken from public samples or given "
        "by you), and the predictions written for the private samples themselves, which also use each "
        "sample's own expression profile"
    )
    return record.restate(
        "private_regression",
        unit=f"replacing one of the {n_private} private samples (its features and its response)",
        covered=covered,
        not_covered=not_covered,
    )


def _public_mask(adata: ad.AnnData, public_mask: Any) -> np.ndarray:
    if public_mask is None:
        return np.zeros(adata.n_obs, dtype=bool)
    if isinstance(public_mask, str):
        if public_mask not in adata.obs:
            raise ValueError(f"public_mask={public_mask!r} is not a column of adata.obs.")
        public_mask = adata.obs[public_mask].to_numpy()
    mask = np.asarray(public_mask)
    if mask.dtype != bool or mask.shape != (adata.n_obs,):
        raise ValueError(
            f"public_mask must be a boolean array of length n_obs={adata.n_obs} (or an obs column)."
        )
    return mask


def _choose_genes(adata: ad.AnnData, matrix: Any, genes: Any, n_genes: int, public: np.ndarray) -> list[str]:
    """Genes given by the user, or the most variable genes among the *public* samples."""
    if genes is not None:
        genes = [str(g) for g in genes]
        missing = [g for g in genes if g not in adata.var_names]
        if missing:
            raise ValueError(f"Genes not in adata.var_names: {missing[:5]}.")
        return genes
    if public.sum() < 2:
        raise ValueError(
            "Choosing genes from the data would leak private information; pass genes=[...] (a "
            "data-independent choice, e.g. known drug targets) or public_mask with ≥ 2 public samples "
            "(genes are then ranked by variance among the public samples only)."
        )
    if not 1 <= n_genes <= adata.n_vars:
        raise ValueError(f"n_genes must be in [1, {adata.n_vars}], got {n_genes}.")
    rows = matrix[np.flatnonzero(public)]
    variances = np.asarray(rows.toarray() if sp.issparse(rows) else rows, dtype=float).var(0)
    order = np.argsort(-variances, kind="stable")[:n_genes]
    return [str(adata.var_names[i]) for i in order]


@doc_params
def private_regression(
    adata: ad.AnnData,
    target: str,
    *,
    epsilon: float = DEFAULT_EPSILON,
    n_genes: int = 10,
    genes: list[str] | None = None,
    public_mask: Any = None,
    method: Literal[
        "robust", "output_perturbation", "functional_mechanism", "non_private", "lasso"
    ] = "robust",
    layer: str | None = None,
    key_added: str | None = None,
    random_state: int = 0,
    copy: bool = False,
    return_model: bool = False,
    **method_kwargs: Any,
) -> ad.AnnData | RegressorMixin | tuple[ad.AnnData, RegressorMixin] | None:
    """Predict a per-sample response (e.g. a drug's ln IC50) from expression with ε-DP coefficients.

    Parameters
    ----------
    adata
        Samples (cell lines, pseudobulked patients) × genes; ``X`` (or ``layers[layer]``) holds
        expression on a log scale (e.g. from :func:`dpsc.datasets.read_gdsc`).
    target
        Column of ``adata.obs`` with the response; samples where it is NaN are not used for
        fitting but get predictions.
    epsilon
        Privacy budget ε (pure ε-DP); default 8, the default of every dpsc workflow.
    n_genes, genes
        Use ``genes`` if given (a data-independent choice); otherwise the ``n_genes`` most variable
        genes among the public samples. Genes are never chosen on private samples.
    public_mask
        Boolean array or ``obs`` column marking public (non-private) samples: their exact
        statistics complement the noisy private ones, and they provide the centring constants.
    method
        ``"robust"`` (:class:`dpsc.linear.RobustPrivateLR`), ``"output_perturbation"``,
        ``"functional_mechanism"``, ``"non_private"`` (Bayesian LR) or ``"lasso"``.
    layer
        Layer with the expression; ``None`` for ``X``.
    key_added
        ``obs`` column for the predictions (default ``f"{target}_dp_pred"``).
    random_state
        Seed of the estimator's non-private randomness (e.g. the auxiliary search). Never of the
        noise, which is secret unless ``noise_seed=`` is passed in ``method_kwargs`` (tests and
        benchmarks only).
    copy
        {doc_copy}
    return_model
        {doc_return_model}
        The model is the fitted estimator.
    **method_kwargs
        Passed to the estimator (e.g. ``prior="gamma"``, ``bounds=(B_x, B_y)``).

    Returns
    -------
    {doc_returns}
    Writes ``obs[key_added]``, the record ``uns["dpsc"][key_added]`` (``key_added`` defaults to
    ``f"{target}_dp_pred"``) and a ledger entry.
    """
    if method not in METHODS:
        raise ValueError(f"Unknown method {method!r}; choose one of {sorted(METHODS)}.")
    if target not in adata.obs:
        raise ValueError(f"target={target!r} is not a column of adata.obs.")
    if method not in _NON_PRIVATE and not float(epsilon) > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}.")
    matrix = get_matrix(adata, layer)
    y = pd.to_numeric(adata.obs[target], errors="coerce").to_numpy(dtype=float)
    public = _public_mask(adata, public_mask)
    chosen = _choose_genes(adata, matrix, genes, n_genes, public)
    cols = adata.var_names.get_indexer(chosen)
    labelled = np.isfinite(y)
    private_rows = labelled & ~public
    public_rows = labelled & public
    if private_rows.sum() < 2:
        raise ValueError(
            f"Need at least 2 private samples with a finite {target!r}, got {private_rows.sum()}."
        )
    key = key_added or f"{target}_dp_pred"
    if method in _NON_PRIVATE:
        plan = ReleasePlan.reading("coefficients")
        planned = no_guarantee_record(
            "private_regression", unit=f"the {adata.n_obs} samples", covered="the coefficients"
        )
    else:  # pure ε-DP (Laplace, the functional mechanism): the estimator draws its noise
        plan = ReleasePlan.stated("coefficients", float(epsilon))
        planned = plan.reservation("private_regression", REPLACE_ONE)
    with plan.spend(adata, planned, key) as spent:
        booking = spent.booking
        Xg = _blocks.map_rows(matrix, lambda block: block, len(cols), columns=cols).astype(np.float64)
        kwargs = dict(method_kwargs)
        if method not in _NON_PRIVATE:
            kwargs.setdefault("epsilon", epsilon)
        if method != "non_private":
            kwargs.setdefault("random_state", random_state)
        model = METHODS[method](**kwargs)
        model.fit(Xg[private_rows], y[private_rows], Xg[public_rows], y[public_rows])

        out = result_target(adata, copy)
        out.obs[key] = model.predict(Xg)
        n_private, n_public = int(private_rows.sum()), int(public_rows.sum())
        extra: dict[str, Any] = {"method": method, "target": target, "genes": chosen}
        for attr in ("bounds_", "budget_split_", "laplace_scales_", "sensitivities_", "regularization_"):
            if hasattr(model, attr):
                value = getattr(model, attr)
                extra[attr.rstrip("_")] = dict(value) if isinstance(value, dict) else value
        record = regression_record(model, method, n_private, n_public)
        return store_result(
            adata,
            out,
            key,
            record,
            copy=copy,
            booking=booking,
            model=model,
            return_model=return_model,
            **extra,
        )
