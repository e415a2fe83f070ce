"""``dpsc.tl.fit``: DP-DCAN clustering and embedding of an AnnData.

One way through: the arguments become one ``TrainSettings``;
``plan_fit`` checks them and calibrates σ once; the plan's record is
booked in the AnnData's ledger (:meth:`dpsc.privacy.ReleasePlan.spend`, which refuses before any work
when a budget would be exceeded); the default model starts from the private clustering's
releases (:mod:`dpsc.model._dcan_start`), trains with the plan as it is, and keeps the better of
the two partitions by one more release.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Literal

import anndata as ad
import numpy as np
import torch

from dpsc._docs import doc_params

from .._api import DEFAULT_EPSILON, result_target, store_result
from .._outputs import cluster_labels, derived_key
from .._validation import (
    LIKELIHOODS,
    check_cells,
    check_choice,
    check_input_pcs,
    check_matrix,
    check_public_counts,
    get_matrix,
)
from ..methods import selection as _selection
from ..methods.kmeans import clusters_above_noise
from ..model import (
    DPDCAN,
    MODEL_GENES,
    FitPlan,
    PlannedTraining,
    TrainSettings,
    choose_partition,
    plan_fit,
    release_before_training,
    start_model_from,
)
from ..module import DEFAULT_LATENT_SCALE
from ..privacy import DonorRows, PrivacyUnit, donor_codes, join_process_group, n_donors, unit_and_weights
from ._cluster import warn_if_noise_dominated
from ._fit_reference import (
    REFERENCE_FINE_TUNING_EPOCHS,
    REFERENCE_FINE_TUNING_RATE,
    REFERENCE_MODEL,
    ReferenceFit,
    reference_for_fit,
    reference_outputs,
)
from ._small_data import small_data_message

DEFAULT_N_CLUSTERS = 8
"""Used when ``n_clusters`` is None: a fixed, data-independent default (never estimated)."""

#: The proven scopes' model with ``input_pcs="auto"``: the encoder reads 16 DP principal
#: components (released inside the fit's ε) through 64 hidden units to a 16-dimensional latent,
#: and the decoder reconstructs those components, so DP-SGD noises a few thousand parameters
#: instead of 2.09 million (2000 genes, 8 clusters). The encoder is residual and reads each
#: cell's projection with its length (the mean coordinate weighted as the clustering's k-means
#: weights it) and writes its latent back in the clustering's coordinates: untrained, it embeds
#: each cell at its point of ``obsm["X_dp_cluster"]`` (scaled), and training refines that embedding.
PC_MODEL = {"input_pcs": 16, "n_hidden": (64,), "n_latent": 16, "residual": True}
#: The PC model's epochs: no instance stage (its contrastive views of 16 masked coordinates blur
#: the clustering's neighbourhoods), 10 cluster-stage epochs. Chosen by leave one file out on the
#: embedding's kNN label purity among 10 + 10, 5 + 10, 0 + 10 and 0 + 20 (docs, Benchmarks: "The
#: default ``tl.fit``'s epochs by leave-one-file-out"); 0 + 10 and 0 + 20 tie over the six files,
#: and 0 + 10 takes fewer steps. With the latent in the clustering's coordinates, 0 + 0, 0 + 10 and
#: 0 + 20 tie on the embedding; the model keeps its training (a fit without steps is no model).
PC_MODEL_EPOCHS = {"instance_epochs": 0, "cluster_epochs": 10}

#: ``tl.fit`` keyword arguments that go to Lightning, not to the plan.
RUN_OPTIONS = ("accelerator", "devices", "strategy")
#: ``tl.fit`` keyword arguments that set the plan beyond its named parameters.
PLAN_OPTIONS = ("instance_epochs", "cluster_epochs", "max_grad_norm", "plan_kwargs", "kmeans_kwargs")


@doc_params
def fit(
    adata: ad.AnnData,
    n_clusters: int | None = None,
    *,
    epsilon: float | None = DEFAULT_EPSILON,
    delta: float | None = None,
    scope: Literal["encoder", "full", "paper"] = "encoder",
    input_pcs: int | Literal["auto"] | None = "auto",
    layer: str | None = None,
    max_epochs: int | None = None,
    batch_size: int | None = None,
    likelihood: Literal["zinb", "gaussian"] = "zinb",
    accountant: Literal["rdp", "prv"] = "rdp",
    optimizer: Literal["sgd", "adam", "dpsignsgd", "dpsignadam"] = "sgd",
    random_state: int = 0,
    noise_seed: int | None = None,
    reference: ad.AnnData | str | None = None,
    reference_key: str | None = None,
    reference_model: str | os.PathLike | None = None,
    donor_key: str | None = None,
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
        Cells × genes, raw counts in ``X`` (or ``layers[layer]``), as they come: all genes are
        fine (more than 2000 are reduced by a DP gene selection inside ε, see Notes).
    epsilon
        Privacy budget ε of the whole fit (gene selection, input loadings, training, k-means and
        frequency releases together); ``None`` trains the non-private DCAN.
    delta
        {doc_delta}
    n_clusters
        Number of clusters. ``None`` uses :data:`DEFAULT_N_CLUSTERS` (8), a fixed default that
        is *not* estimated from the cells (estimating it would spend privacy budget). Pass the
        number you expect from prior knowledge.
    scope
        ``"encoder"`` (noise on the encoder and the centroids; the decoder stays fixed at its
        initialisation, drawn before any cell is read: proven), ``"full"`` (DPE-DCAN: noise on
        every parameter, proven) or ``"paper"`` (the DP-DCAN paper's partial perturbation: the
        decoder trains without noise and is never shared; heuristic).
    input_pcs
        ``"auto"``: the model of :data:`PC_MODEL` started from the private clustering (see
        Notes; 0 + 10 epochs unless ``max_epochs`` or the per-stage epochs are given), and
        ``None`` under ``scope="paper"``. An integer: the encoder reads that many DP principal
        components of the cells, released inside the fit's ε, and the centroids start from a DP
        k-means of the latent; ``None``: it reads the genes.
    layer
        Layer with the counts; ``None`` for ``X``.
    max_epochs
        Total epochs, split 5:4 between the instance and cluster stages (the reference's
        50 + 40). ``None`` uses 50 + 40 (0 + 10 for :data:`PC_MODEL`). Pass
        ``instance_epochs``/``cluster_epochs`` to set each (the same names as
        :meth:`~dpsc.model.DPDCAN.train`).
    batch_size
        Expected Poisson batch size; the Poisson rate is ``q = batch_size / n_obs``. Default:
        10 % of the cells, at most 4096.
    likelihood
        ``"zinb"`` for counts, ``"gaussian"`` for continuous (log-normalised) data.
    accountant
        ``"rdp"`` (default) or ``"prv"``.
    optimizer
        Update rule of the private parameters, applied to the clipped and noised gradient:
        ``"sgd"`` (default), ``"adam"``, ``"dpsignsgd"`` or ``"dpsignadam"`` (:mod:`dpsc.optim`).
    random_state
        Seed of initialisation, masking and post-processing. Never of the DP noise or the Poisson
        samples: those are secret unless ``noise_seed`` is given.
    noise_seed
        {doc_noise_seed}
    reference
        A public reference of the same tissue (an AnnData of raw counts or an ``.h5ad`` path:
        another donor, study or condition, which must not contain these cells). The model is
        pretrained on it without noise (no ε) and only its encoder and centroids are then trained
        on these cells with DP-SGD, the decoder kept at its public values; the fit starts from
        ``dpsc.tl.cluster(reference=...)``'s clustering of them (see Notes). Needs the default
        model (``scope="encoder"``, ``input_pcs="auto"``, ``likelihood="zinb"``).
    reference_key
        A column of ``reference.obs`` with cell types: each cluster is named after the reference
        type whose own spread holds its centroid (``obs[f"{cluster_key}_names"]``;
        ``"unmatched"`` outside every type's, and for a cell outside its cluster's named type), as
        :func:`dpsc.tl.cluster` does.
    reference_model
        A directory for the model pretrained on ``reference``: reused from there when it holds
        one for this reference, these genes and this architecture, else pretrained and saved
        there (public: share it with every site that uses the same reference). ``None``:
        pretrained in memory.
    donor_key
        {doc_donor_key}
        Needs the default model (``input_pcs="auto"``, ``likelihood="zinb"``, ``scope`` ``"encoder"``
        or ``"full"``; with or without a ``reference``): its clustering's sums and the choice weight
        each cell by 1/(its donor's cells), and DP-SGD draws donors (rate ``q = batch_size / n_obs``
        each) and one random cell of each donor drawn (see Notes).
    key_added, cluster_key
        Where the embedding (``obsm``) and the clusters (``obs``) go; the privacy record and the
        parameters go to ``uns["dpsc"][key_added]``.
    copy
        {doc_copy}
    return_model
        {doc_return_model}
        The model is a :class:`~dpsc.model.DPDCAN`: share it with
        ``export_shared``, or embed new cells with it.
    progress_bar
        {doc_progress_bar}
    **train_kwargs
        ``instance_epochs``, ``cluster_epochs``, ``max_grad_norm``, ``plan_kwargs`` and
        ``kmeans_kwargs`` as in :meth:`dpsc.model.DPDCAN.train`, and Lightning's ``accelerator``,
        ``devices`` and ``strategy`` (``devices=4, strategy="ddp"`` for data-parallel training
        with the single-process guarantee).

    Returns
    -------
    {doc_returns}
    Writes ``obsm[key_added]``, ``obs[cluster_key]`` (categorical, categories among ``"0"`` …
    ``str(n_clusters - 1)``: the clusters that hold a cell, as scanpy's), the privacy record
    ``uns["dpsc"][key_added]["privacy"]``
    (``get_record``), the parameters (with ``partition``: ``"clustering"`` or
    ``"model"``, the partition written to ``obs[cluster_key]``, and both ``partition_scores``),
    the released cluster frequencies, the released label counts and the clusters in use (counts
    above twice their noise) in ``uns["dpsc"][key_added]``, ``var["dpdcan_gene"]`` (the genes the
    model reads; the name is ``key_added`` without ``X_``, then ``_gene``) when genes were
    selected, with a ``reference`` its summary in ``uns["dpsc"][key_added]["reference"]`` and, with
    ``reference_key``, ``obs[f"{cluster_key}_names"]`` and ``uns["dpsc"][key_added]["cluster_names"]``,
    and one entry of
    the AnnData's privacy ledger (:func:`dpsc.privacy.spent`). With a budget set
    (``set_budget``), a fit that would exceed it is refused before any work.

    Notes
    -----
    The default model (``input_pcs="auto"`` on counts, ``scope`` ``"encoder"`` or ``"full"``)
    builds on :func:`dpsc.tl.cluster`: with ``START_SHARE`` of ε it
    makes that clustering's releases (gene selection when the matrix has more genes than the
    clustering reads, loadings, DP k-means centroids); the residual encoder reads each cell's
    projection on those loadings (its k-means point before the unit norm) and starts where the
    clustering embeds the cell, and the centroids start at the encoder's image of its released
    centroids (post-processing: no release), so the model's partition starts as the
    clustering's. DP-SGD then refines them with ``TRAINING_SHARE`` of ε. Last, one
    release of both partitions' per-cluster sums scores each by the k-means objective in the
    clustering's points (:mod:`dpsc.methods.selection`): ``obs[cluster_key]`` holds the model's
    partition only when its score leads by twice its noise, the clustering's otherwise;
    ``obsm[key_added]`` is always the model's embedding.

    With a ``reference``: the genes, their scales and 16 components come from the reference
    (:mod:`dpsc.methods.public_basis`, as in ``dpsc.tl.cluster(reference=...)``), and the model
    reads each cell's point in that basis (a map of the cell and public values). The network
    (``REFERENCE_MODEL``) is pretrained on the reference's points
    without noise, its cluster stage and every parameter: public, no ε. On these cells
    ``START_SHARE`` of ε goes to the DP k-means of their points (the
    only release of that clustering), the training share to DP-SGD on the encoder and the
    centroids alone (the decoder keeps its pretrained, public values; 0 + 4 epochs at q = 0.5
    unless given, ``REFERENCE_FINE_TUNING_EPOCHS``) and the rest to the
    choice of partition, as without one. The guarantee is proven; the record names the reference
    (its sha256 fingerprint, size and genes) and states that it is assumed public and must not
    contain these cells.

    With ``donor_key`` the same releases protect one donor with all of their cells: each sum of the
    start and of the choice weights a cell by :math:`1/m_d` (a donor's weights add up to 1, so its
    whole contribution keeps the per-cell bound), and each DP-SGD step and sampled release draws
    every donor with probability q and, for a donor drawn, one of its cells at random
    (:class:`dpsc.privacy.DonorRows`): a donor adds at most one clipped gradient to a step, so the
    same σ, q and accountant hold per donor. The noisy mean of a step divides by q times the
    number of donors the start released (post-processing), never by the true one.

    What the ε covers: with the default ``scope="encoder"`` and with ``scope="full"``, (ε, δ)-DP
    (proven) for the released clustering (or input loadings), the choice, the encoder and the
    centroids (and the decoder under
    ``"full"``; under ``"encoder"`` it never reads a cell) with respect to adding or removing one
    training cell. With ``scope="paper"`` the guarantee is *heuristic*: the decoder trains without
    noise and the encoder's gradients pass through it; the record's ``guarantee`` field and its
    statement say so. Neither covers the outputs written for the training cells themselves.

    Gene selection: the default model reads the genes its clustering reads (its rule,
    ``genes_for``); otherwise a matrix with more than 2000 genes is
    first reduced to 2000 by :mod:`dpsc.methods.hvg`'s release (the statistic of
    ``highly_variable_genes``), with 10 % of ε, inside the same record. The model, and
    ``export_shared``, then use those genes. Under DP the only check that
    reads the cells is the local refusal of NaN or infinite values, before anything is booked
    (``docs/privacy.md``): empty cells are zero rows, genes no cell expresses are kept (and never
    selected), negative or non-integer values are read per cell. A non-private fit checks the values
    and refuses bad input with a message.
    """
    n_clusters = DEFAULT_N_CLUSTERS if n_clusters is None else n_clusters
    matrix = get_matrix(adata, layer)
    check_choice("likelihood", likelihood, LIKELIHOODS)
    model_kwargs = _model_kwargs(scope, input_pcs, adata.n_vars)
    unit, weights = unit_and_weights(adata, donor_key, "dpsc.tl.fit")
    public = reference_for_fit(
        reference, reference_key, reference_model, adata, scope, input_pcs, likelihood, n_clusters
    )
    run = {k: train_kwargs.pop(k) for k in RUN_OPTIONS if k in train_kwargs}
    _check_donor_fit(unit, epsilon, run)
    _join_data_parallel(run)
    if public is not None and batch_size is None:  # a rule of n alone (reads no cell)
        batch_size = max(1, round(REFERENCE_FINE_TUNING_RATE * adata.n_obs))
    settings = _settings(
        train_kwargs,
        epoch_defaults=_epoch_defaults(scope, input_pcs, public is not None),
        epsilon=epsilon,
        delta=delta,
        scope=scope,
        max_epochs=max_epochs,
        batch_size=batch_size,
        accountant=accountant,
        optimizer=optimizer,
        random_state=random_state,
        noise_seed=noise_seed,
    )
    donors = None if weights is None else DonorRows.of(donor_codes(adata, donor_key, "dpsc.tl.fit"))
    plan = _plan_for(
        adata, settings, n_clusters, model_kwargs, (scope, input_pcs, likelihood), public, (unit, donors)
    )
    _check_input_for(plan, adata, matrix, layer, likelihood, model_kwargs)
    if weights is not None:
        warn_if_noise_dominated(plan.start, n_donors(weights), unit, "dpsc.tl.fit")
    check_cells(adata, matrix, "dpsc.tl.fit", likelihood == "zinb", "likelihood='gaussian'")

    call = {
        "n_clusters": n_clusters,
        "scope": scope,
        "layer": layer,
        "likelihood": likelihood,
        "accountant": accountant,
        "key_added": key_added,
        "cluster_key": cluster_key,
        "donor_key": donor_key,
    }
    with plan.releases.spend(adata, plan.planned_record(adata.n_obs), key_added, plan.noise) as spent:
        target = result_target(adata, copy)
        training = (matrix, plan, model_kwargs, public, run, weights)
        model, selection, genes = _train(target, *training, call, random_state, progress_bar)
        trained = (model, selection, genes, model_kwargs, public)
        return _store(adata, target, plan, spent.booking, trained, call, copy, return_model)


