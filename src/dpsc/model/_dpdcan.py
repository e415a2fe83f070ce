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

from .._api import DEFAULT_EPSILON, renamed_arguments
from .._validation import check_input_pcs, check_matrix, get_matrix
from ..methods import (
    Assignment,
    dp_kmeans_centroids,
    kmeans_table,
    nearest_centroid,
    split_table,
    table_release,
)
from ..methods import pca as _pca
from ..module import DEFAULT_LATENT_SCALE, DCANModule, clean_input
from ..privacy import PrivacyRecord, broadcast_from_rank_zero, dp_cluster_frequency
from ..train import DCANTrainingPlan, FitProgress, PoissonDataSplitter, as_tensor, quiet_training_logs
from ._dcan_privacy import (
    FitPlan,
    PlannedTraining,
    TrainSettings,
    check_options,
    dcan_record,
    plan_fit,
)

logger = logging.getLogger(__name__)

SHARED_WEIGHTS = "shared_encoder.pt"
SHARED_META = "shared_encoder.json"


class DPDCAN(UnsupervisedTrainingMixin, BaseModelClass):
    """Differentially private deep contrastive autoencoder network (Li et al. 2024).

    A ZINB autoencoder (encoder 2000→256→64→32 by default) trained in two stages (paper
    Alg. 1): an *instance* stage (ZINB + per-cell contrastive loss between two masked views)
    and a *cluster* stage (ZINB + per-cell DEC loss + centroid separation), with DP-SGD noise on
    the encoder and the centroids while the decoder stays fixed at its data-independent
    initialisation (``scope="encoder"``, proven), on every parameter (``scope="full"``, DPE-DCAN),
    or on the encoder and centroids while the decoder trains without noise (``scope="paper"``,
    the paper's "partial network perturbation", heuristic).

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
    residual
        Whether the encoder is its input plus a learned correction that starts at zero (see
        :class:`~dpsc.module.DCANModule`): the untrained latent is the input point, so a model
        started from a clustering embeds the cells as that clustering does before training.

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
        latent_scale: float | None = DEFAULT_LATENT_SCALE,
        input_pcs: int | None = None,
        residual: bool = False,
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
            residual=residual,
        )
        self.n_clusters = n_clusters
        self._frequencies: np.ndarray | None = None
        #: Standard deviation of the noise on the last released cluster frequencies (0: exact).
        self.frequency_noise_ = 0.0
        self._label_counts: np.ndarray | None = None
        #: Standard deviation of the noise on the released label counts (0: exact).
        self.label_count_noise_ = 0.0
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
    @renamed_arguments("dpsc.model.DPDCAN.train", private_optimizer="optimizer")
    def train(
        self,
        epsilon: float | None = DEFAULT_EPSILON,
        delta: float | None = None,
        *,
        scope: str = "encoder",
        max_epochs: int | None = None,
        instance_epochs: int | None = None,
        cluster_epochs: int | None = None,
        batch_size: int | None = None,
        max_grad_norm: float = 0.1,
        accountant: str = "rdp",
        optimizer: str = "sgd",
        plan_kwargs: dict | None = None,
        kmeans_kwargs: dict | None = None,
        random_state: int = 0,
        noise_seed: int | None = None,
        accelerator: str = "auto",
        devices: int | str = 1,
        strategy: str = "auto",
        progress_bar: bool = True,
        planned: PlannedTraining | None = None,
    ) -> None:
        r"""Train both stages; with ``epsilon`` the whole fit is (ε, δ)-DP (see the record).

        The noise multiplier σ is calibrated once, before training, for the total number of
        sampled-Gaussian steps of the fit: ``(instance_epochs + cluster_epochs) × round(1/q)``
        DP-SGD steps plus ``n_sketch_steps + n_lloyd_rounds × steps_per_round`` DP k-means
        releases (plus ``cluster_epochs`` frequency releases with
        ``target_frequency="released"``) plus one release of the trained model's label counts
        (:meth:`released_label_counts`), all with Poisson rate ``q = batch_size / n_obs``
        (``plan_fit``). The ε recorded is the accountant's value
        after the steps that actually ran. No epoch, learning rate or checkpoint is chosen from the
        data: the final model is the result. The spend is booked in the AnnData's ledger
        (:meth:`dpsc.privacy.ReleasePlan.spend`): a budget refuses the fit before any work.

        Parameters
        ----------
        epsilon
            Target ε; ``None`` trains the non-private DCAN.
        delta
            Target δ; ``None``: 10⁻⁵, or 1/(10 n) above 10⁴ cells (it must be below 1/n).
        scope
            ``"encoder"`` (DP-SGD on the encoder and centroids, the decoder fixed: proven),
            ``"full"`` (DPE-DCAN, every parameter: proven) or ``"paper"`` (DP-DCAN's partial
            perturbation, the decoder trained without noise: heuristic, see the record).
        max_epochs
            Total epochs, split 5:4 between the two stages (as in ``dpsc.tl.fit``).
        instance_epochs, cluster_epochs
            Epochs of each stage (default 50 + 40); an epoch is ``round(1/q)`` Poisson batches.
        batch_size
            Expected batch size ``q·n`` (default 10 % of the cells, at most 4096).
        max_grad_norm
            Per-cell clipping norm C.
        accountant
            ``"rdp"`` or ``"prv"`` (Opacus).
        optimizer
            Update rule of the DP parameters in both stages, applied to Opacus's clipped and
            noised gradient: ``"sgd"`` (momentum 0.9), ``"adam"``, ``"adadelta"``, ``"dpsignsgd"``
            or ``"dpsignadam"`` (:mod:`dpsc.optim`).
        plan_kwargs
            Training-plan options, updating ``DEFAULT_PLAN_OPTIONS``:
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
            Options of the DP k-means start, updating ``DEFAULT_KMEANS_OPTIONS``:
            ``clip_norm``, the release counts ``n_sketch_steps``, ``n_lloyd_rounds`` and
            ``steps_per_round`` (they set the planned steps), and ``n_bits``, ``oversampling``,
            ``count_scale`` (``dp_kmeans_centroids``).
        random_state
            Seed of initialisation, masking, projections and post-processing k-means. Never of the
            DP noise or the Poisson samples.
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
            (``sum_over_ranks``). Launch as any Lightning DDP script: every
            process runs the script and holds the AnnData.
        progress_bar
            Show one progress bar over both stages (epochs, stage, ε spent so far).
        planned
            A fit planned and booked by its caller (``dpsc.tl.fit`` plans with
            ``plan_fit`` to check the budget before touching the
            AnnData, and books it in its own ledger entry):
            ``PlannedTraining``. Its plan replaces the privacy and
            schedule arguments above; ``None`` plans from them and books the fit in this model's
            AnnData.
        """
        if self.is_trained_:
            raise RuntimeError(
                "This model is already trained. Training it again would start a new privacy "
                "record that ignores what the weights already learned from the cells; build a "
                "new model (or dpsc.tl.fit) instead."
            )
        plan = None if planned is None else planned.plan
        if plan is None:
            settings = TrainSettings(
                epsilon=epsilon,
                delta=delta,
                scope=scope,
                max_epochs=max_epochs,
                instance_epochs=instance_epochs,
                cluster_epochs=cluster_epochs,
                batch_size=batch_size,
                max_grad_norm=max_grad_norm,
                accountant=accountant,
                optimizer=optimizer,
                plan_kwargs=plan_kwargs,
                kmeans_kwargs=kmeans_kwargs,
                random_state=random_state,
                noise_seed=noise_seed,
            )
            plan = self.plan_training(settings)
        self._check_training_input(plan)
        run = {
            "accelerator": accelerator,
            "devices": devices,
            "strategy": strategy,
            "progress_bar": progress_bar,
        }
        if planned is not None:
            self._train(plan, **run, after_training=planned.after_training)
            return
        with plan.releases.spend(
            self.adata, plan.planned_record(self.adata.n_obs), "DPDCAN", plan.noise
        ) as own:
            self._train(plan, **run)
            own.booking.settle(self._record)

    def plan_training(self, settings: TrainSettings) -> FitPlan:
        """Return the ``FitPlan`` of ``settings`` for this model."""
        plan = plan_fit(
            settings,
            self.adata.n_obs,
            n_clusters=self.n_clusters,
            input_pcs=self.module.input_pcs,
            latent_scale=self.module.latent_scale,
            likelihood=self.module.likelihood,
        )
        if plan.settings is not None:
            logger.info(
                "Calibrated noise multiplier %.4f for %d steps at q=%.4f",
                plan.settings.noise_multiplier,
                plan.counts["total"],
                plan.sample_rate,
            )
        return plan

    def _check_training_input(self, plan: FitPlan) -> None:
        """Non-private fits check the values (nothing to protect); private fits read public metadata only.

        Under DP, refusing because of what a cell contains would itself be an output about the cells
        (a data set fits, the same minus one cell is refused): the model reads each row through
        ``clean_input`` instead, and only scanpy's ``uns["log1p"]`` is checked.
        """
        matrix = self.adata_manager.get_from_registry(REGISTRY_KEYS.X_KEY)
        if plan.settings is None:
            check_matrix(matrix, self.module.likelihood)
            return
        registered = self.adata_manager.data_registry[REGISTRY_KEYS.X_KEY]
        in_x = registered.get("attr_name") == "X"  # the counts' layer, as setup_anndata registered it
        if self.module.likelihood == "zinb" and in_x and "log1p" in self.adata.uns:
            raise ValueError(
                "The ZINB model needs raw counts, but adata.uns['log1p'] says X is log-transformed. "
                "Pass the raw counts (layer='counts'), or likelihood='gaussian' for log-normalised data."
            )

    def _train(
        self, plan: FitPlan, accelerator, devices, strategy, progress_bar: bool, after_training=None
    ) -> None:
        opts = plan.options
        splitter = self._data_splitter_cls(self.adata_manager, plan.sampling, plan.counts["steps_per_epoch"])
        dp = plan.settings
        stage_common = {
            "dp": dp,
            "scope": plan.scope,
            "private_optimizer": plan.optimizer,
            **{k: opts[k] for k in ("rho", "mask_rate", "betas", "target_power")},
        }
        progress = FitProgress(
            plan.instance_epochs + plan.cluster_epochs, plan.delta if dp else None, progress_bar
        )
        run = {"accelerator": accelerator, "devices": devices, "strategy": strategy, "progress": progress}
        release_loadings = None
        if self.module.input_pcs is not None and plan.start is None:  # else the clustering's loadings
            release_loadings = self._loadings_release(plan)
            if plan.instance_epochs == 0:
                release_loadings()
        if plan.instance_epochs > 0:
            instance = self._training_plan_cls(
                self.module,
                stage="instance",
                optimizer="adam",
                lr=opts["instance_lr"],
                private_lr=opts["private_lr"],
                before_training=release_loadings,
                seed=plan.random_state,
                **stage_common,
            )
            self._run_stage(instance, splitter, plan.instance_epochs, "instance stage", **run)
        self._init_centroids(splitter, plan)
        if plan.cluster_epochs > 0:
            released = opts["target_frequency"] == "released"
            frequency = self._frequency_source(splitter, plan) if released else None
            cluster = self._training_plan_cls(
                self.module,
                stage="cluster",
                optimizer="adadelta",
                lr=opts["cluster_lr"],
                private_lr=opts["cluster_private_lr"],
                frequency_source=frequency,
                train_encoder=opts["cluster_train_encoder"],
                seed=plan.random_state + 2,
                **stage_common,
            )
            self._run_stage(cluster, splitter, plan.cluster_epochs, "cluster stage", **run)
        progress.close()
        self.module.eval()
        self._release_label_counts(splitter, plan)
        self.is_trained_ = True
        if after_training is not None:
            after_training()
        self._record = dcan_record(plan, self.adata.n_obs)  # ε of the releases that ran
        self.privacy_ = self._record.to_dict()
        self.train_params_ = plan.params()

    def privacy_record(self) -> PrivacyRecord:
        """Return the :class:`~dpsc.privacy.PrivacyRecord` of the last ``train``."""
        if self._record is None:
            raise RuntimeError("Train the model first: it has no privacy record yet.")
        return self._record

    check_options = staticmethod(check_options)

    def released_frequencies(self) -> np.ndarray | None:
        """DEC's cluster frequencies as last released in training (noisy under DP), or ``None``.

        A released value: reading it costs no privacy (``frequency_noise_`` is its noise's std).
        """
        return None if self._frequencies is None else self._frequencies.copy()

    def released_label_counts(self) -> np.ndarray | None:
        """Cells each cluster labels in one Poisson sample (rate q), as released after a DP fit.

        ``None`` after a non-private fit, which releases nothing (count :meth:`predict`'s labels).
        A released value: reading it costs no privacy (``label_count_noise_`` is its noise's std).
        """
        return None if self._label_counts is None else self._label_counts.copy()

    def _run_stage(
        self, plan, splitter, epochs, name, accelerator, devices, strategy, progress: FitProgress
    ) -> None:
        progress.start_stage(name, plan.dp)
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
                    # nothing reads the logs; an epoch of fewer steps than Lightning's 50 is fine
                    log_every_n_steps=max(1, min(50, splitter.steps_per_epoch)),
                )
                runner()
        except BaseException:
            progress.close()
            raise
        finally:
            plan.detach_privacy()
            if plan.dp is not None:
                self.history_ = None

    def _loadings_release(self, plan: FitPlan):
        r"""Callable that releases the frozen input loadings (once) and loads them into the module.

        The release of :mod:`dpsc.methods.pca` (the one :func:`dpsc.pp.pca` makes): the sum of
        :math:`u_i u_i^\top` over every training cell, :math:`u_i` the cell's log1p(CP10k) row
        scaled to norm 1 (sensitivity 1), one lattice-encoded Gaussian release at :math:`\sigma_V`
        (exact in a non-private fit), the gene block ``DEFAULT_GENE_BLOCK``
        and the dropped mean component; the accountant is told :math:`(\sigma_V, q = 1)`. Under
        data parallelism every process holds all cells and receives rank 0's release.
        """

        @torch.no_grad()
        def release() -> None:
            module = self.module
            cells = self.adata_manager.get_from_registry(REGISTRY_KEYS.X_KEY)
            sigma = plan.releases.sigma("loadings")
            loadings, _, _ = _pca.released_loadings(
                cells,
                sigma,
                plan.noise.stream("dpdcan.loadings"),
                module.input_pcs,
                _pca.DEFAULT_GENE_BLOCK,
                drop_mean_component=True,
                log_normalize=module.likelihood == "zinb",
            )
            device = module.input_loadings.device
            loadings = torch.as_tensor(loadings, dtype=module.input_loadings.dtype, device=device)
            module.set_input_loadings(broadcast_from_rank_zero(loadings))
            if plan.settings is not None:
                plan.settings.record_full_release(sigma)

        return release

    def _encode_poisson_batch(self, splitter) -> torch.Tensor:
        """Latent codes of one fresh Poisson sample of the training cells (rate q)."""
        device = next(self.module.parameters()).device
        x = splitter.sample_batch()[REGISTRY_KEYS.X_KEY].to(device)
        return self.module.encode(self.module.represent(clean_input(x, self.module.likelihood)))

    @torch.no_grad()
    def _release_cluster_sum(self, splitter, dp, rows_of, stream: str, floor: float) -> torch.Tensor:
        r"""One sampled-Gaussian release of a per-cluster sum over a fresh Poisson sample.

        Releases :math:`\sum_{i \in B} r(p_i) + \mathcal{N}(0, \sigma^2 I)`, :math:`B` a Poisson
        sample of the training cells at the fit's rate q, :math:`p_i` cell i's Student-t soft
        assignment and :math:`r` = ``rows_of`` a map onto rows of L2 norm at most 1 (the soft row
        itself, or the one-hot row of its hard label). Adding or removing a cell changes the sum by
        one such row, so the L2 sensitivity is 1 and, at the fit's σ and q, this is one more step of
        the plan's sampled Gaussian mechanism: released by
        ``dp_cluster_frequency`` on the secure stream ``stream``, told to the
        accountant (``dp.record_release()``), and sent from rank 0 to every process.
        """
        soft = self.module.soft_assignment(self._encode_poisson_batch(splitter)).cpu()
        released = dp_cluster_frequency(
            rows_of(soft),
            noise_multiplier=dp.noise_multiplier,
            rng=dp.noise.stream(stream),
            sample_rate=dp.sample_rate,
            floor=floor,
        )
        dp.record_release()
        device = next(self.module.parameters()).device
        return broadcast_from_rank_zero(released.float().to(device))

    def _frequency_source(self, splitter, plan: FitPlan):
        """Callable releasing DEC's cluster frequencies (noisy under DP, exact otherwise).

        Under DP each call is one ``_release_cluster_sum`` of the soft assignments (floor 1).
        """
        device = next(self.module.parameters()).device
        dp = plan.settings
        if dp is None:

            def exact() -> torch.Tensor:
                frequency = torch.as_tensor(self.predict_proba().sum(0), dtype=torch.float32)
                self.module.train()  # predict_proba leaves the module in eval mode
                self._frequencies = frequency.numpy().astype(np.float64)
                return frequency.to(device)

            return exact

        def release() -> torch.Tensor:
            frequency = self._release_cluster_sum(splitter, dp, lambda soft: soft, "dpdcan.frequency", 1.0)
            self._frequencies = frequency.cpu().numpy().astype(np.float64)
            self.frequency_noise_ = dp.noise_multiplier
            return frequency

        return release

    def _release_label_counts(self, splitter, plan: FitPlan) -> None:
        """Under DP, release how many cells the trained model labels with each cluster (one step).

        One ``_release_cluster_sum`` of the one-hot rows of the hard labels (the centroid with
        the largest soft assignment), floor 0, counted in the plan by
        ``planned_step_counts``. A non-private fit releases nothing:
        its exact counts are those of :meth:`predict`.
        """
        dp = plan.settings
        self._label_counts, self.label_count_noise_ = None, 0.0
        if dp is None:
            return

        def one_hot(soft: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.one_hot(soft.argmax(1), self.n_clusters).double()

        counts = self._release_cluster_sum(splitter, dp, one_hot, "dpdcan.labels", 0.0)
        self._label_counts = counts.cpu().numpy().astype(np.float64)
        self.label_count_noise_ = dp.noise_multiplier

    def start_from_partition(self, centroids: np.ndarray) -> None:
        """Start the centroids from the partition of the input points by ``centroids`` (public).

        ``centroids`` are clusters × the encoder's input width (``input_pcs``, or the genes of a
        model that reads a public reference's points); the latent centroids start at their images
        under the encoder (``_partition_centroids``), so each cell's start cluster is, up to
        the encoder's distortion, the nearest of ``centroids`` to its input point
        (:meth:`~dpsc.module.DCANModule.represent`). ``dpsc.tl.fit`` passes the private
        clustering's released centroids, so training refines that clustering.
        """
        module = self.module
        width = module.n_input if module.input_pcs is None else module.input_pcs
        if (module.input_pcs is None and module.likelihood != "gaussian") or np.shape(centroids) != (
            self.n_clusters,
            width,
        ):
            raise ValueError(
                f"start_from_partition needs centroids of shape ({self.n_clusters}, {width}) in the "
                f"points the encoder reads (input_pcs, or likelihood='gaussian'); got {np.shape(centroids)}."
            )
        self._start_centroids = np.asarray(centroids, dtype=np.float64)

    def keep_start_partition(self) -> None:
        """Label cells by the start partition from now on (its centroids travel with the model).

        ``dpsc.tl.fit`` calls it when the partition choice keeps the clustering's partition:
        :meth:`predict`, :meth:`latent_and_labels` and a :class:`SharedEncoder` loaded from
        :meth:`export_shared` then give each cell the nearest start centroid to its input point,
        as ``obs[cluster_key]`` holds (post-processing of released centroids).
        """
        if getattr(self, "_start_centroids", None) is None:
            raise RuntimeError("keep_start_partition needs start_from_partition(centroids) first.")
        self.partition_centroids_ = self._start_centroids

    @torch.no_grad()
    def _init_centroids(self, splitter, plan: FitPlan) -> None:
        """Start the latent centroids.

        From a start partition's released centroids (no release: ``_partition_centroids``);
        else by DP k-means of Poisson-sampled tables under DP, plain k-means otherwise.
        """
        self.module.eval()
        centroids = self.module.clustering.centroids
        dp = plan.settings
        if getattr(self, "_start_centroids", None) is not None:
            centroids.copy_(self._partition_centroids(plan))
            return
        if dp is None:
            z = self.module.assignment_space(torch.as_tensor(self.get_latent_representation())).numpy()
            km = KMeans(n_clusters=self.n_clusters, n_init=20, random_state=plan.random_state).fit(z)
            centroids.copy_(torch.as_tensor(km.cluster_centers_, dtype=centroids.dtype))
            return
        options = dict(plan.kmeans)
        clip_norm, count_scale = float(options.pop("clip_norm")), float(options["count_scale"])
        d = self.module.n_latent

        def release_table(assignment: Assignment) -> tuple[torch.Tensor, torch.Tensor]:
            table = kmeans_table(
                self.module.assignment_space(self._encode_poisson_batch(splitter)).cpu(),
                assignment,
                clip_norm,
                count_scale,
            )
            spec = table_release(
                assignment.n_rows, d, clip_norm, count_scale, dp.noise_multiplier, dp.sample_rate
            )
            noisy = spec.release(table, dp.noise.stream("dpdcan.kmeans"))
            dp.record_release()
            return split_table(noisy, assignment.n_rows, d, clip_norm, count_scale)

        init = dp_kmeans_centroids(
            release_table,
            self.n_clusters,
            d,
            noise_multiplier=dp.noise_multiplier,
            clip_norm=clip_norm,
            sphere_radius=self.module.latent_scale,
            random_state=plan.random_state,
            **options,
        )
        init = broadcast_from_rank_zero(torch.as_tensor(init, dtype=centroids.dtype, device=centroids.device))
        centroids.copy_(init)

    def _partition_centroids(self, plan: FitPlan) -> torch.Tensor:
        r"""Latent centroids of the start partition: the encoder's image of each released centroid.

        :math:`\mu_j = \rho\, f(c_j) / \lVert f(c_j)\rVert`, with :math:`c_j` the private
        clustering's released centroid in the points the encoder reads (scaled to norm 1 when the
        encoder reads unit-norm points, ``input_pcs``), :math:`f` the encoder read where the
        clusters are (:meth:`~dpsc.module.DCANModule.assignment_space`) and :math:`\rho` the
        latent sphere's radius (``latent_scale``, else the k-means ``clip_norm``). Each
        :math:`\mu_j` stands where the cells of start cluster j land (for a residual encoder,
        where their latent directions point: its clusters are read on the sphere), so the
        model's partition starts as the clustering's.

        **Privacy.** Post-processing, no cell read: the :math:`c_j` are the clustering's released
        centroids, and :math:`f` is public when this runs (pretrained on a public reference, or its
        initial weights) or the output of the accounted DP-SGD instance stage.
        """
        module = self.module
        device = next(module.parameters()).device
        centroids = torch.as_tensor(self._start_centroids, dtype=torch.float32, device=device)
        if module.input_pcs is not None:
            centroids = torch.nn.functional.normalize(centroids, dim=-1)
        latent = module.assignment_space(module.encode(centroids)).double()
        radius = module.latent_scale if module.latent_scale is not None else float(plan.kmeans["clip_norm"])
        latent = radius * latent / latent.norm(dim=1, keepdim=True).clamp_min(1e-12)
        return broadcast_from_rank_zero(latent.to(module.clustering.centroids.dtype))

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
        labels = np.empty(adata.n_obs, dtype=np.int64)
        partition = getattr(self, "partition_centroids_", None)
        start = 0
        for tensors in loader:
            x = as_tensor(tensors[REGISTRY_KEYS.X_KEY])
            out = self.module.inference(x)
            stop = start + out["z"].shape[0]
            z[start:stop] = out["z"].cpu().numpy()
            q[start:stop] = out["q"].cpu().numpy()
            labels[start:stop] = (
                q[start:stop].argmax(1) if partition is None else start_labels(self.module, x, partition)
            )
            start = stop
        return {"z": z, "q": q, "labels": labels}

    def get_latent_representation(
        self, adata: ad.AnnData | None = None, batch_size: int = 1024
    ) -> np.ndarray:
        """Latent codes ``(n_cells, n_latent)`` from the encoder."""
        return self._inference(adata, batch_size)["z"]

    def predict_proba(self, adata: ad.AnnData | None = None, batch_size: int = 1024) -> np.ndarray:
        """Student-t soft cluster assignments ``(n_cells, n_clusters)``."""
        return self._inference(adata, batch_size)["q"]

    def predict(self, adata: ad.AnnData | None = None, batch_size: int = 1024) -> np.ndarray:
        """Hard cluster labels: the centroid with the largest soft assignment (or the start partition's).

        After :meth:`keep_start_partition`, each cell's nearest start centroid to its input point.
        """
        return self._inference(adata, batch_size)["labels"]

    def latent_and_labels(
        self, adata: ad.AnnData | None = None, batch_size: int = 1024
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`get_latent_representation` and :meth:`predict` from one pass over the cells."""
        out = self._inference(adata, batch_size)
        return out["z"], out["labels"]

    # -- sharing ---------------------------------------------------------------------------
    def save(self, dir_path: str, **kwargs) -> None:
        """Save the whole model (scvi-tools format) for the data owner; not for sharing.

        The file holds the decoder too. Under ``scope="paper"`` that decoder was trained on the
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

        The decoder is never written (under ``scope="paper"`` it was trained without noise;
        otherwise it is not needed to embed or cluster new cells). The privacy record
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
        if getattr(self, "reads_reference_points_", False):
            raise NotImplementedError(
                "This model reads each cell's point in a public reference's basis, not its genes, so "
                "the shared encoder could not embed new cells alone. Share the reference and the "
                "directory of tl.fit(reference_model=...) instead; each site fits its own cells."
            )
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
            if k.startswith(("encoder.", "clustering.", "input_loadings", "latent_weights"))
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
                    "residual": bool(init.get("residual", False)),
                    "partition_centroids": None
                    if getattr(self, "partition_centroids_", None) is None
                    else np.asarray(self.partition_centroids_).tolist(),
                    "privacy": {
                        k: (None if isinstance(v, float) and np.isnan(v) else _json_safe(v))
                        for k, v in self.privacy_.items()
                    },
                },
                indent=1,
            )
        )
        return out


@torch.no_grad()
def start_labels(module: DCANModule, x: torch.Tensor, centroids: np.ndarray) -> np.ndarray:
    """Each cell's nearest of the start ``centroids`` to its input point (a map of the cell alone).

    Euclidean, as the clustering labels its cells: its points are unit-norm (cosine) or, on a
    public reference's basis, inside the unit ball.
    """
    rep = module.represent(clean_input(x.to(next(module.parameters()).device), module.likelihood))
    points = module.clustering_points(rep)
    return nearest_centroid(points.cpu().double().numpy(), centroids, "euclidean")


def _json_safe(value):
    """Arrays (the Gaussian history) as nested lists, for the shared model's JSON."""
    return value.tolist() if isinstance(value, np.ndarray) else value
