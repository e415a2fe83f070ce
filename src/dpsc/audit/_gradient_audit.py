"""A one-run white-box audit of the DP-SGD engine on DP-DCAN's encoder with gradient canaries."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import scipy.sparse as sp
import torch

from .._api import renamed_arguments
from .._blocks import row_blocks
from ..module import DCANModule
from ..optim import make_optimizer
from ..privacy import (
    DPSGDEngine,
    DPSGDSettings,
    NoiseSource,
    PlannedRelease,
    ReleasePlan,
    history_epsilon,
    poisson_steps,
)
from ._canaries import GradientCanaries
from ._one_run import one_run_bound


def audit_schedule(n: int, epochs: int, batch_size: int | None) -> tuple[int, float, int]:
    """``(batch_size, q, steps)`` of a gradient-canary run (10 % batches by default)."""
    batch_size = max(1, round(0.1 * n)) if batch_size is None else batch_size
    q = batch_size / n
    return batch_size, q, epochs * max(1, round(1 / q))


@renamed_arguments("dpsc.audit.gradient_canary_run", seed="random_state")
def gradient_canary_run(
    counts: Any,
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
    random_state: int = 0,
    noise_seed: int | None = None,
    placement: Literal["padding", "quiet", "random"] = "padding",
    accountant: Literal["rdp", "prv"] = "rdp",
    noise_multiplier: float | None = None,
    _noise_scale: float = 1.0,
) -> dict[str, Any]:
    r"""Train DP-DCAN's encoder (instance stage) with DP-SGD and Dirac canaries; bound ε from one run.

    The run is what :func:`dpsc.tl.fit` does in its instance stage, through the same engine: per-cell
    losses, ghost clipping to C, Gaussian noise σC with σ calibrated for (``epsilon``, ``delta``)
    over ``epochs × round(1/q)`` Poisson steps; the decoder stays at its (data-independent)
    initialisation, so the run is (ε, δ)-DP in every example, cells and canaries alike.
    ``epsilon=None`` runs without noise (the leak must show). The auditor guesses
    ``round(guess_fraction · m)`` canaries on each side (fixed before the run).
    ``placement="padding"`` (default) widens the encoder's input by :math:`\lceil m/h\rceil` padding
    genes that are 0 in every cell and puts the canaries on their first-layer weights: a cell's
    gradient reaches a first-layer weight only through that gene's input, so the cells add exactly
    nothing there, and the choice reads no cell (the engine, the clipping and the noise are those of
    the real genes' model). ``"quiet"`` uses the first-layer weights of the genes seen in the fewest
    cells (:func:`quiet_coordinates`; it reads exact per-gene detection counts, so the report is not
    a DP release of the cells), ``"random"`` anywhere in the encoder. ``accountant`` calibrates σ and
    states the claim
    (``"prv"``: numerically tight; ``"rdp"``: an upper bound, looser by about 10 % here).
    With ``batch_size=n`` (q = 1) each canary's view of the run is one Gaussian mechanism, the
    case in which a one-run audit can come closest to the claim (docs/privacy.md).
    ``noise_multiplier`` skips the calibration (the caller calibrated with the same arguments).
    ``_noise_scale`` multiplies the noise while the claim stays the same: a deliberately broken
    mechanism, for tests only.
    """
    n = counts.shape[0]
    batch_size, q, steps = audit_schedule(n, epochs, batch_size)
    sigma = noise_multiplier
    if sigma is None:
        plan = ReleasePlan.of(PlannedRelease("dpsgd", sample_rate=q, steps=steps), accountant=accountant)
        sigma = plan.calibrate(epsilon, delta).sigma("dpsgd")
    claimed = float("inf") if epsilon is None else history_epsilon([(sigma, q, steps)], delta, accountant)
    if placement not in ("padding", "quiet", "random"):
        raise ValueError(f"Unknown placement {placement!r}; choose 'padding', 'quiet' or 'random'.")
    n_genes = counts.shape[1]
    pad = -(-n_canaries // n_hidden[0]) if placement == "padding" else 0
    torch.manual_seed(random_state)
    module = DCANModule(n_input=n_genes + pad, n_clusters=2, n_latent=n_latent, n_hidden=n_hidden)
    settings = DPSGDSettings.from_sigma(
        n_obs=n,
        sample_rate=q,
        noise_multiplier=sigma * _noise_scale,
        max_grad_norm=max_grad_norm,
        accountant=accountant,
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
        random_state=random_state,
        candidates=_candidates(placement, counts, n_canaries, n_hidden[0], pad),
    )
    engine.probes.append(canaries)
    masks = torch.Generator().manual_seed(random_state)
    module.train()

    def per_cell_loss(indices: torch.Tensor) -> torch.Tensor:
        rows = _rows(counts, indices)
        if pad:
            rows = torch.cat([rows, torch.zeros(rows.shape[0], pad)], dim=1)
        return module.instance_stage_loss(rows, rho=0.8, mask_rate=0.2, generator=masks)[0]

    try:
        poisson_steps(engine, n, steps, per_cell_loss)
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
        "placement": placement,
    }


def _candidates(placement: str, counts: Any, n_canaries: int, n_first: int, pad: int) -> np.ndarray | None:
    """Flat encoder coordinates the canaries may use (``None``: anywhere)."""
    if placement == "random":
        return None
    if placement == "quiet":
        return quiet_coordinates(counts, n_canaries, n_first)
    n_input = counts.shape[1] + pad
    genes = np.arange(counts.shape[1], n_input)
    return (np.arange(n_first)[:, None] * n_input + genes[None, :]).ravel()


def _rows(counts: Any, indices: torch.Tensor) -> torch.Tensor:
    """Return the sampled cells as a dense float32 tensor (a tensor, or rows of a sparse or backed matrix)."""
    if isinstance(counts, torch.Tensor):
        return counts[indices]
    block = counts[np.sort(indices.numpy())]
    return torch.as_tensor(np.asarray(block.toarray() if sp.issparse(block) else block, dtype=np.float32))


def _detecting_cells(counts: Any) -> np.ndarray:
    """Per gene, the number of cells with a count (row blocks; no dense copy)."""
    if isinstance(counts, torch.Tensor):
        return (counts > 0).sum(dim=0).cpu().numpy()
    total = np.zeros(counts.shape[1])
    for block in row_blocks(counts):
        total += np.asarray((block > 0).sum(0)).ravel()
    return total


def quiet_coordinates(counts: Any, n_canaries: int, n_first: int) -> np.ndarray:
    """First-layer encoder weights of the genes expressed in the fewest cells, at least ``n_canaries``.

    The first layer's weight ``W[h, g]`` gets a cell's gradient only through that cell's input
    ``x_g``, zero where gene ``g`` has no count; on the genes seen in the fewest cells the
    cells' own summed gradient, which every canary score carries as noise, is smallest. The
    weight is stored row-major ``(n_first, n_genes)``, so ``W[h, g]`` is flat coordinate
    ``h · n_genes + g``.
    """
    n_genes = counts.shape[1]
    expressing = _detecting_cells(counts)
    genes = np.argsort(expressing, kind="stable")[: min(n_genes, -(-n_canaries // n_first))]
    return (np.arange(n_first)[:, None] * n_genes + genes[None, :]).ravel()