def _store(
    adata: ad.AnnData,
    target: ad.AnnData,
    plan: FitPlan,
    booking: Any,
    trained: tuple[DPDCAN, _selection.Selection | None, np.ndarray | None, dict, ReferenceFit | None],
    call: dict[str, Any],
    copy: bool,
    return_model: bool,
) -> ad.AnnData | DPDCAN | tuple[ad.AnnData, DPDCAN] | None:
    """Write the embedding, labels, record and parameters of a trained fit (scanpy's return rule).

    ``trained``: the model, the partition choice, the genes it reads, its options and the public
    reference (``None`` without one); ``booking`` is settled with the model's record.
    """
    model, selection, genes, model_kwargs, public = trained
    key_added, cluster_key = call["key_added"], call["cluster_key"]
    label_counts, in_use = _write_embedding_and_labels(
        target, model, selection, genes, (key_added, cluster_key), plan
    )
    extra = {} if public is None else reference_outputs(target, public, model, selection, call)
    return store_result(
        adata,
        target,
        key_added,
        model.privacy_record(),
        _fit_params(plan, model, selection, genes, model_kwargs, **call),
        copy=copy,
        booking=booking,
        model=model,
        return_model=return_model,
        cluster_frequencies=model.released_frequencies(),
        label_counts=label_counts,
        clusters_in_use=in_use,
        **extra,
    )


