"""DP-DCAN: differentially private deep contrastive autoencoder network (scvi-tools model)."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable, Sequence
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
    check_matrix,
    check_privacy_args,
    check_target_frequency,
    get_matrix,
)
from ..module import DCANModule
from ..optim import DEFAULT_PRIVATE_LRS, OPTIMIZERS
from ..privacy import (
    PrivacyRecord,
    calibrate_noise_multiplier,
    dp_cluster_frequency,
    dp_kmeans_centroids,
    epsilon_curve,
    kmeans_release_steps,
    make_accountant,
    privacy_statement,
    spent_epsilon,
)
from ..train import DCANTrainingPlan, DPConfig, PoissonDataSplitter

logger = logging.getLogger(__name__)

#: Options of :func:`~dpsc.privacy.dp_kmeans_centroids` used by :meth:`DPDCAN.train` unless
#: ``kmeans_kwargs`` overrides them: noisy Lloyd rounds with 3k centroids reduced to k, count
#: column weighted 0.3·R, 2^6 sketch buckets (``benchmarks/results/dpdcan.md``).
DEFAULT_KMEANS_OPTIONS: dict[str, int | float] = {"n_bits": 6, "oversampling": 3, "count_scale": 0.3}


def planned_step_counts(
    sample_rate: float,
    *,
    instance_epochs: int,
    cluster_epochs: int,
    n_sketch_steps: int,
    n_lloyd_rounds: int,
    steps_per_round: int,
    target_frequency: str,
) -> dict[str, int]:
    r"""Sampled-Gaussian steps a DP-DCAN fit plans, all at Poisson rate ``sample_rate`` = q.

    An epoch is :math:`E = \max(1, \mathrm{round}(1/q))` batches, so the fit plans

    .. math:: T = (e_{inst} + e_{clu})\,E + (s_{sketch} + r \cdot s_{round}) + f,

    with :math:`f = e_{clu}` frequency releases when ``target_frequency="released"`` (else 0).
    σ is calibrated for ``T``. Returns ``steps_per_epoch`` (E), ``instance``, ``cluster``,
    ``kmeans``, ``frequency`` and ``total`` (T).
    """
    steps_per_epoch = max(1, round(1.0 / sample_rate))
    counts = {
        "steps_per_epoch": steps_per_epoch,
        "instance": instance_epochs * steps_per_epoch,
        "cluster": cluster_epochs * steps_per_epoch,
        "kmeans": kmeans_release_steps(n_sketch_steps, n_lloyd_rounds, steps_per_round),
        "frequency": cluster_epochs if target_frequency == "released" else 0,
    }
    counts["total"] = counts["instance"] + counts["cluster"] + counts["kmeans"] + counts["frequency"]
    return counts


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
        unconstrained latent (then pass ``kmeans_clip_norm`` to :meth:`train`).

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
    ):
        super().__init__(adata)
        self.module = self._module_cls(
            n_input=self.summary_stats.n_vars,
            n_clusters=n_clusters,
            n_latent=n_latent,
            n_hidden=tuple(n_hidden),
            likelihood=likelihood,
            latent_scale=latent_scale,
        )
        self.n_clusters = n_clusters
        self.privacy_: dict = {}
        self._model_summary_string = (
            f"DPDCAN: {self.summary_stats.n_vars} genes → {tuple(n_hidden)} → {n_latent} latent, "
            f"{n_clusters} clusters, {likelihood} likelihood"
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
        instance_lr: float = 1e-3,
        cluster_lr: float = 0.1,
        private_optimizer: str = "sgd",
        private_lr: float | None = None,
        cluster_private_lr: float | None = None,
        rho: float = 0.8,
        mask_rate: float = 0.2,
        betas: tuple[float, float, float] = (0.4, 0.4, 0.2),
        target_power: float = 2.0,
        target_frequency: str = "released",
        cluster_train_encoder: bool = True,
        kmeans_clip_norm: float | None = None,
        n_sketch_steps: int = 40,
        n_lloyd_rounds: int = 4,
        steps_per_round: int = 40,
        kmeans_kwargs: dict | None = None,
        random_state: int = 0,
        secure_mode: bool = False,
        accelerator: str = "auto",
        progress_bar: bool = True,
    ) -> None:
        r"""Train both stages; with ``epsilon`` the whole fit is (ε, δ)-DP (see the record).

        The noise multiplier σ is calibrated once, before training, for the total number of
        sampled-Gaussian steps of the fit: ``(instance_epochs + cluster_epochs) ×
        round(1/q)`` DP-SGD steps plus ``n_sketch_steps + n_lloyd_rounds × steps_per_round`` DP k-means
        releases (plus ``cluster_epochs`` frequency releases with ``target_frequency="released"``),
        all with Poisson rate ``q = batch_size / n_obs``. The ε recorded is the
        accountant's value after the steps that actually ran. No epoch, learning rate or
        checkpoint is chosen from the data: the final model is the result.

        Parameters
        ----------
        epsilon
            Target ε; ``None`` trains the non-private DCAN.
        delta
            Target δ; must be below ``1/n_obs``.
        scope
            ``"encoder"`` (DP-DCAN) or ``"full"`` (DPE-DCAN).
        instance_epochs, cluster_epochs
            Epochs of each stage; an epoch is ``round(1/q)`` Poisson batches.
        batch_size
            Expected batch size ``q·n`` (default 10 % of the cells).
        max_grad_norm
            Per-cell clipping norm C.
        accountant
            ``"rdp"`` or ``"prv"`` (Opacus).
        instance_lr, cluster_lr
            Adam learning rate (instance stage), Adadelta learning rate (cluster stage), for the
            non-private parameters and for all parameters of a non-private fit.
        private_optimizer, private_lr
            Update rule of the DP parameters in both stages, applied to Opacus's clipped and
            noised gradient: ``"sgd"`` (momentum 0.9), ``"adam"``, ``"adadelta"``, ``"dpsignsgd"``
            or ``"dpsignadam"`` (:mod:`dpsc.optim`); and its instance-stage learning rate
            (``None``: :data:`dpsc.optim.DEFAULT_PRIVATE_LRS`).
        cluster_private_lr
            Learning rate of the DP parameters in the cluster stage (``None``: the default of
            the optimizer).
        rho, mask_rate
            Instance-stage reconstruction weight and masking rate.
        betas, target_power
            Cluster-stage weights (ZINB, DEC, separation) and target sharpening exponent.
        target_frequency
            Cluster frequencies :math:`f_j` in DEC's target :math:`p_{ij} \propto q_{ij}^2/f_j`:
            ``"released"`` (default): at the start of every cluster epoch, the soft assignments
            of one Poisson sample of cells are summed and released with Gaussian noise
            (:func:`~dpsc.privacy.dp_cluster_frequency`, one accounted step; exact over all
            cells in a non-private fit); ``"uniform"``: :math:`f_j = 1` (dpsc 0.1.0 behaviour).
        cluster_train_encoder
            Train the encoder in the cluster stage (the paper's Alg. 1); ``False`` keeps the
            instance-stage encoder and trains only the centroids (and the decoder) there.
        kmeans_clip_norm, n_sketch_steps, n_lloyd_rounds, steps_per_round
            Clipping radius and release counts of the DP k-means initialisation
            (:func:`~dpsc.privacy.dp_kmeans_centroids`). The default radius is ``latent_scale``,
            the norm of every latent point, so no point is clipped.
        kmeans_kwargs
            Further options of :func:`~dpsc.privacy.dp_kmeans_centroids` that change no
            step count (``n_bits``, ``oversampling``, ``count_scale``); they update
            :data:`dpsc.model.DEFAULT_KMEANS_OPTIONS` (6 bits, oversampling 3, count scale 0.3). The start
            of dpsc 0.1.0 is ``n_sketch_steps=20, steps_per_round=10, kmeans_kwargs={"n_bits":
            5, "oversampling": 1, "count_scale": 1.0}``.
        random_state
            Seed of initialisation, sampling, masking and (unless ``secure_mode``) noise.
        secure_mode
            Use Opacus's secure noise generation for the DP-SGD steps (results then not
            reproducible). The k-means and frequency releases then draw noise from a torch
            generator seeded from the operating system, not from a cryptographically secure
            sampler.
        accelerator
            Lightning accelerator.
        progress_bar
            Show a progress bar per stage.
        """
        if self.is_trained_:
            raise RuntimeError(
                "This model is already trained. Training it again would start a new privacy "
                "ledger that ignores what the weights already learned from the cells; build a "
                "new model (or dpsc.tl.fit) instead."
            )
        adata = self.adata
        n_obs = adata.n_obs
        batch_size = check_fit_args(
            n_obs=n_obs, n_clusters=self.n_clusters, scope=scope, batch_size=batch_size
        )
        check_privacy_args(epsilon, delta, n_obs)
        check_matrix(self.adata_manager.get_from_registry(REGISTRY_KEYS.X_KEY), self.module.likelihood)
        acct = make_accountant(accountant)  # also rejects unknown names before any work
        if private_optimizer not in OPTIMIZERS:
            raise ValueError(f"Unknown optimizer {private_optimizer!r}; choose one of {OPTIMIZERS}.")
        default_lr, default_cluster_lr = DEFAULT_PRIVATE_LRS[private_optimizer]
        private_lr = default_lr if private_lr is None else private_lr
        cluster_private_lr = default_cluster_lr if cluster_private_lr is None else cluster_private_lr

        check_target_frequency(target_frequency)
        unknown = set(kmeans_kwargs or {}) - set(DEFAULT_KMEANS_OPTIONS)
        if unknown:
            raise ValueError(
                f"kmeans_kwargs accepts n_bits, oversampling and count_scale, not {sorted(unknown)}; "
                "the release counts are the arguments n_sketch_steps, n_lloyd_rounds, steps_per_round."
            )
        kmeans_options = {**DEFAULT_KMEANS_OPTIONS, **(kmeans_kwargs or {})}
        if kmeans_clip_norm is None:
            if self.module.latent_scale is None:
                raise ValueError(
                    "With latent_scale=None, pass kmeans_clip_norm (the DP k-means clipping radius)."
                )
            kmeans_clip_norm = float(self.module.latent_scale)
        torch.manual_seed(random_state)
        sample_rate = batch_size / n_obs
        plan = planned_step_counts(
            sample_rate,
            instance_epochs=instance_epochs,
            cluster_epochs=cluster_epochs,
            n_sketch_steps=n_sketch_steps,
            n_lloyd_rounds=n_lloyd_rounds,
            steps_per_round=steps_per_round,
            target_frequency=target_frequency,
        )
        steps_per_epoch, km_steps = plan["steps_per_epoch"], plan["kmeans"]
        frequency_steps, planned_steps = plan["frequency"], plan["total"]
        splitter = PoissonDataSplitter(self.adata_manager, sample_rate, steps_per_epoch, seed=random_state)
        dp = None
        sigma = 0.0
        if epsilon is not None:
            sigma = calibrate_noise_multiplier(epsilon, delta, sample_rate, planned_steps, accountant)
            noise_gen = None if secure_mode else torch.Generator().manual_seed(random_state + 1)
            dp = DPConfig(
                noise_multiplier=sigma,
                max_grad_norm=max_grad_norm,
                sample_rate=sample_rate,
                expected_batch_size=batch_size,
                accountant=acct,
                scope=scope,
                noise_generator=noise_gen,
                secure_mode=secure_mode,
            )
            logger.info(
                "Calibrated noise multiplier %.4f for %d steps at q=%.4f", sigma, planned_steps, sample_rate
            )

        common = {
            "dp": dp,
            "private_optimizer": private_optimizer,
            "rho": rho,
            "mask_rate": mask_rate,
            "betas": betas,
            "target_power": target_power,
        }
        histories = {}
        if instance_epochs > 0:
            plan = DCANTrainingPlan(
                self.module,
                stage="instance",
                optimizer="adam",
                lr=instance_lr,
                private_lr=private_lr,
                seed=random_state,
                **common,
            )
            histories["instance"] = self._run_stage(
                plan, splitter, instance_epochs, accelerator, progress_bar
            )

        self._init_centroids(
            splitter,
            dp,
            kmeans_clip_norm,
            (n_sketch_steps, n_lloyd_rounds, steps_per_round),
            kmeans_options,
            random_state,
        )

        if cluster_epochs > 0:
            plan = DCANTrainingPlan(
                self.module,
                stage="cluster",
                optimizer="adadelta",
                lr=cluster_lr,
                private_lr=cluster_private_lr,
                frequency_source=(
                    self._frequency_source(splitter, dp) if target_frequency == "released" else None
                ),
                train_encoder=cluster_train_encoder,
                seed=random_state + 2,
                **common,
            )
            histories["cluster"] = self._run_stage(plan, splitter, cluster_epochs, accelerator, progress_bar)
        self.history_ = {f"{stage}_{k}": v for stage, h in histories.items() for k, v in (h or {}).items()}
        self.module.eval()
        self.is_trained_ = True

        self.privacy_ = self._privacy_record(
            epsilon=epsilon,
            delta=delta,
            sigma=sigma,
            sample_rate=sample_rate,
            accountant_name=accountant,
            acct=acct,
            scope=scope,
            max_grad_norm=max_grad_norm,
            km_steps=km_steps if dp else 0,
            frequency_steps=frequency_steps if dp else 0,
            secure_mode=secure_mode,
        ).to_dict()
        self.train_params_ = {
            "instance_epochs": instance_epochs,
            "cluster_epochs": cluster_epochs,
            "batch_size": batch_size,
            "instance_lr": instance_lr,
            "cluster_lr": cluster_lr,
            "private_optimizer": private_optimizer,
            "private_lr": private_lr,
            "cluster_private_lr": cluster_private_lr,
            "rho": rho,
            "mask_rate": mask_rate,
            "betas": list(betas),
            "target_power": target_power,
            "target_frequency": target_frequency,
            "cluster_train_encoder": cluster_train_encoder,
            "kmeans_clip_norm": kmeans_clip_norm,
            "n_sketch_steps": n_sketch_steps,
            "n_lloyd_rounds": n_lloyd_rounds,
            "steps_per_round": steps_per_round,
            "kmeans_kwargs": kmeans_options,
            "random_state": random_state,
            "planned_steps": planned_steps,
        }

    def _run_stage(self, plan, splitter, epochs, accelerator, progress_bar):
        runner = self._train_runner_cls(
            self,
            training_plan=plan,
            data_splitter=splitter,
            max_epochs=epochs,
            accelerator=accelerator,
            devices=1,
            enable_progress_bar=progress_bar,
            enable_model_summary=False,
            enable_checkpointing=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
        )
        self.module.train()
        self.history_ = None  # scvi appends to an existing history; keep the stages apart
        self.is_trained_ = False
        try:
            runner()
        finally:
            plan.detach_privacy()
        return self.history_

    def _encode_poisson_batch(self, splitter) -> torch.Tensor:
        """Latent codes of one fresh Poisson sample of the training cells (rate q)."""
        device = next(self.module.parameters()).device
        x = splitter.sample_batch()[REGISTRY_KEYS.X_KEY].to(device)
        return self.module.encode(self.module.represent(x))

    @staticmethod
    def _release_tools(dp: DPConfig) -> tuple[Callable[[], None], torch.Generator]:
        """Accountant hook (one (σ, q) step) and noise generator of the non-SGD releases."""

        def record_step() -> None:
            dp.accountant.step(noise_multiplier=dp.noise_multiplier, sample_rate=dp.sample_rate)

        return record_step, dp.noise_generator or torch.Generator().manual_seed(secrets.randbits(63))

    def _frequency_source(self, splitter, dp):
        """Callable releasing DEC's cluster frequencies (noisy under ``dp``, exact otherwise)."""
        device = next(self.module.parameters()).device
        if dp is None:

            def exact() -> torch.Tensor:
                frequency = torch.as_tensor(self.predict_proba().sum(0), dtype=torch.float32)
                self.module.train()  # predict_proba leaves the module in eval mode
                return frequency.to(device)

            return exact
        record_step, gen = self._release_tools(dp)

        def release() -> torch.Tensor:
            q = self.module.soft_assignment(self._encode_poisson_batch(splitter)).cpu()
            frequency = dp_cluster_frequency(q, noise_multiplier=dp.noise_multiplier, generator=gen)
            record_step()
            return frequency.float().to(device)

        return release

    @torch.no_grad()
    def _init_centroids(self, splitter, dp, clip_norm, release_counts, kmeans_kwargs, random_state) -> None:
        """k-means initialisation: DP releases under ``dp``, plain k-means otherwise."""
        self.module.eval()
        centroids = self.module.clustering.centroids
        if dp is None:
            z = self.get_latent_representation()
            km = KMeans(n_clusters=self.n_clusters, n_init=20, random_state=random_state).fit(z)
            centroids.copy_(torch.as_tensor(km.cluster_centers_, dtype=centroids.dtype))
            return

        record_step, gen = self._release_tools(dp)
        init = dp_kmeans_centroids(
            lambda: self._encode_poisson_batch(splitter).cpu(),
            self.n_clusters,
            noise_multiplier=dp.noise_multiplier,
            clip_norm=clip_norm,
            record_step=record_step,
            generator=gen,
            n_sketch_steps=release_counts[0],
            n_lloyd_rounds=release_counts[1],
            steps_per_round=release_counts[2],
            sphere_radius=self.module.latent_scale,
            random_state=random_state,
            **kmeans_kwargs,
        )
        centroids.copy_(torch.as_tensor(init, dtype=centroids.dtype))

    def _privacy_record(
        self,
        *,
        epsilon,
        delta,
        sigma,
        sample_rate,
        accountant_name,
        acct,
        scope,
        max_grad_norm,
        km_steps,
        frequency_steps,
        secure_mode,
    ) -> PrivacyRecord:
        n_obs = self.adata.n_obs
        decoder = "decoder (hidden layers and ZINB heads)"
        if epsilon is None:
            statement = privacy_statement(
                epsilon=None, delta=delta, scope="none", n_obs=n_obs, private_parts=[], public_parts=[]
            )
            return PrivacyRecord(
                epsilon=None,
                target_epsilon=None,
                delta=delta,
                noise_multiplier=0.0,
                sample_rate=sample_rate,
                steps=0,
                max_grad_norm=float("inf"),
                accountant=accountant_name,
                scope="none",
                statement=statement,
            )
        private = ["encoder weights", "cluster centroids"] + ([decoder] if scope == "full" else [])
        public = [] if scope == "full" else [decoder]
        spent = spent_epsilon(acct, delta)
        steps = int(sum(h[2] for h in acct.history))
        curve_steps, curve_eps = epsilon_curve(list(acct.history), delta, accountant_name)
        statement = privacy_statement(
            epsilon=spent, delta=delta, scope=scope, n_obs=n_obs, private_parts=private, public_parts=public
        )
        return PrivacyRecord(
            epsilon=spent,
            target_epsilon=float(epsilon),
            delta=delta,
            noise_multiplier=sigma,
            sample_rate=sample_rate,
            steps=steps,
            max_grad_norm=max_grad_norm,
            accountant=accountant_name,
            scope=scope,
            statement=statement,
            private_parameters=private,
            kmeans_steps=km_steps,
            frequency_steps=frequency_steps,
            secure_mode=secure_mode,
            curve_steps=curve_steps,
            curve_epsilon=curve_eps,
        )

    # -- inference -------------------------------------------------------------------------
    @torch.no_grad()
    def _inference(self, adata: ad.AnnData | None, batch_size: int) -> dict[str, np.ndarray]:
        adata = self._validate_anndata(adata)
        loader = self._make_data_loader(adata=adata, batch_size=batch_size, shuffle=False)
        self.module.eval()
        zs, qs = [], []
        for tensors in loader:
            out = self.module.inference(tensors[REGISTRY_KEYS.X_KEY])
            zs.append(out["z"].cpu())
            qs.append(out["q"].cpu())
        return {"z": torch.cat(zs).numpy(), "q": torch.cat(qs).numpy()}

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
            if k.startswith(("encoder.", "clustering."))
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
                    "privacy": {
                        k: (None if isinstance(v, float) and np.isnan(v) else v)
                        for k, v in self.privacy_.items()
                    },
                },
                indent=1,
            )
        )
        return out
