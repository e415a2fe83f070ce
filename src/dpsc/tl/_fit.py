"""``dpsc.tl.fit``: DP-DCAN clustering and embedding of an AnnData."""

from __future__ import annotations

import warnings
from typing import Literal

import anndata as ad
import pandas as pd
import torch

from dpsc._docs import doc_params

from .._api import DEFAULT_EPSILON, store_result
from .._validation import (
    check_fit_args,
    check_input_pcs,
    check_matrix,
    check_privacy_args,
    get_matrix,
    resolve_delta,
)
from ..model import DPDCAN
from ..model._dcan_privacy import plan_fit
from ..privacy import check_budget
from ._small_data import small_data_message

DEFAULT_N_CLUSTERS = 8
"""Used when ``n_clusters`` is None: a fixed, data-independent default (never estimated)."""

_SPLIT_INSTANCE = 5 / 9  # the reference's 50 instance + 40 cluster epochs

#: The proven scope's model with ``input_pcs="auto"``: the encoder reads 16 DP principal
#: components (released inside the fit's ε; the count :func:`dpsc.pp.pca` uses) through 64
#: hidden units to a 16-dimensional latent, and the decoder reconstructs those components, so
#: DP-SGD noises 4 384 parameters instead of 2.09 million (2000 genes, 8 clusters). It trains 10 + 10 epochs
#: (fewer steps, less noise per step). Chosen on PBMC 4k with its labels (tuned-on), confirmed on
#: mouse bladder (``benchmarks/results/dp_pipeline.md``).
FULL_SCOPE_MODEL = {"input_pcs": 16, "n_hidden": (64,), "n_latent": 16}
FULL_SCOPE_EPOCHS = {"instance_epochs": 10, "cluster_epochs": 10}