def _fit_params(
    plan: FitPlan,
    model: DPDCAN,
    selection: _selection.Selection | None,
    genes: np.ndarray | None,
    model_kwargs: dict,
    **named: Any,
) -> dict[str, Any]:
    """Return the call's parameters as ``uns[key_added]["params"]`` stores them, with the training's."""
    return {
        "method": "dpdcan",
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "n_clusters": named["n_clusters"],
        "scope": named["scope"],
        "input_pcs": -1 if model_kwargs["input_pcs"] is None else model_kwargs["input_pcs"],
        "layer": named["layer"],
        "likelihood": named["likelihood"],
        "accountant": named["accountant"],
        "key_added": named["key_added"],
        "cluster_key": named["cluster_key"],
        "donor_key": named["donor_key"],
        "genes_selected": -1 if genes is None else int(genes.sum()),
        **model.train_params_,
        **_partition_params(selection),
    }


def _plan_for(
    adata: ad.AnnData,
    settings: TrainSettings,
    n_clusters: int,
    model_kwargs: dict,
    model: tuple[str, int | str | None, str],
    public: ReferenceFit | None,
    individual: tuple[PrivacyUnit, DonorRows | None],
) -> FitPlan:
    """Plan and calibrate the fit's releases for these cells' shape (reads no cell).

    ``model``: ``(scope, input_pcs, likelihood)``; ``individual``: the unit of privacy and, per
    donor, each donor's rows. The model's input then reads as many components as the plan's start
    releases.
    """
    scope, input_pcs, likelihood = model
    unit, donors = individual
    if public is not None:
        return plan_fit(
            settings,
            adata.n_obs,
            n_clusters=n_clusters,
            input_pcs=None,
            latent_scale=DEFAULT_LATENT_SCALE,
            likelihood=REFERENCE_MODEL["likelihood"],
            start_n_vars=adata.n_vars,
            start_basis=public.basis,
            reference=public.summary,
            unit=unit,
            donors=donors,
        )
    plan = plan_fit(
        settings,
        adata.n_obs,
        n_clusters=n_clusters,
        input_pcs=model_kwargs["input_pcs"],
        latent_scale=DEFAULT_LATENT_SCALE,
        likelihood=likelihood,
        select_genes=adata.n_vars > MODEL_GENES,
        start_n_vars=adata.n_vars if _starts_from_clustering(scope, input_pcs, likelihood) else None,
        unit=unit,
        donors=donors,
    )
    if plan.start is not None:
        model_kwargs["input_pcs"] = plan.start.n_comps
    return plan


