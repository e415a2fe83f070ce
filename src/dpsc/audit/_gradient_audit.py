"""A one-run white-box audit of the DP-SGD engine on DP-DCAN's encoder with gradient canaries."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch

from ..module import DCANModule
from ..optim import make_optimizer
from ..privacy import (
    DPSGDEngine,
    DPSGDSettings,
    NoiseSource,
    calibrate_noise_multiplier,
    make_accountant,
    spent_epsilon,
)
from ._canaries import GradientCanaries
from ._one_run import one_run_bound


def gradient_canary_run(
    counts: torch.Tensor,
    *,
    epsilon: float | None,
    delta: float = 1e-5,
    n_canaries: int = 1000,
    guess_fraction: float = 0.1,
    confidence: float = 0.95,
    epochs: int = 5,
    batch_size: int | None = None,
    max_grad_norm: float = 0.1,
    n_hidden: tuple[int, ...] = (256, 64),
    n_latent: int = 32,
    lr: float = 1.0,
    seed: int = 0,
    noise_seed: int | None = None,
    placement: Literal["quiet", "random"] = "quiet",
    accountant: Literal["rdp", "prv"] = "rdp",
    _noise_scale: float = 1.0,
) -> dict[str, Any]:
    r"""Train DP-DCAN's encoder (instance stage) with DP-SGD and Dirac canaries; bound ε from one run.

    The run is what :func:`dpsc.tl.fit` does in its instance stage, through the same engine: per-cell
    losses, ghost clipping to C, Gaussian noise σC with σ calibrated for (``epsilon``, ``delta``)
    over ``epochs × round(1/q)`` Poisson steps; the decoder stays at its (data-independent)
    initialisation, so the run is (ε, δ)-DP in every example, cells and canaries alike.
    ``epsilon=None`` runs without noise (the leak must show). The auditor guesses
    ``round(guess_fraction · m)`` canaries on each side (fixed before the run).
    ``placement="quiet"`` puts the canaries on the first-layer weights of the genes seen in the
    fewest cells (:func:`quiet_coordinates`; the auditor may know the data, as DP's adversary
    does), ``"random"`` anywhere in the encoder. ``accountant`` calibrates σ and states the claim
    (``"prv"``: numerically tight; ``"rdp"``: an upper bound, looser by about 10 % here).
    With ``batch_size=n`` (q = 1) each canary's view of the run is one Gaussian mechanism, the
    case in which a one-run audit can come closest to the claim (docs/privacy.md).
    ``_noise_scale`` multiplies the noise while the claim stays the same: a deliberately broken
    mechanism, for tests only.
    """
    n = counts.shape[0]
    batch_size = max(1, round(0.1 * n)) if batch_size is None else batch_size
    q = batch_size / n
    steps = epochs * max(1, round(1 / q))
    sigma = 0.0 if epsilon is None else calibrate_noise_multiplier(epsilon, delta, q, steps, accountant)
    claimed = float("inf")
    if epsilon is not None:
        claim = make_accountant(accountant)
        claim.history = [(sigma, q, steps)]
        claimed = spent_epsilon(claim, delta)
    torch.manual_seed(seed)
    module = DCANModule(n_input=counts.shape[1], n_clusters=2, n_latent=n_latent, n_hidden=n_hidden)
    settings = DPSGDSettings(
        noise_multiplier=sigma * _noise_scale,
        max_grad_norm=max_grad_norm,
        sample_rate=q,
        expected_batch_size=batch_size,
        accountant=make_accountant(accountant),
        noise=NoiseSource(noise_seed),
    )
    params = list(module.encoder.parameters())
    engine = DPSGDEngine([module.encoder], make_optimizer("sgd", params, lr), settings)
    canaries = GradientCanaries(  # the auditor scores with the claimed σ, not the one that ran
        engine.parameters,
        n_canaries,
        clip_norm=max_grad_norm,
        sample_rate=q,
        noise_multiplier=sigma,
        expected_batch_size=batch_size,
        seed=seed,
        candidates=quiet_coordinates(counts, n_canaries, n_hidden[0]) if placement == "quiet" else None,
    )
    engine.probes.append(canaries)
    draw = settings.sampler()
    masks = torch.Generator().manual_seed(seed)
    module.train()
    try:
        for _ in range(steps):
            x = counts[draw(n)]
            if x.shape[0] == 0:
                engine.empty_step()
                continue
            engine.zero_grad()
            loss, _ = module.instance_stage_loss(x, rho=0.8, mask_rate=0.2, generator=masks)
            engine.backward(loss)
            engine.step()
    finally:
        engine.close()
    k = max(1, round(guess_fraction * n_canaries))
    bound = one_run_bound(
        canaries.scores, canaries.included, k_plus=k, k_minus=k, delta=delta, confidence=confidence
    )
    return {
        "epsilon_claimed": claimed,
        **bound,
        "delta": delta,
        "noise_multiplier": sigma,
        "sample_rate": q,
        "steps": steps,
        "history": [(sigma, q, steps)] if epsilon is not None else [],
        "accountant": accountant,
    }


def quiet_coordinates(counts: torch.Tensor, n_canaries: int, n_first: int) -> np.ndarray:
    """First-layer encoder weights of the genes expressed in the fewest cells, at least ``n_canaries``.

    The first layer's weight ``W[h, g]`` gets a cell's gradient only through that cell's input
    ``x_g``, zero where gene ``g`` has no count; on the genes seen in the fewest cells the
    cells' own summed gradient, which every canary score carries as noise, is smallest. The
    weight is stored row-major ``(n_first, n_genes)``, so ``W[h, g]`` is flat coordinate
    ``h · n_genes + g``.
    """
    n_genes = counts.shape[1]
    expressing = (counts > 0).sum(dim=0).cpu().numpy()
    genes = np.argsort(expressing, kind="stable")[: min(n_genes, -(-n_canaries // n_first))]
    return (np.arange(n_first)[:, None] * n_genes + genes[None, :]).ravel()
