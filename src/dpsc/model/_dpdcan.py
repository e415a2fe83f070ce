"""DP-DCAN: differentially private deep contrastive autoencoder network (scvi-tools model)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import anndata as ad
import numpy as np
import torch
from scvi import REGISTRY_KEYS
from scvi.data import AnnDataManager
from scvi.data.fields import LayerField
from scvi.model.base import BaseModelClass, UnsupervisedTrainingMixin
from scvi.train import TrainRunner
from sklearn.cluster import KMeans

from .._validation import (
    check_fit_args,
    check_input_pcs,
    check_matrix,
    check_privacy_args,
    check_target_frequency,
    get_matrix,
)
from ..module import DCANModule
from ..optim import DEFAULT_PRIVATE_LRS, OPTIMIZERS
from ..pp._dp_pca import DEFAULT_PCA_GENES, release_loadings, second_moment
from ..privacy import (
    DPSGDSettings,
    PrivacyRecord,
    broadcast_from_rank_zero,
    dp_cluster_frequency,
    dp_kmeans_centroids,
    make_accountant,
    spent_epsilon,
)
from ..train import DCANTrainingPlan, PoissonDataSplitter
from ..train._progress import FitProgress, quiet_training_logs
from ._dcan_privacy import DCANPrivacyPlan, dcan_record, plan_fit

logger = logging.getLogger(__name__)

#: Training-plan options of :meth:`DPDCAN.train` (``plan_kwargs`` overrides them), as scvi's
#: ``plan_kwargs``: learning rates (``None``: the private optimizer's row of
#: :data:`dpsc.optim.DEFAULT_PRIVATE_LRS`), instance-stage weight ``rho`` and masking rate,
#: cluster-stage loss weights ``betas`` (ZINB, DEC, separation) and target sharpening, DEC's
#: cluster frequencies, and whether the cluster stage trains the encoder.
DEFAULT_PLAN_OPTIONS: dict[str, object] = {
    "instance_lr": 1e-3,
    "cluster_lr": 0.1,
    "private_lr": None,
    "cluster_private_lr": None,
    "rho": 0.8,
    "mask_rate": 0.2,
    "betas": (0.4, 0.4, 0.2),
    "target_power": 2.0,
    "target_frequency": "released",
    "cluster_train_encoder": True,
}

#: Options of the DP k-means start (:func:`~dpsc.privacy.dp_kmeans_centroids`) used by
#: :meth:`DPDCAN.train` unless ``kmeans_kwargs`` overrides them: clipping radius (``None``: the
#: latent sphere's radius, which clips nothing), 40 sketch releases with 2^6 buckets, 4 noisy Lloyd
#: rounds of 40 releases with 3k centroids reduced to k, count column weighted 0.3·R
#: (``benchmarks/results/dpdcan.md``).
DEFAULT_KMEANS_OPTIONS: dict[str, object] = {
    "clip_norm": None,
    "n_sketch_steps": 40,
    "n_lloyd_rounds": 4,
    "steps_per_round": 40,
    "n_bits": 6,
    "oversampling": 3,
    "count_scale": 0.3,
}


def merged_options(given: dict | None, defaults: dict, name: str) -> dict:
    """``defaults`` updated by ``given``; an unknown key fails and names the known ones."""
    unknown = sorted(set(given or {}) - set(defaults))
    if unknown:
        raise ValueError(f"{name} does not take {unknown}; it takes {sorted(defaults)}.")
    return {**defaults, **(given or {})}


SHARED_WEIGHTS = "shared_encoder.pt"
SHARED_META = "shared_encoder.json"


class DPDCAN(UnsupervisedTrainingMixin, BaseModelClass):
    """Differentially private deep contrastive autoencoder network (Li et al. 2024).

    A ZINB autoencoder (encoder 2000→256→64→32 by default) trained in two stages (paper
    Alg. 1): an *instance* stage (ZINB + per-cell contrastive loss between two masked views)
    and a *cluster* stage (ZINB + per-cell DEC loss + centroid separation), with DP-SGD noise on
    the encoder and the centroids (``scope="encoder"``, "partial network perturbation") or on
    every parameter (``scope="full"``, DPE-DCAN).

    Parameters
    ----------
    adata
        AnnData registered with :meth:`setup_anndata`.
    n_clusters
        Number of clusters.
    n_latent
        Latent dimension.
    n_hidden
        Encoder hidden widths.
    likelihood
        ``"zinb"`` (raw counts) or ``"gaussian"`` (continuous, e.g. log-normalised data).
    latent_scale
        Radius of the latent sphere (see :class:`~dpsc.module.DCANModule`); ``None`` for an
        unconstrained latent (then pass ``kmeans_kwargs={"clip_norm": ...}`` to :meth:`train`).
    input_pcs
        ``None``: the encoder reads the genes and the decoder models the counts (ZINB). An
        integer: :meth:`train` first releases that many principal components of the cells (one
        Gaussian release of their gene second-moment matrix, :func:`dpsc.pp.pca`'s, inside the
        fit's ε), the encoder reads each cell's projection on these frozen loadings and the
        decoder reconstructs it. Far fewer parameters receive DP-SGD noise; this is what
        ``dpsc.tl.fit(scope="full")`` uses.

    Examples
    --------
    >>> adata = dpsc.datasets.pbmc4k()
    >>> dpsc.model.DPDCAN.setup_anndata(adata)
    >>> model = dpsc.model.DPDCAN(adata, n_clusters=8)
    >>> model.train(epsilon=8.0)
    >>> adata.obsm["X_dpdcan"] = model.get_latent_representation()
    """

    _module_cls = DCANModule
    _training_plan_cls = DCANTrainingPlan
    _data_splitter_cls = PoissonDataSplitter
    _train_runner_cls = TrainRunner

    def __init__(
        self,
        adata: ad.AnnData,
        n_clusters: int = 8,
        n_latent: int = 32,
        n_hidden: Sequence[int] = (256, 64),
        likelihood: str = "zinb",
        latent_scale: float | None = 3.0,
        input_pcs: int | None = None,
    ):
        super().__init__(adata)
        check_input_pcs(input_pcs, self.summary_stats.n_vars)
        self.module = self._module_cls(
            n_input=self.summary_stats.n_vars,
            n_clusters=n_clusters,
            n_latent=n_latent,
            n_hidden=tuple(n_hidden),
            likelihood=likelihood,
            latent_scale=latent_scale,
            input_pcs=input_pcs,
        )
        self.n_clusters = n_clusters
        self.privacy_: dict = {}
        self._record: PrivacyRecord | None = None
        self._model_summary_string = (
            f"DPDCAN: {self.summary_stats.n_vars} genes → {tuple(n_hidden)} → {n_latent} latent, "
            f"{n_clusters} clusters, {likelihood} likelihood"
            + ("" if input_pcs is None else f", reading {input_pcs} DP principal components")
        )
        self.init_params_ = self._get_init_params(locals())

    @classmethod
    def setup_anndata(cls, adata: ad.AnnData, layer: str | None = None, **kwargs) -> None:
        """Register ``adata`` (raw counts in ``X`` or ``layers[layer]``) with scvi-tools.

        Parameters
        ----------
        adata
            Cells × genes.
        layer
            Layer holding the counts; ``None`` for ``adata.X``.
        **kwargs
            Passed to :meth:`scvi.data.AnnDataManager.register_fields`.
        """
        get_matrix(adata, layer)
        setup_method_args = cls._get_setup_method_args(**locals())
        fields = [LayerField(REGISTRY_KEYS.X_KEY, layer, is_count_data=False)]
        manager = AnnDataManager(fields=fields, setup_method_args=setup_method_args)
        manager.register_fields(adata, **kwargs)
        cls.register_manager(manager)

    # -- training --------------------------------------------------------------------------
    def train(
        self,
        epsilon: float | None = 8.0,
        delta: float = 1e-5,
        *,
        scope: str = "encoder",
        instance_epochs: int = 50,
        cluster_epochs: int = 40,
        batch_size: int | None = None,
        max_grad_norm: float = 0.1,
        accountant: str = "rdp",
        private_optimizer: str = "sgd",
        plan_kwargs: dict | None = None,
        kmeans_kwargs: dict | None = None,
        random_state: int = 0,
        noise_seed: int | None = None,
        accelerator: str = "auto",
        devices: int | str = 1,
        strategy: str = "auto",
        progress_bar: bool = True,
    ) -> None:
        r"""Train both stages; with ``epsilon`` the whole fit is (ε, δ)-DP (see the record).

        The noise multiplier σ is calibrated once, before training, for the total number of
        sampled-Gaussian steps of the fit: ``(instance_epochs + cluster_epochs) ×
        round(1/q)`` DP-SGD steps plus ``n_sketch_steps + n_lloyd_rounds × steps_per_round`` DP
        k-means releases (plus ``cluster_epochs`` frequency releases with
        ``target_frequency="released"``), all with Poisson rate ``q = batch_size / n_obs``
        (:func:`~dpsc.model.planned_step_counts`). The ε recorded is the accountant's value after
        the steps that actually ran. No epoch, learning rate or checkpoint is chosen from the
        data: the final model is the result.

        Parameters
        ----------
        epsilon
            Target ε; ``None`` trains the non-private DCAN.
        delta
            Target δ; must be below ``1/n_obs``.
        scope
            ``"encoder"`` (DP-DCAN; heuristic guarantee, see the record) or ``"full"``
            (DPE-DCAN; proven guarantee).
        instance_epochs, cluster_epochs
            Epochs of each stage; an epoch is ``round(1/q)`` Poisson batches.
        batch_size
            Expected batch size ``q·n`` (default 10 % of the cells).
        max_grad_norm
            Per-cell clipping norm C.
        accountant
            ``"rdp"`` or ``"prv"`` (Opacus).
        private_optimizer
            Update rule of the DP parameters in both stages, applied to Opacus's clipped and
            noised gradient: ``"sgd"`` (momentum 0.9), ``"adam"``, ``"adadelta"``, ``"dpsignsgd"``
            or ``"dpsignadam"`` (:mod:`dpsc.optim`).
        plan_kwargs
            Training-plan options, updating :data:`dpsc.model.DEFAULT_PLAN_OPTIONS`:
            ``instance_lr``/``cluster_lr`` (Adam in the instance stage, Adadelta in the cluster
            stage, for the non-private parameters and for a non-private fit),
            ``private_lr``/``cluster_private_lr`` (the DP parameters' rates per stage),
            ``rho``/``mask_rate`` (instance-stage reconstruction weight, masking rate),
            ``betas``/``target_power`` (cluster-stage weights, target sharpening),
            ``target_frequency`` (DEC's cluster frequencies :math:`f_j` in
            :math:`p_{ij} \propto q_{ij}^2/f_j`: ``"released"``, a noisy sum of the soft
            assignments of one Poisson sample per cluster epoch, one accounted step, exact in a
            non-private fit; or ``"uniform"``, :math:`f_j = 1`) and ``cluster_train_encoder``
            (``False`` keeps the instance-stage encoder and trains only the centroids and decoder
            in the cluster stage).
        kmeans_kwargs
            Options of the DP k-means start, updating :data:`dpsc.model.DEFAULT_KMEANS_OPTIONS`:
            ``clip_norm``, the release counts ``n_sketch_steps``, ``n_lloyd_rounds`` and
            ``steps_per_round`` (they set the planned steps), and ``n_bits``, ``oversampling``,
            ``count_scale`` (:func:`~dpsc.privacy.dp_kmeans_centroids`).
        random_state
            Seed of initialisation, masking and post-processing k-means. Never of the DP noise
            or the Poisson samples.
        noise_seed
            ``None`` (default): noise and Poisson samples are secret (OS entropy), so two fits
            with the same ``random_state`` differ. An integer makes them repeatable, for tests
            and benchmarks only: the record then says the guarantee does not hold against
            anyone who knows it.
        accelerator
            Lightning accelerator.
        devices, strategy
            Lightning's devices and strategy. ``devices=4, strategy="ddp"`` trains data-parallel
            over four processes (GPUs, or CPU processes over gloo): each samples its shard of
            the cells at the same rate q, the clipped sums are added across processes and the
            noise is added once per step, so σ, q, the steps and ε are those of one process
            (:mod:`dpsc.privacy._distributed`). Launch as any Lightning DDP script: every
            process runs the script and holds the AnnData.
        progress_bar
            Show one progress bar over both stages (epochs, stage, ε spent so far).
        """
        settings = self._check_train_settings(locals())
        plan = self.plan_privacy(settings)
        opts = settings["plan"]
        splitter = self._data_splitter_cls(
            self.adata_manager, plan.sample_rate, plan.counts["steps_per_epoch"], plan.noise
        )
        dp = plan.settings
        stage_common = {
            "dp": dp,
            "scope": scope,
            "private_optimizer": private_optimizer,
            **{k: opts[k] for k in ("rho", "mask_rate", "betas", "target_power")},
        }
        progress = FitProgress(instance_epochs + cluster_epochs, delta if dp else None, progress_bar)
        run = {"accelerator": accelerator, "devices": devices, "strategy": strategy, "progress": progress}
        release_loadings = None
        if self.module.input_pcs is not None:
            release_loadings = self._loadings_release(plan)
            if instance_epochs == 0:
                release_loadings()
        if instance_epochs > 0:
            instance = self._training_plan_cls(
                self.module,
                stage="instance",
                optimizer="adam",
                lr=opts["instance_lr"],
                private_lr=opts["private_lr"],
                before_training=release_loadings,
                seed=random_state,
                **stage_common,
            )
            self._run_stage(instance, splitter, instance_epochs, "instance stage", **run)
        self._init_centroids(splitter, dp, settings["kmeans"], random_state)
        if cluster_epochs > 0:
            released = opts["target_frequency"] == "released"
            frequency = self._frequency_source(splitter, dp) if released else None
            cluster = self._training_plan_cls(
                self.module,
                stage="cluster",
                optimizer="adadelta",
                lr=opts["cluster_lr"],
                private_lr=opts["cluster_private_lr"],
                frequency_source=frequency,
                train_encoder=opts["cluster_train_encoder"],
                seed=random_state + 2,
                **stage_common,
            )
            self._run_stage(cluster, splitter, cluster_epochs, "cluster stage", **run)
        progress.close()
        self.module.eval()
        self.is_trained_ = True
        spent = None if dp is None else spent_epsilon(dp.accountant, delta)
        self._record = dcan_record(plan, self.adata.n_obs, spent=spent)
        self.privacy_ = self._record.to_dict()
        self.train_params_ = self._train_params(settings, plan)

    def privacy_record(self) -> PrivacyRecord:
        """Return the :class:`~dpsc.privacy.PrivacyRecord` of the last ``train``."""
        if self._record is None:
            raise RuntimeError("Train the model first: it has no privacy record yet.")
        return self._record

    def _check_train_settings(self, given: dict) -> dict:
        """Validate ``train``'s arguments before any work; fill the defaults that depend on them."""
        if self.is_trained_:
            raise RuntimeError(
                "This model is already trained. Training it again would start a new privacy "
                "record that ignores what the weights already learned from the cells; build a "
                "new model (or dpsc.tl.fit) instead."
            )
        s = {k: v for k, v in given.items() if k != "self"}
        s["input_pcs"] = self.module.input_pcs
        n_obs = self.adata.n_obs
        s["batch_size"] = check_fit_args(
            n_obs=n_obs, n_clusters=self.n_clusters, scope=s["scope"], batch_size=s["batch_size"]
        )
        check_privacy_args(s["epsilon"], s["delta"], n_obs)
        check_matrix(self.adata_manager.get_from_registry(REGISTRY_KEYS.X_KEY), self.module.likelihood)
        make_accountant(s["accountant"])  # rejects unknown names
        if s["private_optimizer"] not in OPTIMIZERS:
            raise ValueError(f"Unknown optimizer {s['private_optimizer']!r}; choose one of {OPTIMIZERS}.")
        s["plan"], s["kmeans"] = self.check_options(
            s["plan_kwargs"], s["kmeans_kwargs"], s["private_optimizer"]
        )
        if s["kmeans"]["clip_norm"] is None:
            if self.module.latent_scale is None:
                raise ValueError(
                    "With latent_scale=None, pass kmeans_kwargs={'clip_norm': ...} (the DP k-means "
                    "clipping radius)."
                )
            s["kmeans"]["clip_norm"] = float(self.module.latent_scale)
        return s

    @staticmethod
    def check_options(
        plan_kwargs: dict | None, kmeans_kwargs: dict | None, private_optimizer: str = "sgd"
    ) -> tuple[dict, dict]:
        """Return the full plan and k-means options (defaults filled); refuse unknown or bad ones."""
        if private_optimizer not in OPTIMIZERS:
            raise ValueError(f"Unknown optimizer {private_optimizer!r}; choose one of {OPTIMIZERS}.")
        plan = merged_options(plan_kwargs, DEFAULT_PLAN_OPTIONS, "plan_kwargs")
        kmeans = merged_options(kmeans_kwargs, DEFAULT_KMEANS_OPTIONS, "kmeans_kwargs")
        lrs = DEFAULT_PRIVATE_LRS[private_optimizer]
        if plan["private_lr"] is None:
            plan["private_lr"] = lrs["dpdcan_instance"]
        if plan["cluster_private_lr"] is None:
            plan["cluster_private_lr"] = lrs["dpdcan_cluster"]
        check_target_frequency(plan["target_frequency"])
        return plan, kmeans

    def plan_privacy(self, settings: dict) -> DCANPrivacyPlan:
        """Planned steps, calibrated σ and DP-SGD settings of a fit (:func:`plan_fit`; reads no cell)."""
        plan = plan_fit(settings, self.adata.n_obs)
        if plan.settings is not None:
            logger.info(
                "Calibrated noise multiplier %.4f for %d steps at q=%.4f",
                plan.settings.noise_multiplier,
                plan.counts["total"],
                plan.sample_rate,
            )
        return plan

    @staticmethod
    def _train_params(settings: dict, plan: DCANPrivacyPlan) -> dict:
        """Return the settings recorded in ``uns``: the plan options flat, the k-means ones nested."""
        keep = (
            "instance_epochs",
            "cluster_epochs",
            "batch_size",
            "private_optimizer",
            "random_state",
            "noise_seed",
        )
        params = {k: settings[k] for k in keep}
        params.update(settings["plan"])
        params["betas"] = list(params["betas"])
        params["kmeans"] = dict(settings["kmeans"])
        params["planned_steps"] = plan.counts["total"]
        return params

    def _run_stage(
        self, plan, splitter, epochs, name, accelerator, devices, strategy, progress: FitProgress
    ) -> None:
        progress.start_stage(name, None if plan.dp is None else plan.dp.accountant)
        self.module.train()
        self.history_ = None  # per-stage logs are not kept: under DP they are exact statistics
        self.is_trained_ = False
        try:
            with quiet_training_logs():  # the Trainer logs when built and when it stops
                runner = self._train_runner_cls(
                    self,
                    training_plan=plan,
                    data_splitter=splitter,
                    max_epochs=epochs,
                    accelerator=accelerator,
                    devices=devices,
                    strategy=strategy,
                    use_distributed_sampler=False,  # the splitter shards and Poisson-samples itself
                    enable_progress_bar=False,
                    callbacks=[progress],
                    enable_model_summary=False,
                    enable_checkpointing=False,
                    num_sanity_val_steps=0,
                    limit_val_batches=0,
                )
                runner()
        except BaseException:
            progress.close()
            raise
        finally:
            plan.detach_privacy()
            if plan.dp is not None:
                self.history_ = None

    def _loadings_release(self, plan: DCANPrivacyPlan):
        r"""Callable that releases the frozen input loadings (once) and loads them into the module.

        It sums :math:`u_i u_i^\top` over every training cell, :math:`u_i` the cell's
        log1p(CP10k) row scaled to norm 1 (sensitivity 1; :func:`~dpsc.pp._dp_pca.second_moment`,
        sparse row blocks), and makes one Gaussian release at
        :math:`\sigma_V` (exact in a non-private fit) with :func:`dpsc.pp.pca`'s gene block and
        dropped mean component (:func:`~dpsc.pp._dp_pca.release_loadings`); the accountant is told
        :math:`(\sigma_V, q = 1)`. Under data parallelism every process holds all cells and
        receives rank 0's release.
        """

        @torch.no_grad()
        def release() -> None:
            module = self.module
            cells = self.adata_manager.get_from_registry(REGISTRY_KEYS.X_KEY)
            sigma = plan.loadings_noise_multiplier
            loadings, _, _ = release_loadings(
                second_moment(cells, log_normalize=module.likelihood == "zinb"),
                sigma,
                module.input_pcs,
                n_genes=DEFAULT_PCA_GENES,
                drop_mean_component=True,
                rng=plan.noise.numpy_rng("loadings"),
            )
            device = module.input_loadings.device
            loadings = torch.as_tensor(loadings, dtype=module.input_loadings.dtype, device=device)
            module.set_input_loadings(broadcast_from_rank_zero(loadings))
            if plan.settings is not None:
                plan.settings.accountant.step(noise_multiplier=sigma, sample_rate=1.0)

        return release

    def _encode_poisson_batch(self, splitter) -> torch.Tensor:
        """Latent codes of one fresh Poisson sample of the training cells (rate q)."""
        device = next(self.module.parameters()).device
        x = splitter.sample_batch()[REGISTRY_KEYS.X_KEY].to(device)
        return self.module.encode(self.module.represent(x))

    def _frequency_source(self, splitter, dp: DPSGDSettings | None):
        """Callable releasing DEC's cluster frequencies (noisy under ``dp``, exact otherwise)."""
        device = next(self.module.parameters()).device
        if dp is None:

            def exact() -> torch.Tensor:
                frequency = torch.as_tensor(self.predict_proba().sum(0), dtype=torch.float32)
                self.module.train()  # predict_proba leaves the module in eval mode
                return frequency.to(device)

            return exact
        gen = dp.noise.torch_generator("releases")

        def release() -> torch.Tensor:
            q = self.module.soft_assignment(self._encode_poisson_batch(splitter)).cpu()
            frequency = dp_cluster_frequency(q, noise_multiplier=dp.noise_multiplier, generator=gen)
            dp.record_release()
            return broadcast_from_rank_zero(frequency.float().to(device))

        return release

    @torch.no_grad()
    def _init_centroids(self, splitter, dp: DPSGDSettings | None, kmeans: dict, random_state: int) -> None:
        """k-means initialisation: DP releases under ``dp``, plain k-means otherwise."""
        self.module.eval()
        centroids = self.module.clustering.centroids
        if dp is None:
            z = self.get_latent_representation()
            km = KMeans(n_clusters=self.n_clusters, n_init=20, random_state=random_state).fit(z)
            centroids.copy_(torch.as_tensor(km.cluster_centers_, dtype=centroids.dtype))
            return
        init = dp_kmeans_centroids(
            lambda: self._encode_poisson_batch(splitter).cpu(),
            self.n_clusters,
            noise_multiplier=dp.noise_multiplier,
            record_step=dp.record_release,
            generator=dp.noise.torch_generator("releases"),
            sphere_radius=self.module.latent_scale,
            random_state=random_state,
            **kmeans,
        )
        init = broadcast_from_rank_zero(torch.as_tensor(init, dtype=centroids.dtype, device=centroids.device))
        centroids.copy_(init)

    # -- inference -------------------------------------------------------------------------
    @torch.no_grad()
    def _inference(self, adata: ad.AnnData | None, batch_size: int) -> dict[str, np.ndarray]:
        """Latent codes and soft assignments of every cell, one loader batch at a time.

        The outputs are allocated once and filled in place: collecting per-batch tensors and
        concatenating them interleaves small long-lived blocks with each batch's freed dense
        copy, and the allocator then kept memory that grows with the number of cells (0.95 GB
        at 10⁵ cells and 6.2 GB at 10⁶, 2000 genes).
        """
        adata = self._validate_anndata(adata)
        loader = self._make_data_loader(adata=adata, batch_size=batch_size, shuffle=False)
        self.module.eval()
        z = np.empty((adata.n_obs, self.module.n_latent), dtype=np.float32)
        q = np.empty((adata.n_obs, self.n_clusters), dtype=np.float32)
        start = 0
        for tensors in loader:
            out = self.module.inference(tensors[REGISTRY_KEYS.X_KEY])
            stop = start + out["z"].shape[0]
            z[start:stop] = out["z"].cpu().numpy()
            q[start:stop] = out["q"].cpu().numpy()
            start = stop
        return {"z": z, "q": q}

    def get_latent_representation(
        self, adata: ad.AnnData | None = None, batch_size: int = 1024
    ) -> np.ndarray:
        """Latent codes ``(n_cells, n_latent)`` from the encoder."""
        return self._inference(adata, batch_size)["z"]

    def predict_proba(self, adata: ad.AnnData | None = None, batch_size: int = 1024) -> np.ndarray:
        """Student-t soft cluster assignments ``(n_cells, n_clusters)``."""
        return self._inference(adata, batch_size)["q"]

    def predict(self, adata: ad.AnnData | None = None, batch_size: int = 1024) -> np.ndarray:
        """Hard cluster labels: the centroid with the largest soft assignment."""
        return self.predict_proba(adata, batch_size).argmax(1)

    # -- sharing ---------------------------------------------------------------------------
    def save(self, dir_path: str, **kwargs) -> None:
        """Save the whole model (scvi-tools format) for the data owner; not for sharing.

        The file holds the decoder too. Under ``scope="encoder"`` that decoder was trained on the
        cells without noise and carries no guarantee, so a warning is logged; share
        :meth:`export_shared` instead. No training losses are saved after a DP fit (they are
        exact statistics of the cells and are never logged).
        """
        if self.privacy_.get("guarantee") == "heuristic":
            logger.warning(
                "save() writes the noise-free decoder, which the DP guarantee does not cover: keep "
                "this file with the data owner and share export_shared() instead."
            )
        super().save(dir_path, **kwargs)

    def export_shared(self, dir_path: str | Path, overwrite: bool = False) -> Path:
        """Write the part of the model that may be shared: encoder and centroids only.

        The decoder is never written (under ``scope="encoder"`` it was trained without noise;
        under ``"full"`` it is not needed to embed or cluster new cells). The privacy record
        travels with the weights. Load with :class:`dpsc.model.SharedEncoder`.

        Parameters
        ----------
        dir_path
            Output directory.
        overwrite
            Replace existing files.
        """
        if not self.is_trained_:
            raise RuntimeError("Train the model before exporting it.")
        if not self.privacy_ or np.isnan(self.privacy_.get("epsilon", float("nan"))):
            logger.warning("Exporting a NON-PRIVATE model: its weights carry no DP guarantee.")
        out = Path(dir_path)
        out.mkdir(parents=True, exist_ok=True)
        weights, meta = out / SHARED_WEIGHTS, out / SHARED_META
        if not overwrite and (weights.exists() or meta.exists()):
            raise FileExistsError(f"{out} already holds a shared model; pass overwrite=True.")
        state = {
            k: v.cpu()
            for k, v in self.module.state_dict().items()
            if k.startswith(("encoder.", "clustering.", "input_loadings"))
        }
        torch.save(state, weights)
        init = self.init_params_["non_kwargs"]
        meta.write_text(
            json.dumps(
                {
                    "model": "DPDCAN",
                    "var_names": list(map(str, self.adata.var_names)),
                    "n_clusters": int(init["n_clusters"]),
                    "n_latent": int(init["n_latent"]),
                    "n_hidden": list(init["n_hidden"]),
                    "likelihood": init["likelihood"],
                    "latent_scale": init["latent_scale"],
                    "input_pcs": init.get("input_pcs"),
                    "privacy": {
                        k: (None if isinstance(v, float) and np.isnan(v) else _json_safe(v))
                        for k, v in self.privacy_.items()
                    },
                },
                indent=1,
            )
        )
        return out


def _json_safe(value):
    """Arrays (the Gaussian history) as nested lists, for the shared model's JSON."""
    return value.tolist() if isinstance(value, np.ndarray) else value
