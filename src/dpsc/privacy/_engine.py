r"""The one DP-SGD engine: private modules + settings → clipped, noised, accounted steps.

Every method in dpsc that trains with DP-SGD (DP-DCAN's Lightning plan, the federated sites,
the annotation classifier) goes through :class:`DPSGDEngine`. One step is Abadi et al. (2016),
Alg. 1, with Opacus doing the clipping, the noise and the accounting:

1. the caller draws a Poisson batch (each cell independently with rate :math:`q`, from the
   secret ``"sampling"`` stream of the :class:`~dpsc.privacy.NoiseSource`) and computes the
   per-cell loss vector :math:`(L_i)`; each :math:`L_i` must depend on cell :math:`i` alone
   (plus parameters and already-private state), which ``tests/test_per_cell_independence.py``
   checks for every loss;
2. :meth:`DPSGDEngine.backward` leaves :math:`\sum_i \mathrm{clip}_C(\nabla_\theta L_i)` in the
   private parameters' ``.grad`` by ghost clipping (:func:`ghost_clipped_backward`), never
   materialising per-cell gradients; its second pass starts at the private modules' outputs,
   so the loss's graph is differentiated once;
3. :meth:`DPSGDEngine.step` lets Opacus's :class:`~opacus.optimizers.DPOptimizerFastGradientClipping`
   add :math:`\mathcal N(0, \sigma^2 C^2 I)`, divide by the expected batch size :math:`qn`,
   report one :math:`(\sigma, q)` step to the accountant, then applies the update rule. The noise
   comes from the secure stream (:meth:`~dpsc.privacy._random.SecureRandom.gaussian_tensor`:
   AES-256-CTR uniforms, four draws summed as Opacus's ``secure_mode`` does), through the one
   method of Opacus's optimizer that draws it (:class:`SecureNoiseOptimizer`). An empty Poisson
   batch still takes the noisy step (:meth:`DPSGDEngine.empty_step`), as the accountant assumes.

A Poisson batch larger than the memory allows is split into physical chunks (Opacus's virtual
steps): :meth:`DPSGDEngine.accumulate` adds each chunk's clipped sum and takes no noise and no
accounting step, then :meth:`DPSGDEngine.take_step` adds the last chunk, the noise once and one
accounting step. Clipped sums add over any partition of the batch, so the released step is the
same mechanism whatever the chunking.

:class:`PoissonSampling` is the one Poisson sampler. :func:`poisson_steps` is the one Poisson
DP-SGD loop (draw, then an empty noisy step or backward and step) for every user outside
Lightning (the annotation classifier, the gradient audit, the federated sites); DP-DCAN's
Lightning plan reads the same sampler's batches through :class:`~dpsc.train.PoissonDataSplitter`
and takes the same :meth:`DPSGDEngine.take_step`.

Across several processes (Lightning's DDP) the engine switches to Opacus's distributed
optimizer: the ranks' clipped sums are added and rank 0 alone adds the noise, so each global step
is the same mechanism (argument in :func:`dpsc.privacy.sum_over_ranks`).

Because the noise is added to the sum of clipped per-cell gradients with Poisson sampling, each
step is one application of the sampled Gaussian mechanism with sensitivity :math:`C`; the
accountant composes the steps (Mironov et al. 2019 for RDP; Gopi et al. 2021 for PRV).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from opacus.accountants import IAccountant
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.optimizers import (
    DistributedDPOptimizerFastGradientClipping,
    DPOptimizerFastGradientClipping,
)
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from torch import nn
from torch.utils.data import Sampler

from ._accounting import make_accountant, spent_epsilon
from ._distributed import world
from ._ghost import ModuleOutputs, ghost_clipped_backward, release_privacy_hooks
from ._noise import NoiseSource
from ._random import SecureRandom
from ._unit import DonorRows


class PoissonBatches(Sampler[list[int]]):
    """``steps`` batches of row indices, each holding every row independently with probability q.

    The draws come from a secure stream (:class:`~dpsc.privacy.SecureRandom`); an empty batch is
    yielded as an empty list (the caller then takes a pure-noise step, as the accountant assumes).
    With ``donors`` each donor is drawn with probability q and brings one of its rows, chosen at
    random (:class:`~dpsc.privacy.DonorRows`). A PyTorch ``Sampler``, so a
    ``DataLoader(batch_size=None)`` reads its batches directly.
    """

    def __init__(
        self, n: int, sample_rate: float, steps: int, rng: SecureRandom, donors: DonorRows | None = None
    ) -> None:
        self.n, self.sample_rate, self.steps, self.rng = int(n), float(sample_rate), int(steps), rng
        self.donors = donors

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            yield poisson_rows(self.rng, self.n, self.sample_rate, self.donors)


def poisson_rows(rng: SecureRandom, n: int, sample_rate: float, donors: DonorRows | None = None) -> list[int]:
    """Return one Poisson sample of ``n`` rows: each row (each donor's one random row) with probability q."""
    if donors is not None:
        if donors.n_rows != n:
            raise ValueError(f"A donor-level draw over {n} rows needs the donors of those {n} rows.")
        return donors.one_row_each(rng, np.flatnonzero(rng.bernoulli_mask(donors.n_donors, sample_rate)))
    return np.flatnonzero(rng.bernoulli_mask(n, sample_rate)).tolist()


@dataclass(frozen=True)
class PoissonSampling:
    r"""The one Poisson sampler of dpsc: every cell (or donor) in each draw independently with rate q.

    The RDP analysis of the sampled Gaussian mechanism (Mironov et al. 2019) assumes exactly
    this: batch sizes vary and a batch may be empty. Draws come from the secret streams of
    ``noise`` (OS entropy unless a ``noise_seed`` was opted into), never from ``random_state``:
    who knows the sample knows whose cells shaped each step. :meth:`batches` serves DP-SGD
    (one stream per data-parallel rank, ``"sampling"``); :meth:`release_rows` serves the other
    sampled releases of a fit (k-means, frequencies) from a stream of their own. With ``donors``
    (the donor unit) q is each donor's rate and a drawn donor brings one random cell
    (:class:`~dpsc.privacy.DonorRows`).
    """

    sample_rate: float
    noise: NoiseSource
    donors: DonorRows | None = None

    def batches(self, n: int, steps: int, rank: int = 0) -> PoissonBatches:
        """Return ``steps`` Poisson batches over ``n`` rows, from rank ``rank``'s sampling stream."""
        rng = self.noise.stream("sampling", rank)
        return PoissonBatches(n, self.sample_rate, steps, rng, self.donors)

    def release_rows(self) -> Callable[[int], list[int]]:
        """Return ``draw(n) -> row indices``, one Poisson sample per call for sampled releases."""
        rng = self.noise.stream("sampling-releases")
        return lambda n: poisson_rows(rng, n, self.sample_rate, self.donors)


#: Most cells whose losses :func:`poisson_steps` holds in memory at once (larger Poisson batches
#: are split into chunks of this size; the step is the same mechanism).
MAX_PHYSICAL_BATCH = 512


@dataclass
class DPSGDSettings:
    """What one DP-SGD run needs besides its modules and update rule.

    Attributes
    ----------
    noise_multiplier
        σ; the noise added to the sum of clipped gradients has standard deviation σ·C.
    max_grad_norm
        C, the per-cell clipping norm.
    sample_rate
        Poisson rate q (also what the accountant is told).
    expected_batch_size
        q·n, the denominator of the noisy mean gradient.
    accountant
        Opacus accountant every noisy step is reported to.
    noise
        Where the noise and the Poisson samples come from.
    donors
        Per donor, each donor's rows: q is then each donor's rate and an included donor brings one
        random row (:class:`~dpsc.privacy.DonorRows`); ``None``: per cell.
    """

    noise_multiplier: float
    max_grad_norm: float
    sample_rate: float
    expected_batch_size: int
    accountant: IAccountant
    noise: NoiseSource
    donors: DonorRows | None = None

    @classmethod
    def from_sigma(
        cls,
        *,
        n_obs: int,
        sample_rate: float,
        noise_multiplier: float,
        max_grad_norm: float,
        accountant: str = "rdp",
        noise: NoiseSource | None = None,
    ) -> DPSGDSettings:
        """Return settings at a given σ (no calibration: a plan's σ, or one the caller states)."""
        return cls(
            noise_multiplier=float(noise_multiplier),
            max_grad_norm=float(max_grad_norm),
            sample_rate=float(sample_rate),
            expected_batch_size=max(1, round(sample_rate * n_obs)),
            accountant=make_accountant(accountant),
            noise=noise if noise is not None else NoiseSource(),
        )

    @property
    def history(self) -> list[tuple[float, float, int]]:
        """The releases told to the accountant so far, ``[(σ, q, steps), …]`` (public quantities)."""
        return [tuple(entry) for entry in self.accountant.history]

    def spent(self, delta: float) -> float:
        """ε the accountant composes at δ over the releases so far (0 before any)."""
        return spent_epsilon(self.accountant, delta)

    @property
    def sampling(self) -> PoissonSampling:
        """The Poisson sampler at these settings' q, drawing from their noise source's streams."""
        return PoissonSampling(self.sample_rate, self.noise, self.donors)

    def record_release(self) -> None:
        """Tell the accountant about one non-SGD release with the same (σ, q) (k-means, frequencies)."""
        self.accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate)

    def record_full_release(self, noise_multiplier: float, steps: int = 1) -> None:
        """Tell the accountant about ``steps`` releases of every cell (q = 1) at their own σ."""
        for _ in range(steps):
            self.accountant.step(noise_multiplier=noise_multiplier, sample_rate=1.0)


