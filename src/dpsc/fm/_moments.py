r"""Data moments carrying every data-dependent coefficient of the polynomial energy; their release.

For a hidden unit with weights ``w`` and bias ``b`` and a polynomial ``Σ_l β_l z^l`` in place of
softplus, the data part of the objective over all cells ``t`` and patches ``p`` is

.. math:: Σ_{t,p} Σ_l β_l (κ w·u_{tp} + b)^l
          = Σ_l β_l Σ_{k=0}^{l} \binom{l}{k} b^{l−k} κ^k ⟨w^{⊗k}, M_k⟩,
          \qquad M_k = Σ_{t,p} u_{tp}^{⊗k},

so the data enter only through the moment tensors ``M_1, …, M_L`` (``M_0`` is the number of
patches, public under replace-one neighbours). Releasing them once with Laplace noise makes every
later use of the objective — any number of epochs — post-processing.
"""

from __future__ import annotations

import numpy as np

from ..privacy import SecureRandom, laplace_release

MAX_TENSOR_ENTRIES = 60_000_000


def moment_sensitivity(degree: int, n_patches: int = 1) -> float:
    """L1 sensitivity of ``(M_1, …, M_L)`` under replacing one sample.

    Each sample contributes ``Σ_p u_p^{⊗k}`` to ``M_k``. The L1 norm of the full (not
    symmetry-reduced) tensor ``u^{⊗k}`` is ``‖u‖_1^k``, so with the input contract
    ``‖u_p‖_1 ≤ 1/P`` for each of the ``P`` patches (:func:`check_patch_bound`)

    .. math:: ‖Σ_p u_p^{⊗k}‖_1 ≤ Σ_p ‖u_p‖_1^k ≤ P^{1−k},

    and replacing one sample moves all tensors together by at most
    ``Δ = 2 Σ_{k=1}^{L} P^{1−k}`` in L1 (``2L`` for dense input, ``P = 1``; close to 2 for a
    convolutional layer with many patches). This is our counterpart of Lemma 2 of Phan et al. 2017
    for the coefficient set used here.
    """
    return 2.0 * sum(float(n_patches) ** (1 - k) for k in range(1, degree + 1))


def check_patch_bound(patches: np.ndarray, atol: float = 1e-9) -> None:
    """Raise unless every patch satisfies ``‖u_p‖_1 ≤ 1/P`` (the bound the sensitivity assumes)."""
    per_patch = np.abs(patches).sum(axis=2)
    limit = 1.0 / patches.shape[1]
    if per_patch.size and per_patch.max() > limit * (1 + atol):
        raise ValueError(
            f"Input violates the bound the sensitivity assumes: a patch has ‖u_p‖_1 = {per_patch.max():.3g} "
            f"> 1/P = {limit:.3g}. Scale inputs with dpsc.fm.scale_patches (a public constant) first."
        )


def scale_patches(patches: np.ndarray, l1_bound: float | None = None) -> np.ndarray:
    """Map samples into ``‖u_p‖_1 ≤ 1/P`` per patch without using statistics of other samples.

    ``patches`` has shape ``(n, P, d)``. With ``l1_bound`` (a *public* bound on ``‖patch‖_1``,
    e.g. ``d`` for pixels in ``[0, 1]``) every patch is divided by ``P · l1_bound``, and a patch
    still above ``1/P`` is clipped to it; with ``l1_bound=None`` every patch is divided by
    ``P‖patch‖_1`` (direction kept, norm discarded). Both are per-sample maps.
    """
    patches = np.asarray(patches, dtype=float)
    if patches.ndim != 3:
        raise ValueError(f"patches must have shape (n, P, d), got {patches.shape}.")
    n_patches = patches.shape[1]
    norms = np.abs(patches).sum(axis=2, keepdims=True)
    if l1_bound is None:
        return np.divide(patches, n_patches * norms, out=np.zeros_like(patches), where=norms > 0)
    return patches / (n_patches * np.maximum(norms, float(l1_bound)))


def moment_tensors(patches: np.ndarray, degree: int, chunk_entries: int = 20_000_000) -> list[np.ndarray]:
    """``[M_1, …, M_L]`` with ``M_k = Σ_{t,p} u_{tp}^{⊗k}`` as full ``(d,)*k`` arrays.

    ``M_k`` is computed as ``T_aᵀ T_b`` with ``a = ⌈k/2⌉``, ``b = ⌊k/2⌋`` and ``T_a`` the rows'
    ``a``-fold Kronecker powers, in row chunks so that memory stays bounded.
    """
    rows = np.asarray(patches, dtype=float).reshape(-1, patches.shape[-1])
    d = rows.shape[1]
    if d**degree > MAX_TENSOR_ENTRIES:
        raise ValueError(
            f"The degree-{degree} moment tensor of {d}-dimensional inputs has {d**degree:.2e} entries; "
            f"use fewer input dimensions (e.g. n_components) or a smaller degree so that d**degree ≤ "
            f"{MAX_TENSOR_ENTRIES:.0e}."
        )
    moments = [np.zeros((d,) * k) for k in range(1, degree + 1)]
    half = (degree + 1) // 2
    step = max(1, chunk_entries // max(d**half, 1))
    for start in range(0, rows.shape[0], step):
        chunk = rows[start : start + step]
        powers = [np.ones((chunk.shape[0], 1))]
        for _ in range(half):
            powers.append((powers[-1][:, :, None] * chunk[:, None, :]).reshape(chunk.shape[0], -1))
        for k in range(1, degree + 1):
            a, b = (k + 1) // 2, k // 2
            moments[k - 1] += (powers[a].T @ powers[b]).reshape((d,) * k)
    return moments


def release_moments(
    moments: list[np.ndarray], epsilon: float, rng: SecureRandom, n_patches: int = 1
) -> tuple[list[np.ndarray], float]:
    """Laplace mechanism: add iid ``Lap(Δ/ε)`` to every entry of every moment tensor (lattice-encoded).

    Returns the noisy tensors and the Laplace scale ``Δ/ε`` with ``Δ`` from
    :func:`moment_sensitivity`. The released tensors satisfy ε-DP (Dwork et al. 2006, Thm. 1).
    """
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}.")
    scale = moment_sensitivity(len(moments), n_patches) / epsilon
    flat = laplace_release(np.concatenate([m.reshape(-1) for m in moments]), scale, rng)
    noisy, start = [], 0
    for m in moments:
        noisy.append(flat[start : start + m.size].reshape(m.shape))
        start += m.size
    return noisy, scale
