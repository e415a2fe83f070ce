r"""When are the cells too few for useful private clustering? The rule behind ``tl.fit``'s warning.

One DP-SGD step adds noise of standard deviation :math:`\sigma C` to the sum of about
:math:`qn` clipped per-cell gradients (each of norm at most :math:`C`), so the noisy mean
gradient carries the cells' signal against noise of relative size :math:`\sigma / (qn)`. The
warning compares the expected Poisson batch per unit of noise,

.. math:: b = q n / \sigma,

with a threshold read from measurements (``benchmarks/results/small_data.md``): default fits on
random subsamples of PBMC 4k and mouse bladder at ε = 8 (σ = 2.30, q = 0.1, so b = n / 23).
With 250, 500 and 1000 cells (b = 11, 22, 43) DP-DCAN's mean ARI was at most 0.34 on both, against
0.52 (PBMC) and 0.37 (bladder) with 2000 cells (b = 87) and 0.59 and 0.43 with all cells; the
56–124-cell embryo data sets of ``benchmarks/results/dpdcan.md`` (b ≤ 6) gave ARI ≈ 0. The
warning fires below b = 50, about 1150 cells at ε = 8 and more at smaller ε (σ grows). The
proven scope's default model (``scope="full"``, 16 DP principal components in; σ = 2.42, b = n / 24)
was measured the same way: at b ≤ 41 its mean ARI was at most 0.43 (PBMC) and 0.37 (bladder),
against 0.67 and 0.49 with all cells, so the same threshold serves it. Only the planned settings
enter (n, q, σ): the rule reads no cell, so the warning spends no privacy.
"""

from __future__ import annotations

MIN_BATCH_PER_NOISE = 50.0

# Measured below the threshold for each default model (benchmarks/results/small_data.md): the
# best mean ARI there, and the mean ARI with all cells on PBMC 4k and mouse bladder. Keyed by
# whether the model reads DP principal components (scope="full"'s default) or the genes.
MEASURED = {
    False: {"model": "the gene-reading model", "below": 0.34, "pbmc": 0.59, "bladder": 0.43},
    True: {"model": "the principal-component model", "below": 0.43, "pbmc": 0.67, "bladder": 0.49},
}


def batch_per_noise(n_obs: int, sample_rate: float, noise_multiplier: float) -> float:
    r"""Return the expected Poisson batch per unit of noise, :math:`b = qn/\sigma`."""
    return sample_rate * n_obs / max(noise_multiplier, 1e-12)


def small_data_message(
    n_obs: int, sample_rate: float, noise_multiplier: float, epsilon: float, reads_pcs: bool = False
) -> str | None:
    """Return the warning for a fit whose cells are too few at this ε, or ``None``.

    ``reads_pcs`` (the model reads DP principal components) picks the measured figures the
    message quotes; the threshold is the same for both models.
    """
    b = batch_per_noise(n_obs, sample_rate, noise_multiplier)
    if b >= MIN_BATCH_PER_NOISE:
        return None
    cells_needed = int(MIN_BATCH_PER_NOISE * noise_multiplier / sample_rate) + 1
    measured = MEASURED[bool(reads_pcs)]
    return (
        f"{n_obs} cells are few for private clustering at epsilon={epsilon:g}: each DP-SGD step "
        f"averages about {sample_rate * n_obs:.0f} cells under noise sigma={noise_multiplier:.2f} "
        f"(batch per unit of noise {b:.0f}, below {MIN_BATCH_PER_NOISE:.0f}). In measured fits "
        f"of {measured['model']} below this level the mean ARI was at most {measured['below']:.2f}, "
        f"against {measured['pbmc']:.2f} (PBMC 4k) and {measured['bladder']:.2f} (mouse bladder) "
        "with all cells (benchmarks/results/small_data.md). "
        f"What helps: more cells (about {cells_needed} at this epsilon), a larger epsilon, or, "
        "for a clustering without a deep model, dpsc.tl.cluster."
    )