def _check_donor_fit(unit: PrivacyUnit, epsilon: float | None, run: dict[str, Any]) -> None:
    """Refuse a donor-level fit without ε or over several processes (reads no cell)."""
    if unit.donor_key is None:
        return
    if epsilon is None:
        raise ValueError(
            "dpsc.tl.fit: donor_key protects each donor under DP, and epsilon=None trains without noise. "
            "Pass an epsilon, or drop donor_key."
        )
    if run.get("devices") not in (None, 1, "auto") or run.get("strategy") not in (None, "auto"):
        raise ValueError(
            "dpsc.tl.fit: a donor-level fit draws donors in one process; drop devices= and strategy= "
            "(data-parallel training shards cells, not donors)."
        )


def _join_data_parallel(run: dict[str, Any]) -> None:
    """Join the group of a data-parallel fit's processes before any release (reads no cell).

    Every process must make each release alike (one noise key, :func:`dpsc.privacy.shared_noise_source`),
    so the processes must all exist when the first release is made: started together by
    ``torchrun`` (each with ``LOCAL_RANK``), not by Lightning's launcher, which starts the others
    only when training begins, after this process's start clustering.
    """
    devices, cpu = run.get("devices"), run.get("accelerator") == "cpu" or not torch.cuda.is_available()
    if isinstance(devices, list | tuple):
        devices = len(devices)
    elif devices in (-1, "-1", "auto") and not cpu and torch.cuda.device_count() > 1:
        raise ValueError(
            f"dpsc.tl.fit: devices={run['devices']!r} would train on every GPU; pass devices=N and launch "
            "the script with `torchrun --nproc-per-node N script.py`."
        )
    if not (isinstance(devices, int) and devices > 1):
        return
    if "LOCAL_RANK" not in os.environ:
        raise ValueError(
            f"dpsc.tl.fit: devices={devices} trains on {devices} processes, which must all run this "
            "script from its start, so that the releases made before training are made alike on "
            f"each. Launch it with `torchrun --nproc-per-node {devices} script.py` (Lightning's own "
            "launcher would start the other processes after this one's releases)."
        )
    join_process_group(devices, "gloo" if cpu else "nccl")


