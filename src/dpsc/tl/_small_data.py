r"""When are the cells too few for useful private clustering? The rule behind ``tl.fit``'s warning.

One DP-SGD step adds noise of standard deviation :math:`\sigma C` to the sum of about
:math:`qn` clipped per-cell gradients (each of norm at most :math:`C`), so the noisy mean
gradient carries the cells' signal against noise of relative size :math:`\sigma / (qn)`. The
warning compares the expected Poisson batch per unit of noise,

.. math:: b = q n / \sigma,

with the threshold :data:`MIN_BATCH_PER_NOISE`, read from default fits on random subsamples of
PBMC 4k and mouse bladder (the benchmarks page of the docs, "small data"): below it the fits of
both default models (the gene-reading one and ``scope="full"``'s principal-component one) were
far below the same fits with all cells. Only the planned settings enter (n, q, σ): the rule
reads no cell, so the warning spends no privacy.
"""

from __future__ import annotations

#: Batch per unit of noise below which the measured fits lost most of their accuracy (docs,
#: benchmarks page, "small data").
MIN_BATCH_PER_NOISE = 50.0
MODELS = {False: "the gene-reading model", True: "the principal-component model"}


def batch_per_noise(n_obs: int, sample_rate: float, noise_multiplier: float) -> float:
    r"""Return the expected Poisson batch per unit of noise, :math:`b = qn/\sigma`."""
    return sample_rate * n_obs / max(noise_multiplier, 1e-12)


def small_data_message(
    n_obs: int, sample_rate: float, noise_multiplier: float, epsilon: float, reads_pcs: bool = False
) -> str | None:
    """Return the warning for a fit whose cells are too few at this ε, or ``None``.

    ``reads_pcs``: the model reads DP principal components (named in the message); the threshold
    is the same for both models.
    """
    b = batch_per_noise(n_obs, sample_rate, noise_multiplier)
    if b >= MIN_BATCH_PER_NOISE:
        return None
    cells_needed = int(MIN_BATCH_PER_NOISE * noise_multiplier / sample_rate) + 1
    return (
        f"{n_obs} cells are few for private clustering at epsilon={epsilon:g}: each DP-SGD step "
        f"averages about {sample_rate * n_obs:.0f} cells under noise sigma={noise_multiplier:.2f} "
        f"(batch per unit of noise {b:.0f}, below {MIN_BATCH_PER_NOISE:.0f}). Measured fits of "
        f"{MODELS[bool(reads_pcs)]} below this level were far less accurate than with all cells "
        "(dpsc docs, benchmarks: small data). "
        f"What helps: more cells (about {cells_needed} at this epsilon), a larger epsilon, or, "
        "for a clustering without a deep model, dpsc.tl.cluster."
    )
