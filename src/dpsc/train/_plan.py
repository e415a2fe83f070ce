"""Lightning training plan for DCAN with DP-SGD on the private modules only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import lightning.pytorch as pl
import torch
from scvi import REGISTRY_KEYS
from torch import nn

from ..module import DCANModule
from ..optim import make_optimizer
from ..privacy import DPSGDEngine, DPSGDSettings, is_distributed, sum_over_ranks

Stage = Literal["instance", "cluster"]
Scope = Literal["encoder", "full", "paper"]


def _optimizer(name: str, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    return make_optimizer(name, params, lr)


class DCANTrainingPlan(pl.LightningModule):
    r"""One stage of DCAN training, with manual optimisation and hand-assembled Opacus.

    Private modules (the encoder, plus the centroids in the cluster stage, plus the decoder
    under ``scope="full"``) train through the one DP-SGD engine,
    :class:`~dpsc.privacy.DPSGDEngine` (ghost-clipped per-cell gradients, secret Gaussian noise,
    Opacus accountant; its module docstring states the argument). After the noise, the gradient
    of the data-independent centroid-separation term is added (post-processing) and the private
    optimizer steps. An empty Poisson batch still takes the noisy step.

    Under ``scope="encoder"`` the decoder is frozen at its initialisation: the encoder's
    gradients pass through a fixed, data-independent map, so the DP-SGD argument covers the whole
    fit. Public parameters (the decoder under ``scope="paper"``) step with the plain mean gradient
    of the first backward pass: no noise, which is why that scope's guarantee is heuristic.
    Under DP no training loss is logged: an exact mean loss over private cells is an un-noised
    statistic of them.

    Parameters
    ----------
    module
        The DCAN module.
    stage
        ``"instance"`` or ``"cluster"``.
    dp
        DP-SGD settings, or ``None`` for non-private training.
    scope
        ``"encoder"``: encoder and centroids get DP-SGD, the decoder stays fixed;
        ``"full"``: every trained parameter gets DP-SGD; ``"paper"``: encoder and centroids get
        DP-SGD, the decoder trains without noise (the DP-DCAN paper).
    optimizer, lr
        Optimizer (``"adam"``, ``"adadelta"``, ``"sgd"`` with momentum 0.9) and learning rate of
        the non-private parameters, and of every parameter in a non-private fit.
    private_optimizer, private_lr
        Optimizer and learning rate of the DP parameters (default: same as above). Adam
        rescales each coordinate by its own RMS, which turns noise-dominated coordinates into
        lr-sized random steps; SGD lets the signal add up linearly while the noise grows as
        the square root of the number of steps.
    rho, mask_rate
        Instance-stage weight of the reconstruction loss and masking rate.
    betas, target_power
        Cluster-stage loss weights and the target sharpening exponent.
    before_training
        Called once when training starts, after Lightning has connected the processes of a
        data-parallel fit (the release of the frozen input loadings, which every process must
        receive from rank 0); ``None`` for nothing.
    frequency_source
        Cluster stage only: called at the start of every epoch, returns the cluster frequencies
        :math:`f` of DEC's target for that epoch (under DP a noisy release that the callable
        itself accounts, :func:`~dpsc.privacy.dp_cluster_frequency`); ``None`` uses uniform
        frequencies.
    train_encoder
        Cluster stage only: ``False`` freezes the encoder, so the stage trains the centroids
        (and the decoder) on a fixed latent space.
    seed
        Seed of the masking augmentation (not a privacy mechanism).
    """

    def __init__(
        self,
        module: DCANModule,
        *,
        stage: Stage,
        dp: DPSGDSettings | None,
        scope: Scope = "encoder",
        optimizer: str,
        lr: float,
        private_optimizer: str | None = None,
        private_lr: float | None = None,
        rho: float = 0.8,
        mask_rate: float = 0.2,
        betas: tuple[float, float, float] = (0.4, 0.4, 0.2),
        target_power: float = 2.0,
        frequency_source: Callable[[], torch.Tensor] | None = None,
        before_training: Callable[[], None] | None = None,
        train_encoder: bool = True,
        seed: int = 0,
    ):
        super().__init__()
        self.module = module
        self.stage = stage
        self.dp = dp
        self.scope = scope
        self.optimizer_name = optimizer
        self.lr = lr
        self.private_optimizer_name = private_optimizer or optimizer
        self.private_lr = lr if private_lr is None else private_lr
        self.rho = rho
        self.mask_rate = mask_rate
        self.betas = betas
        self.target_power = target_power
        self.frequency_source = frequency_source
        self.before_training = before_training
        self.train_encoder = train_encoder or stage == "instance"
        self.cluster_frequency: torch.Tensor | None = None
        self.automatic_optimization = False
        self.mask_generator = torch.Generator().manual_seed(int(seed))
        private, public = self._split_modules()
        self._private_modules = private
        self._public_modules = public
        self._engine: DPSGDEngine | None = None
        self._private_opt: torch.optim.Optimizer | None = None
        self._public_opt: torch.optim.Optimizer | None = None

    # -- parameter groups ------------------------------------------------------------------
    def _split_modules(self) -> tuple[list[nn.Module], list[nn.Module]]:
        """Return (modules trained through the engine, modules trained without noise).

        ``"encoder"`` freezes the decoder at its initialisation (drawn before any cell is read),
        with or without DP: it is then a public function and the fit is DP-SGD on the encoder and
        centroids alone. ``"full"`` (or no DP) trains it with the rest; ``"paper"`` trains it
        without noise.
        """
        used = [self.module.encoder] if self.train_encoder else []
        if self.stage == "cluster":
            used.append(self.module.clustering)
        decoder = self.module.public_decoder_modules()
        for module in decoder:
            module.requires_grad_(self.scope != "encoder")
        if self.scope == "encoder":
            return used, []
        if self.dp is None or self.scope == "full":
            return [*used, *decoder], []
        return used, decoder

    @staticmethod
    def _params(modules: list[nn.Module]) -> list[nn.Parameter]:
        return [p for m in modules for p in m.parameters()]

    @property
    def private_parameters(self) -> list[nn.Parameter]:
        """Parameters that receive clipped, noised gradients (all trained ones if non-private)."""
        return self._params(self._private_modules)

    @property
    def public_parameters(self) -> list[nn.Parameter]:
        """Parameters trained without noise (the decoder under ``scope="paper"``)."""
        return self._params(self._public_modules)

    # -- Lightning hooks -------------------------------------------------------------------
    def configure_optimizers(self):
        """Build the private (DP) and public optimizers; return them for Lightning."""
        self.attach_privacy()
        return [o for o in (self._private_opt, self._public_opt) if o is not None]

    def attach_privacy(self) -> None:
        """Create optimizers and, under DP, Opacus's norm hooks on the private modules."""
        if self._private_opt is not None:
            return
        if self.dp is None:
            self._private_opt = _optimizer(self.optimizer_name, self.private_parameters, self.lr)
            return
        base = _optimizer(self.private_optimizer_name, self.private_parameters, self.private_lr)
        self._engine = DPSGDEngine(self._private_modules, base, self.dp)
        self._private_opt = self._engine.optimizer
        if self._public_modules:
            self._public_opt = _optimizer(self.optimizer_name, self.public_parameters, self.lr)

    def detach_privacy(self) -> None:
        """Remove Opacus hooks and per-parameter bookkeeping (state-dict keys never change)."""
        self.module.encoder.requires_grad_(True)  # a frozen cluster-stage encoder is unfrozen
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        for p in self.module.parameters():
            p.grad = None

    def on_train_start(self) -> None:
        """Run ``before_training``; put the module in training mode (scvi leaves it in eval mode)."""
        if self.before_training is not None:
            self.before_training()
        self.module.train()
        self.module.encoder.requires_grad_(self.train_encoder)

    def on_train_epoch_start(self) -> None:
        """Refresh DEC's cluster frequencies (one release per epoch) when a source is given."""
        if self.stage == "cluster" and self.frequency_source is not None:
            with torch.no_grad():
                self.cluster_frequency = self.frequency_source()

    def on_train_end(self) -> None:
        """Leave the module clean for saving and inference."""
        self.detach_privacy()

    # -- the step --------------------------------------------------------------------------
    def per_cell_loss(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Per-cell loss vector of the current stage."""
        if self.stage == "instance":
            return self.module.instance_stage_loss(
                x, rho=self.rho, mask_rate=self.mask_rate, generator=self.mask_generator
            )
        return self.module.cluster_stage_loss(
            x, betas=self.betas, target_power=self.target_power, frequency=self.cluster_frequency
        )

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """One (DP-)SGD step on a Poisson batch."""
        x = batch[REGISTRY_KEYS.X_KEY]
        if x.shape[0] == 0:
            if self.dp is not None:
                self.noisy_empty_step()
                self._public_step(0)  # every rank joins the same collectives
            return
        loss, parts = self.per_cell_loss(x)
        if self.dp is not None:
            self.private_step(loss)
            return
        self.plain_step(loss)
        n = x.shape[0]
        self.log(
            "train_loss", loss.mean().detach(), on_step=False, on_epoch=True, prog_bar=True, batch_size=n
        )
        for name, value in parts.items():
            self.log(f"train_{name}", value.mean(), on_step=False, on_epoch=True, batch_size=n)

    def parameter_penalty(self) -> torch.Tensor | None:
        """Data-independent loss term of the stage (centroid separation), if any."""
        if self.stage == "cluster":
            return self.module.parameter_penalty(self.betas)
        return None

    def plain_step(self, loss: torch.Tensor) -> None:
        """Non-private step on the mean loss (plus the parameter penalty)."""
        self._private_opt.zero_grad(set_to_none=True)
        total = loss.mean()
        penalty = self.parameter_penalty()
        if penalty is not None:
            total = total + penalty
        total.backward()
        self._private_opt.step()

    def _add_penalty_gradient(self) -> None:
        """Add the gradient of the data-independent centroid penalty (post-processing)."""
        penalty = self.parameter_penalty()
        if penalty is not None:
            centroids = self.module.clustering.centroids
            (grad,) = torch.autograd.grad(penalty, centroids)
            centroids.grad = centroids.grad + grad

    def private_step(self, loss: torch.Tensor) -> None:
        """DP step: ghost-clipped, noised gradient on private parameters (steps 2–4 above)."""
        self._engine.zero_grad()
        if self._public_opt is not None:
            self._public_opt.zero_grad(set_to_none=True)
        self._engine.backward(loss)
        self._engine.step(self._add_penalty_gradient)
        self._public_step(loss.shape[0])

    def _public_step(self, n_cells: int) -> None:
        """Step the noise-free parameters with the mean gradient over the (global) batch.

        The first backward pass left each local batch's gradient sum in ``.grad``; across
        processes the sums and the batch sizes are added before dividing.
        """
        if self._public_opt is None:
            return
        params = self.public_parameters
        if is_distributed():
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                sum_over_ranks(p.grad)
            n_cells = int(sum_over_ranks(torch.tensor(float(n_cells), device=params[0].device)).item())
        if n_cells == 0:
            return
        for p in params:
            if p.grad is not None:
                p.grad.div_(n_cells)
        self._public_opt.step()

    def noisy_empty_step(self) -> None:
        """Empty Poisson batch: the private parameters still take a pure-noise step."""
        if self._public_opt is not None:
            self._public_opt.zero_grad(set_to_none=True)
        self._engine.empty_step(self._add_penalty_gradient)