def _train(
    target: ad.AnnData,
    matrix,
    plan: FitPlan,
    model_kwargs: dict,
    public: ReferenceFit | None,
    run: dict[str, Any],
    weights: np.ndarray | None,
    call: dict[str, Any],
    random_state: int,
    progress_bar: bool,
) -> tuple[DPDCAN, _selection.Selection | None, np.ndarray | None]:
    """Make the releases before training, build the model from them and train it under the plan.

    Returns the trained model, the choice between the start's partition and the model's (``None``
    when the fit does not start from the clustering) and the genes the model reads (``None``: all).
    With a public reference the model reads each cell's point in its basis and starts from the
    weights pretrained on it (the reference model). ``call``: ``tl.fit``'s named
    choices (``n_clusters``, ``likelihood``, ``layer``, …); ``weights``: each cell's donor weight
    (the donor unit) for the start's and the choice's sums.
    """
    n_clusters, likelihood, layer = call["n_clusters"], call["likelihood"], call["layer"]
    basis = None if public is None else public.basis
    start, genes = release_before_training(matrix, likelihood, plan, basis, weights)
    if public is None:
        train_on = target if genes is None else target[:, genes].copy()
        DPDCAN.setup_anndata(train_on, layer=layer)
        torch.manual_seed(random_state)  # the module's weights are drawn when the model is built
        model = DPDCAN(train_on, n_clusters=n_clusters, likelihood=likelihood, **model_kwargs)
    else:
        model = public.model(matrix, n_clusters, random_state, progress_bar)
    choice: dict[str, _selection.Selection] = {}
    after_training = None
    if start is not None:
        start_model_from(model, start)

        def after_training() -> None:
            choice["selection"] = choose_partition(matrix, start, model, plan, weights)

    model.train(planned=PlannedTraining(plan, after_training), progress_bar=progress_bar, **run)
    return model, choice.get("selection"), genes