@doc_params
def fit(
    adata: ad.AnnData,
    epsilon: float | None = DEFAULT_EPSILON,
    *,
    delta: float | None = None,
    n_clusters: int | None = None,
    scope: Literal["encoder", "full"] = "encoder",
    input_pcs: int | Literal["auto"] | None = "auto",
    layer: str | None = None,
    max_epochs: int | None = None,
    batch_size: int | None = None,
    likelihood: Literal["zinb", "gaussian"] = "zinb",
    accountant: Literal["rdp", "prv"] = "rdp",
    optimizer: Literal["sgd", "adam", "dpsignsgd", "dpsignadam"] = "sgd",
    random_state: int = 0,
    noise_seed: int | None = None,
    key_added: str = "X_dpdcan",
    cluster_key: str = "dp_cluster",
    copy: bool = False,
    return_model: bool = False,
    progress_bar: bool = True,
    **train_kwargs,
) -> ad.AnnData | DPDCAN | tuple[ad.AnnData, DPDCAN] | None:
    """Cluster and embed cells with DP-DCAN under an (ε, δ) guarantee.

    Parameters
    ----------
    adata
        Cells × genes, raw counts in ``X`` (or ``layers[layer]``).
    epsilon
        Privacy budget ε of the whole fit; ``None`` trains the non-private DCAN.
    delta
        {doc_delta}
    n_clusters
        Number of clusters. ``None`` uses :data:`DEFAULT_N_CLUSTERS` (8), a fixed default that
        is *not* estimated from the cells (estimating it would spend privacy budget). Pass the
        number you expect from prior knowledge.
    scope
        ``"encoder"`` (DP-DCAN: noise on encoder and centroids; the decoder trains without
        noise and is never shared) or ``"full"`` (DPE-DCAN: noise on every parameter).
    input_pcs
        ``"auto"``: ``None`` under ``scope="encoder"``, and under ``scope="full"`` the model of
        :data:`FULL_SCOPE_MODEL` (16 DP principal components in, 10 + 10 epochs unless
        ``max_epochs`` or the per-stage epochs are given). An integer: the encoder reads that many
        DP principal components of the cells, released inside the fit's ε
        (:class:`~dpsc.model.DPDCAN`'s ``input_pcs``); ``None``: it reads the genes.
    layer
        Layer with the counts; ``None`` for ``X``.
    max_epochs
        Total epochs, split 5:4 between the instance and cluster stages (the reference's
        50 + 40). ``None`` uses 50 + 40 (10 + 10 for the proven scope's default model, see
        ``input_pcs``). Pass ``instance_epochs``/``cluster_epochs`` to set each.
    batch_size
        Expected Poisson batch size; the Poisson rate is ``q = batch_size / n_obs``. Default:
        10 % of the cells, at most 4096, so that
        memory per step stays bounded at atlas scale while an epoch keeps ``1/q`` steps and σ
        is calibrated for that q and step count.
    likelihood
        ``"zinb"`` for counts, ``"gaussian"`` for continuous (log-normalised) data.
    accountant
        ``"rdp"`` (default) or ``"prv"``.
    optimizer
        Update rule of the private parameters, applied to the clipped and noised gradient:
        ``"sgd"`` (default), ``"adam"``, ``"dpsignsgd"`` or ``"dpsignadam"`` (sign of the
        noisy gradient, :mod:`dpsc.optim`). Same accounting for all: the update is
        post-processing of the noisy gradient.
    random_state
        Seed of initialisation, masking and post-processing. Never of the DP noise or the Poisson
        samples: those are secret unless ``noise_seed`` is given.
    noise_seed
        {doc_noise_seed}
    key_added, cluster_key
        Where the embedding (``obsm``) and the clusters (``obs``) go; the privacy record and the
        parameters go to ``uns["dpsc"][key_added]``.
    copy
        {doc_copy}
    return_model
        {doc_return_model}
        The model is a :class:`~dpsc.model.DPDCAN`: share it with
        :meth:`~dpsc.model.DPDCAN.export_shared`, or embed new cells with it.
    progress_bar
        {doc_progress_bar}
    **train_kwargs
        Passed to :meth:`dpsc.model.DPDCAN.train`: for example ``instance_epochs``,
        ``max_grad_norm``, ``accelerator``, and ``devices=4, strategy="ddp"`` for data-parallel
        training with the single-process guarantee.

    Returns
    -------
    {doc_returns}
    Writes ``obsm[key_added]``, ``obs[cluster_key]`` (categorical), the privacy record
    ``uns["dpsc"][key_added]["privacy"]`` (:func:`dpsc.privacy.get_record`), the parameters
    ``uns["dpsc"][key_added]["params"]``, and one entry of the AnnData's privacy ledger
    (:func:`dpsc.privacy.spent`). With a budget set
    (:func:`dpsc.privacy.set_budget`), a fit that would exceed it is refused before any work.

    Notes
    -----
    What the ε covers: with ``scope="full"``, (ε, δ)-DP (proven) for the released encoder,
    decoder and centroids with respect to adding or removing one training cell. With the
    default ``scope="encoder"`` the guarantee is *heuristic*: the decoder trains without noise
    and the encoder's gradients pass through it; the record's ``guarantee`` field and its
    statement say so. Neither covers the outputs written for the training cells themselves,
    nor gene selection done before dpsc. See ``docs/privacy.md``.
    """
    n_clusters = DEFAULT_N_CLUSTERS if n_clusters is None else n_clusters
    # Every check runs before adata is touched.
    matrix = get_matrix(adata, layer)
    batch_size = check_fit_args(n_obs=adata.n_obs, n_clusters=n_clusters, scope=scope, batch_size=batch_size)
    delta = resolve_delta(delta, adata.n_obs)
    check_privacy_args(epsilon, delta, adata.n_obs)
    check_matrix(matrix, likelihood)
    model_kwargs = _model_kwargs(scope, input_pcs, adata.n_vars)
    full_scope_default = scope == "full" and input_pcs == "auto"
    if full_scope_default and max_epochs is None:
        for name, epochs in FULL_SCOPE_EPOCHS.items():
            train_kwargs.setdefault(name, epochs)
    train_kwargs.setdefault("private_optimizer", optimizer)
    options = DPDCAN.check_options(
        train_kwargs.get("plan_kwargs"), train_kwargs.get("kmeans_kwargs"), train_kwargs["private_optimizer"]
    )
    if max_epochs is not None:
        if max_epochs < 2:
            raise ValueError(f"max_epochs must be at least 2 (one per stage); got {max_epochs}.")
        instance = max(1, round(max_epochs * _SPLIT_INSTANCE))
        train_kwargs.setdefault("instance_epochs", instance)
        train_kwargs.setdefault("cluster_epochs", max_epochs - instance)

    train_kwargs.update(
        epsilon=epsilon,
        delta=delta,
        scope=scope,
        batch_size=batch_size,
        accountant=accountant,
        random_state=random_state,
        noise_seed=noise_seed,
        progress_bar=progress_bar,
    )
    plan = _plan(adata.n_obs, {**train_kwargs, "input_pcs": model_kwargs["input_pcs"]}, options)
    _check_planned_budget(adata, key_added, plan)
    if plan.settings is not None:
        sigma = plan.settings.noise_multiplier
        reads_pcs = model_kwargs["input_pcs"] is not None
        message = small_data_message(adata.n_obs, plan.sample_rate, sigma, epsilon, reads_pcs)
        if message:
            warnings.warn(message, UserWarning, stacklevel=2)

    target = adata.copy() if copy else adata
    DPDCAN.setup_anndata(target, layer=layer)
    torch.manual_seed(random_state)  # the module's weights are drawn when the model is built
    model = DPDCAN(target, n_clusters=n_clusters, likelihood=likelihood, **model_kwargs)
    model.train(**train_kwargs)
    target.obsm[key_added] = model.get_latent_representation()
    labels = model.predict().astype(str)
    target.obs[cluster_key] = pd.Categorical(labels, categories=sorted(set(labels), key=int))
    n_used = len(set(labels))
    if n_used < n_clusters:
        warnings.warn(empty_clusters_message(n_used, n_clusters, epsilon), UserWarning, stacklevel=2)
    return store_result(
        adata,
        target,
        key_added,
        model.privacy_record(),
        {
            "method": "dpdcan",
            "epsilon": epsilon,
            "delta": delta,
            "n_clusters": n_clusters,
            "scope": scope,
            "input_pcs": -1 if model_kwargs["input_pcs"] is None else model_kwargs["input_pcs"],
            "layer": layer,
            "likelihood": likelihood,
            "accountant": accountant,
            "key_added": key_added,
            "cluster_key": cluster_key,
            "clusters_used": n_used,
            **model.train_params_,
        },
        copy=copy,
        model=model,
        return_model=return_model,
    )