def _add_secure_noise(optimizer: DPOptimizerFastGradientClipping, rng: SecureRandom) -> None:
    """Opacus's ``add_noise`` with the noise drawn from ``rng`` (module docstring, step 3)."""
    std = optimizer.noise_multiplier * optimizer.max_grad_norm
    for p in optimizer.params:
        _check_processed_flag(p.summed_grad)
        noise = rng.gaussian_tensor(std, p.summed_grad.shape, p.summed_grad.device)
        p.grad = (p.summed_grad + noise.to(p.summed_grad.dtype)).view_as(p)
        _mark_as_processed(p.summed_grad)


class SecureNoiseOptimizer(DPOptimizerFastGradientClipping):
    """Opacus's ghost-clipping DP optimizer whose Gaussian noise comes from a secure stream."""

    def __init__(self, *args, noise_rng: SecureRandom, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.noise_rng = noise_rng

    def add_noise(self) -> None:
        """Add N(0, σ²C²) from the secure stream to the clipped sums (Opacus's step, our sampler)."""
        _add_secure_noise(self, self.noise_rng)


class SecureNoiseDistributedOptimizer(DistributedDPOptimizerFastGradientClipping):
    """Opacus's distributed ghost-clipping optimizer (rank 0 adds the noise) with secure noise."""

    def __init__(self, *args, noise_rng: SecureRandom, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.noise_rng = noise_rng

    def add_noise(self) -> None:
        """Rank 0 adds N(0, σ²C²) from the secure stream; the other ranks pass their sums on."""
        if self.rank == 0:
            _add_secure_noise(self, self.noise_rng)
        else:
            for p in self.params:
                p.grad = p.summed_grad.view_as(p)


class DPSGDEngine:
    """Clipped and noised optimizer steps on ``modules``, with the accountant attached.

    Parameters
    ----------
    modules
        The private modules; every trainable parameter in them gets DP-SGD.
    optimizer
        The update rule over exactly those parameters (``dpsc.optim.make_optimizer``); Opacus
        wraps it, so the rule sees only the noisy gradient (sign rules are post-processing).
    settings
        σ, C, q, expected batch size, accountant and noise source.
    """

    def __init__(
        self, modules: Sequence[nn.Module], optimizer: torch.optim.Optimizer, settings: DPSGDSettings
    ) -> None:
        self.settings = settings
        container = nn.ModuleList(modules)
        self.parameters = [p for p in container.parameters() if p.requires_grad]
        self._gsm = GradSampleModuleFastGradientClipping(
            container, loss_reduction="sum", max_grad_norm=settings.max_grad_norm, use_ghost_clipping=True
        )
        rank, world_size = world()
        self.distributed = world_size > 1
        optimizer_cls = SecureNoiseDistributedOptimizer if self.distributed else SecureNoiseOptimizer
        self.optimizer = optimizer_cls(
            optimizer,
            noise_multiplier=settings.noise_multiplier,
            max_grad_norm=settings.max_grad_norm,
            # Opacus's distributed optimizer divides the all-reduced sum by world_size too.
            expected_batch_size=settings.expected_batch_size / world_size,
            loss_reduction="mean",
            noise_rng=settings.noise.stream("dpsgd", rank),
        )
        self.optimizer.attach_step_hook(settings.accountant.get_optimizer_hook_fn(settings.sample_rate))
        self._outputs = ModuleOutputs(modules)
        #: Audit probes (``dpsc.audit.GradientCanaries``): called with the private parameters just
        #: before the noise (``before_noise``) and just after it (``after_noise``).
        self.probes: list = []

    def zero_grad(self) -> None:
        """Clear the private parameters' gradients."""
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, per_cell_loss: torch.Tensor) -> None:
        r"""Leave :math:`\sum_i \mathrm{clip}_C(\nabla L_i)` in the private ``.grad`` (step 2)."""
        ghost_clipped_backward(self._gsm, per_cell_loss, self.parameters, self._outputs)

    def step(self, after_noise: Callable[[], None] | None = None) -> None:
        """Noise, scale and account (Opacus ``pre_step``), run ``after_noise``, update (step 3).

        ``after_noise`` may add gradients of data-independent terms (post-processing).
        """
        for probe in self.probes:
            probe.before_noise(self.parameters)
        if not self.optimizer.pre_step():
            return
        if self.distributed:  # sum the ranks' clipped sums; only rank 0 added noise
            self.optimizer.reduce_gradients()
        for probe in self.probes:
            probe.after_noise(self.parameters)
        if after_noise is not None:
            after_noise()
        self.optimizer.original_optimizer.step()

    def empty_step(self, after_noise: Callable[[], None] | None = None) -> None:
        """Empty Poisson batch: a pure-noise step, accounted like any other."""
        self.zero_grad()
        self._outputs.clear()
        for p in self.parameters:
            p.grad = torch.zeros_like(p)
        self.step(after_noise)

    def accumulate(self, per_cell_loss: torch.Tensor) -> None:
        r"""Add one physical chunk's :math:`\sum_i \mathrm{clip}_C(\nabla L_i)` to this step's sum.

        Opacus's skipped step: the optimizer moves ``.grad`` into its running ``summed_grad``
        without noise, scaling or accounting; the step's last chunk goes to :meth:`take_step`.
        """
        self.zero_grad()  # after a skipped step Opacus keeps the running summed_grad
        self.backward(per_cell_loss)
        self.optimizer.signal_skip_step(do_skip=True)
        if self.optimizer.pre_step():
            raise RuntimeError("Opacus took a noisy step on a chunk it was told to accumulate.")

    def take_step(
        self, per_cell_loss: torch.Tensor | None, after_noise: Callable[[], None] | None = None
    ) -> None:
        """One DP-SGD step on a Poisson batch's per-cell losses (``None``: the batch was empty)."""
        if per_cell_loss is None:
            self.empty_step(after_noise)
            return
        self.zero_grad()
        self.backward(per_cell_loss)
        self.step(after_noise)

    def close(self) -> None:
        """Remove Opacus's hooks and bookkeeping (state-dict keys never change)."""
        self._outputs.close()
        if self._gsm is not None:
            release_privacy_hooks(self._gsm, self.parameters)
            self._gsm = None


def poisson_steps(
    engine: DPSGDEngine,
    n_obs: int,
    steps: int,
    per_cell_loss: Callable[[torch.Tensor], torch.Tensor],
    after_step: Callable[[], None] | None = None,
    max_physical_batch: int = MAX_PHYSICAL_BATCH,
) -> int:
    """Return the one Poisson DP-SGD loop: ``steps`` draws at rate q, each an (empty or not) noisy step.

    ``per_cell_loss(indices)`` returns the loss vector of the sampled cells (its entry ``i`` may
    depend on cell ``indices[i]`` alone); it is called on chunks of at most
    ``max_physical_batch`` cells, so memory follows that bound rather than the Poisson batch
    (module docstring: one noisy, accounted step per draw whatever the chunking).
    ``after_step`` runs after every step (e.g. an EMA of the already-private weights). Returns
    the number of steps taken.
    """
    if max_physical_batch < 1:
        raise ValueError(f"max_physical_batch must be a positive number of cells, got {max_physical_batch}.")
    for batch in engine.settings.sampling.batches(n_obs, steps):
        indices = torch.as_tensor(batch, dtype=torch.long)
        if not len(indices):
            engine.take_step(None)
        else:
            *first, last = torch.split(indices, max_physical_batch)
            for chunk in first:
                engine.accumulate(per_cell_loss(chunk))
            engine.take_step(per_cell_loss(last))
        if after_step is not None:
            after_step()
    return steps