def _check_input_for(
    plan: FitPlan, adata: ad.AnnData, matrix, layer, likelihood: str, model_kwargs: dict
) -> None:
    """Check the input as the plan needs it; warn when the cells are few for the noise (reads no cell)."""
    if plan.settings is None:  # a fit that selects genes (itself or by its start) trains on fewer
        # a fit on a reference's points reads no gene column directly: a gene no cell has is fine
        check_matrix(matrix, likelihood, training="genes" not in plan.releases and plan.reference is None)
        return
    check_public_counts(adata, layer, likelihood == "zinb", "dpsc.tl.fit", "likelihood='gaussian'")
    if plan.unit.donor_key is not None:  # the regime warning speaks for the donors
        return
    message = small_data_message(
        adata.n_obs,
        plan.sample_rate,
        plan.settings.noise_multiplier,
        plan.epsilon,
        model_kwargs["input_pcs"] is not None,
    )
    if message:
        warnings.warn(message, UserWarning, stacklevel=3)


def _write_embedding_and_labels(
    target: ad.AnnData,
    model: DPDCAN,
    selection: _selection.Selection | None,
    genes: np.ndarray | None,
    keys: tuple[str, str],
    plan: FitPlan,
) -> tuple[np.ndarray, int]:
    """Write the embedding, the labels of the kept partition and the genes read; count clusters in use.

    ``keys``: ``(key_added, cluster_key)``. Returns the released label counts (exact for a
    non-private fit) and the clusters in use; warns when fewer than half of the clusters are
    (released values only).
    """
    key_added, cluster_key = keys
    label_counts, count_noise = model.released_label_counts(), model.label_count_noise_
    if selection is not None:
        if selection.kept == "clustering":
            model.keep_start_partition()  # the model labels cells by the clustering's centroids
        label_counts, count_noise = selection.kept_counts, selection.count_noise
    n_clusters = model.n_clusters
    target.obsm[key_added], labels = model.latent_and_labels()
    target.obs[cluster_key] = cluster_labels(labels, n_clusters)
    if genes is not None:
        target.var[derived_key(key_added, "gene")] = genes
    if label_counts is None:  # a non-private fit: the written labels, counted exactly
        label_counts = np.bincount(labels, minlength=n_clusters).astype(np.float64)
    in_use = clusters_above_noise(label_counts, count_noise)
    if in_use < n_clusters / 2:
        message = collapse_message(in_use, n_clusters, plan.epsilon, plan.unit.donor_key is not None)
        warnings.warn(message, UserWarning, stacklevel=4)
    return label_counts, in_use


