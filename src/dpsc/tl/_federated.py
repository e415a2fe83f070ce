"""``dpsc.tl.fit_federated``: FedSC and baselines across sites, on Flower."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Literal

import anndata as ad
import numpy as np
import pandas as pd

from dpsc._docs import doc_params

from .._api import DEFAULT_EPSILON, renamed_arguments, result_target, store_result
from .._outputs import cluster_labels
from .._validation import check_matrix, check_site_key, federation_sites, get_matrix, resolve_delta
from ..federated import (
    METHODS,
    PER_CELL_METHODS,
    FedSCPrivacy,
    SiteSettings,
    SSLConfig,
    SSLNet,
    apply_scaling,
    dp_schedule,
    embed,
    federated_record,
    federation_plan,
    fedsc_plan,
    represent_cells,
    require_flwr,
    simulate_federation,
)
from ..methods import nearest_centroid
from ..optim import DEFAULT_PRIVATE_LRS, OPTIMIZERS
from ..privacy import NoiseSource, ReleasePlan
from ._fit import DEFAULT_N_CLUSTERS


@renamed_arguments("dpsc.tl.fit_federated", client_key="site_key")
@doc_params
def fit_federated(
    adata: ad.AnnData,
    site_key: str = "site",
    *,
    epsilon: float | None = DEFAULT_EPSILON,
    method: Literal["fedsc", "fedbyol", "fedsimsiam", "fedsimclr", "fedmoco", "fedmocov2"] = "fedsc",
    n_clusters: int | None = None,
    rounds: int = 250,
    local_epochs: int = 1,
    alpha: float = 0.7,
    delta: float | None = None,
    optimizer: Literal["sgd", "adam", "adadelta", "dpsignsgd", "dpsignadam"] = "sgd",
    max_grad_norm: float = 1.0,
    private_lr: float | None = None,
    accountant: Literal["rdp", "prv"] = "rdp",
    layer: str | None = None,
    likelihood: Literal["zinb", "gaussian"] = "zinb",
    random_state: int = 0,
    key_added: str = "X_fedsc",
    cluster_key: str = "dp_cluster",
    n_cpus: int = 2,
    scale_genes: bool | None = None,
    noise_seed: int | None = None,
    copy: bool = False,
    return_model: bool = False,
) -> ad.AnnData | SSLNet | tuple[ad.AnnData, SSLNet] | None:
    """Train a self-supervised encoder across sites with Flower; cluster the cells across sites with it.

    Each site (``obs[site_key]``) is one Flower SuperNode in the simulation engine; only the
    online encoder and predictor travel. FedSC's sites pull the global model back with the
    divergence-aware EMA (the EMA of its own module); the baselines take it as is. Afterwards
    each site embeds its own cells with the global encoder and the sites run a federated k-means
    (with ``epsilon``: DP k-means tables, each with the site's full noise); each site labels its
    own cells with the released centroids. ``obsm[key_added]`` holds the global encoder's
    embedding of every cell.

    Parameters
    ----------
    adata
        Cells × genes, raw counts (``likelihood="zinb"``) or log-normalised (``"gaussian"``).
    site_key
        ``obs`` column with the site of each cell (see :func:`dpsc.pp.partition`).
    method
        ``"fedsc"``, ``"fedbyol"``, ``"fedsimsiam"``, ``"fedsimclr"``, ``"fedmoco"`` (v1, in-batch
        negatives) or ``"fedmocov2"`` (with predictor).
    n_clusters
        k-means clusters (default 8, fixed).
    rounds, local_epochs
        Federated rounds and local epochs per round. The paper uses 300 × 5; the default
        250 × 1 does a sixth of its local training (times on the docs' Benchmarks page). One
        local epoch per round keeps the sites' models
        close to the average on non-IID sites: with the pooled gene scaling it clusters PBMC 4k
        (2 cell types per site) better than 50 × 5 and 300 × 5, and mouse bladder better than
        50 × 5 (docs, Benchmarks: "FedSC benchmark").
    alpha
        FedSC's EMA scale α (λ is set so that μ = α the first time a site compares models).
    epsilon, delta
        Client-level DP: every site trains with DP-SGD calibrated (Opacus ``accountant``) so
        that its ``rounds × local_epochs × ⌈1/q⌉`` Poisson steps spend at most ``(epsilon,
        delta)`` with respect to its own cells (``q = min(1, 128/n_k)``). Only for the methods
        with per-cell losses (``"fedsc"``, ``"fedbyol"``, ``"fedsimsiam"``). ε = 8 by default, as
        every dpsc call; ``None``: no DP (the other methods, non-private baselines).
        ``delta=None``: 10⁻⁵, or 1/(10 n_k) for the largest site above 10⁴ cells.
        The one dpsc tool without the default ε = 8: at 8 per site the clustering is not yet
        useful (docs, Benchmarks: "FedSC benchmark"), and a silent non-private default would be
        worse, so the choice is yours to state.
    optimizer, max_grad_norm, private_lr
        Update rule on the noisy gradient (``"sgd"``, ``"adam"``, ``"dpsignsgd"``,
        ``"dpsignadam"``), clipping norm C, and learning rate (default per rule:
        ``DEFAULT_PRIVATE_LRS``, not tuned on private data).
    accountant
        ``"rdp"`` or ``"prv"`` (Opacus).
    layer, likelihood
        Where the expression is and whether it is counts.
    random_state
        Seed of the initial model, local training and k-means.
    key_added, cluster_key, n_cpus
        Output keys; CPUs given to the simulation engine.
    noise_seed
        Opt-in for tests and benchmarks only: each site's DP noise and sampling are then derived
        from this seed (which the server's run configuration carries), and the record says the
        guarantee does not hold against anyone who knows it. ``None``: every site draws its own
        secret noise.
    scale_genes
        Before training, each site sends its per-gene sums once and every site z-scores its cells
        with the pooled mean and standard deviation (the pooled scaling); the final
        embedding uses the same scaling. ``None`` (default): on without ``epsilon``, off with it.
        Without it FedSC and FedBYOL collapse on PBMC 4k for seeds 1 and 2
        (docs, Benchmarks: "FedSC benchmark"). The sums carry no noise, so ``True`` is refused
        together with ``epsilon``.

    copy
        {doc_copy}
    return_model
        {doc_return_model}
        The model is the global encoder (FedSC's ``SSLNet``).

    Returns
    -------
    {doc_returns}
    Writes ``obsm[key_added]``, ``obs[cluster_key]`` and the record
    ``uns["dpsc"][key_added]`` (method, rounds, cells per site, per-round loss, wall time, privacy).
    """
    _check_fedsc_args(adata, site_key, epsilon, method, scale_genes, optimizer, rounds, local_epochs)
    scale_genes = epsilon is None if scale_genes is None else scale_genes
    n_clusters = DEFAULT_N_CLUSTERS if n_clusters is None else n_clusters
    if not 2 <= n_clusters <= adata.n_obs:
        raise ValueError(f"n_clusters must be in [2, n_obs={adata.n_obs}], got {n_clusters}.")
    matrix = get_matrix(adata, layer)
    check_matrix(matrix, likelihood, training=False)  # a gene with no count is centred only
    names, of_cell, sizes = federation_sites(adata, site_key)
    delta = resolve_delta(delta, int(sizes.max()))
    if epsilon is not None and not 0 < delta < 1 / sizes.max():
        raise ValueError(
            f"delta must be in (0, 1/n_k) for every site (largest n_k = {sizes.max()}), got {delta}."
        )
    require_flwr()

    run = FedSCRun(
        method=method,
        n_clusters=int(n_clusters),
        rounds=rounds,
        local_epochs=local_epochs,
        key_added=key_added,
        cluster_key=cluster_key,
        n_cpus=n_cpus,
        scale_genes=bool(scale_genes),
        names=names,
        sizes=sizes,
        settings={
            "method": method,
            "rounds": rounds,
            "local-epochs": local_epochs,
            "alpha": alpha,
            "seed": random_state,
            "scale-genes": bool(scale_genes),
            "n-clusters": int(n_clusters),
        },
        dp_plan=None,
        site_key=site_key,
        privacy=FedSCPrivacy(
            epsilon=epsilon,
            delta=delta,
            optimizer=optimizer,
            accountant=accountant,
            max_grad_norm=float(max_grad_norm),
            n_obs=adata.n_obs,
            noise=NoiseSource(noise_seed),
            scale_genes=bool(scale_genes),
        ),
    )
    if epsilon is not None:
        _plan_site_noise(run, float(epsilon), private_lr)
    X = represent_cells(matrix, likelihood)
    parts = [X[of_cell == name] for name in names]
    planned = federated_record(run.dp_plan, run.privacy)
    with federation_plan(run.dp_plan).spend(adata, planned, key_added) as spent:
        return _run_fedsc(adata, X, parts, run, copy, return_model, spent.booking)


@dataclass
class FedSCRun:
    """What one ``fit_federated`` run is: its options, its sites, the Flower run config, its noise plan."""

    method: str
    n_clusters: int
    rounds: int
    local_epochs: int
    key_added: str
    cluster_key: str
    n_cpus: int
    scale_genes: bool
    names: list[str]
    sizes: pd.Series
    settings: dict[str, Any]
    #: each site's plan (its DP-SGD training and its k-means tables, :func:`fedsc_plan`); ``None``: no DP
    dp_plan: dict[str, ReleasePlan] | None
    site_key: str
    privacy: FedSCPrivacy


def _check_fedsc_args(
    adata: ad.AnnData,
    site_key: str,
    epsilon: float | None,
    method: str,
    scale_genes: bool | None,
    optimizer: str,
    rounds: int,
    local_epochs: int,
) -> None:
    """Refuse options that do not fit together, before any cell is read."""
    if method not in METHODS:
        raise ValueError(f"Unknown method {method!r}; choose one of {METHODS}.")
    if epsilon is not None:
        if scale_genes:
            raise ValueError(
                "scale_genes=True sends each site's per-gene sums without noise, which the "
                "client-level DP guarantee would not cover; use scale_genes=False with epsilon."
            )
        if not float(epsilon) > 0:
            raise ValueError(f"epsilon must be > 0 (or None for no DP), got {epsilon}.")
        if method not in PER_CELL_METHODS:
            raise ValueError(
                f"method={method!r} compares cells within a batch, so per-cell gradients are not "
                f"independent and DP-SGD's accounting would not hold; use one of {PER_CELL_METHODS}, or "
                "epsilon=None for a non-private baseline."
            )
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"Unknown optimizer {optimizer!r}; choose one of {OPTIMIZERS}.")
    check_site_key(adata, site_key)
    if rounds < 1 or local_epochs < 1:
        raise ValueError("rounds and local_epochs must be at least 1.")


def _plan_site_noise(run: FedSCRun, epsilon: float, private_lr: float | None) -> None:
    """Calibrate each site's DP-SGD and k-means noise for its own cells; put them in the run config.

    Site k takes ``rounds × local_epochs × ⌈1/q_k⌉`` Poisson steps at ``q_k = min(1, 128/n_k)``
    (``dp_schedule``) and its k-means tables, split so that together they
    spend ``(epsilon, delta)`` on its cells (``fedsc_plan``).
    """
    batch = SSLConfig().batch_size
    delta, accountant, optimizer = run.privacy.delta, run.privacy.accountant, run.privacy.optimizer
    run.dp_plan = {}
    for name in run.names:
        q, per_epoch = dp_schedule(int(run.sizes[name]), batch)
        steps = run.rounds * run.local_epochs * per_epoch
        run.dp_plan[name] = fedsc_plan(epsilon, delta, q, steps, accountant)
    lr = DEFAULT_PRIVATE_LRS[optimizer]["federated"] if private_lr is None else float(private_lr)
    run.settings.update(
        {
            "noise-multipliers": json.dumps([run.dp_plan[name].sigma("training") for name in run.names]),
            "kmeans-noise-multipliers": json.dumps([run.dp_plan[name].sigma("kmeans") for name in run.names]),
            "max-grad-norm": run.privacy.max_grad_norm,
            "dp-optimizer": optimizer,
            "dp-lr": lr,
        }
    )


def _run_fedsc(
    adata: ad.AnnData,
    X: np.ndarray,
    parts: list[np.ndarray],
    run: FedSCRun,
    copy: bool,
    return_model: bool,
    booking: Any,
) -> Any:
    """Run the Flower simulation, embed and cluster, and write the results (inside the booking)."""
    start = time.perf_counter()
    privacy, settings = run.privacy, run.settings
    settings.update({"n-sites": len(parts), "n-genes": int(X.shape[1])})
    site_settings = {
        k: SiteSettings(
            data=np.asarray(part, dtype=np.float32),
            epsilon=None if run.dp_plan is None else float(privacy.epsilon),
            delta=privacy.delta,
            accountant=privacy.accountant,
            noise_seed=privacy.noise.noise_seed,
        )
        for k, part in enumerate(parts)
    }
    results = simulate_federation(settings, len(parts), n_cpus=run.n_cpus, site_settings=site_settings)
    state, history, kmeans_releases = results["state"], results["history"], results["kmeans"]
    scaling = results.get("scaling")
    wall = time.perf_counter() - start
    if scaling is not None:
        X = apply_scaling(X, *scaling)

    net = SSLNet(X.shape[1], SSLConfig(method=run.method))
    net.load_shared(state)
    Z = embed(net, X)
    labels = nearest_centroid(Z, np.asarray(results["centroids"]))  # what each site computes for its cells
    target = result_target(adata, copy)
    target.obsm[run.key_added] = Z
    target.obs[run.cluster_key] = cluster_labels(labels, run.n_clusters)
    rounds_done = sorted(history)
    result = {
        "method": run.method,
        "rounds": run.rounds,
        "local_epochs": run.local_epochs,
        "sites": {name: int(run.sizes[name]) for name in run.names},
        # under DP the sites send no loss (it would be an un-noised statistic of their cells)
        "loss": [history[r]["loss"] for r in rounds_done if "loss" in history[r]],
        "mu": [history[r].get("mu", 0.0) for r in rounds_done],
        "wall_s": wall,
        "seconds_per_round": wall / run.rounds,
        "scale_genes": run.scale_genes,
        # what the sites' messages carried besides the weights (aggregated by the server)
        "reported_metrics": sorted({k for r in rounds_done for k in history[r]}),
        "kmeans_releases": kmeans_releases,
    }
    if run.dp_plan is not None:
        steps_done = [history[r].get("dp-steps", 0) for r in rounds_done]
        result["mean_dp_steps_per_round_reported"] = float(np.mean(steps_done)) if steps_done else 0.0
    record = federated_record(run.dp_plan, privacy)
    return store_result(
        adata,
        target,
        run.key_added,
        record,
        copy=copy,
        booking=booking,
        model=net,
        return_model=return_model,
        **result,
    )