def empty_clusters_message(n_used: int, n_clusters: int, epsilon: float | None) -> str:
    """Say why some of the asked clusters hold no cell, and what would help."""
    cause = (
        f"Under DP (epsilon={epsilon:g}) the centroids are released with noise, so cell types "
        "with few cells, or close to a larger one, are absorbed by their neighbours"
        if epsilon is not None
        else "Without noise this means the cells support fewer separate groups in the embedding"
    )
    return (
        f"{n_used} of the {n_clusters} clusters hold cells; {n_clusters - n_used} ended with no cell "
        f"nearest to their centroid. {cause}. This is not an error: the labels use only the "
        "non-empty clusters. A larger epsilon, more cells, or a smaller n_clusters (from prior "
        "knowledge, never from these cells' labels) gives each cluster more signal."
    )


def _model_kwargs(scope: str, input_pcs: int | str | None, n_vars: int) -> dict:
    """DPDCAN's architecture options for ``scope`` and ``input_pcs`` (checked; reads no cell)."""
    if input_pcs == "auto":
        if scope != "full":
            return {"input_pcs": None}
        return {**FULL_SCOPE_MODEL, "input_pcs": min(FULL_SCOPE_MODEL["input_pcs"], n_vars - 1)}
    check_input_pcs(input_pcs, n_vars)
    return {"input_pcs": input_pcs}


def _plan(n_obs: int, train_kwargs: dict, options: tuple[dict, dict]):
    """Plan the fit's steps and σ (:func:`dpsc.model._dcan_privacy.plan_fit`; reads no cell)."""
    settings = {**_train_defaults(), **train_kwargs, "plan": options[0], "kmeans": options[1]}
    return plan_fit(settings, n_obs)


def _check_planned_budget(adata: ad.AnnData, key: str, plan) -> None:
    """Refuse, before ``adata`` is touched, a fit whose planned spend would exceed the budget."""
    if "budget" in adata.uns.get("dpsc", {}):
        check_budget(adata, plan.planned_record(adata.n_obs), key)


def _train_defaults() -> dict:
    """``DPDCAN.train``'s keyword defaults."""
    import inspect

    sig = inspect.signature(DPDCAN.train)
    return {k: p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