def _partition_params(selection: _selection.Selection | None) -> dict[str, Any]:
    """Return the recorded choice between the clustering's partition and the model's (none without it)."""
    if selection is None:
        return {}
    return {"partition": selection.kept, "partition_scores": list(selection.scores)}


def _starts_from_clustering(scope: str, input_pcs: int | str | None, likelihood: str) -> bool:
    """Whether the fit starts from the private clustering: the default model on counts (reads no cell)."""
    return scope != "paper" and input_pcs == "auto" and likelihood == "zinb"


def _epoch_defaults(scope: str, input_pcs: int | str | None, reference: bool) -> dict[str, int]:
    """Per-stage epochs a fit uses unless given: the fine-tuning's on a reference, the PC model's."""
    if reference:
        return REFERENCE_FINE_TUNING_EPOCHS
    return PC_MODEL_EPOCHS if scope != "paper" and input_pcs == "auto" else {}


def _settings(train_kwargs: dict[str, Any], *, epoch_defaults: dict[str, int], **named: Any) -> TrainSettings:
    """One :class:`TrainSettings` from ``tl.fit``'s named arguments and extra plan keywords.

    ``train_kwargs`` may hold plan options only; an unknown keyword is refused.
    """
    unknown = sorted(set(train_kwargs) - set(PLAN_OPTIONS))
    if unknown:
        raise TypeError(
            f"dpsc.tl.fit got unexpected keyword argument(s) {unknown}; it takes "
            f"{sorted(PLAN_OPTIONS + RUN_OPTIONS)} "
            "besides its named parameters."
        )
    if named["max_epochs"] is None:
        for name, epochs in epoch_defaults.items():
            train_kwargs.setdefault(name, epochs)
    return TrainSettings(**named, **train_kwargs)


def collapse_message(in_use: int, n_clusters: int, epsilon: float | None, per_donor: bool = False) -> str:
    """Say that the released label counts leave few clusters in use, why, and what helps."""
    if per_donor:
        return (
            f"Only {in_use} of the {n_clusters} clusters hold a share above the noise of the released "
            "label counts. Per donor these counts weigh each donor's cells 1 in total, so with few donors "
            "per cluster they sit near their noise: this says little about the partition itself (each "
            "cell's label is its nearest centroid). What helps: more donors (more sites), a larger "
            "epsilon. This note reads only released values, so it costs no privacy."
        )
    cause = (
        f"under DP (epsilon={epsilon:g}) the centroids and embedding are trained with noise, so cell "
        "types with few cells, or close to a larger one, are absorbed by their neighbours"
        if epsilon is not None
        else "without noise this means the cells support fewer separate groups in the embedding"
    )
    return (
        f"Only {in_use} of the {n_clusters} clusters hold a share of the cells above the noise of the "
        f"released label counts: {cause}. What helps: a larger epsilon, more cells, "
        "or dpsc.tl.cluster (the proven private pipeline). This note reads only released "
        "values, so it costs no privacy."
    )


def _model_kwargs(scope: str, input_pcs: int | str | None, n_vars: int) -> dict:
    """DPDCAN's architecture options for ``scope`` and ``input_pcs`` (checked; reads no cell)."""
    if input_pcs == "auto":
        if scope == "paper":
            return {"input_pcs": None}
        genes = min(n_vars, MODEL_GENES)
        return {**PC_MODEL, "input_pcs": min(PC_MODEL["input_pcs"], genes - 1)}
    check_input_pcs(input_pcs, min(n_vars, MODEL_GENES))
    return {"input_pcs": input_pcs}
