r"""Exact integer sums over sites through Flower's SecAgg+, with cryptographic masks.

**What SecAgg+ gives.** Flower's ``SecAggPlusWorkflow`` (server) and ``secaggplus_mod`` (site)
implement SecAgg+ (Bell et al. 2020): every site adds pairwise and private masks to its vector
modulo :math:`M = 2^{32}`; the server learns only the sum over the sites that stayed, and only if
at least ``reconstruction_threshold`` of them help unmask (dropouts are tolerated down to that
threshold). The guarantee is against an honest-but-curious server that follows the protocol,
and against coalitions of fewer than the threshold.

**Exact integers through a float API.** The workflow takes float parameters, clips them to
``[-c, c]``, quantizes them to ``[0, T)`` with stochastic rounding, masks, sums, and hands the
strategy the *mean* weighted by each reply's example count. A site's vector is the integer
lattice vector of its noisy sum (:class:`~dpsc.privacy.GaussianSum`), at most 64 bits per
coordinate; :func:`to_digits` writes it modulo :math:`2^{64}` as :data:`LIMBS` digits of
:data:`DIGIT_BITS` bits and sends digit :math:`j` as the float :math:`j - c` with
:math:`c = T/2`, so that Flower's quantizer maps it back to exactly :math:`j` (an integer: its
stochastic rounding never rounds). Every site reports one example with ``max_weight = 1``, so the
weighting is 1 and the mean times the number of sites is the sum; :func:`from_digit_means` undoes
it and carries the digits (sums of at most :data:`MAX_SITES` digits stay below :math:`T` and
:math:`M`), giving the exact sum of the sites' integer vectors modulo :math:`2^{64}`, read as
signed. Nothing is lost to quantization.

**Masks.** Flower 1.41 derives each mask from ``pseudo_rand_gen``, which folds the 256-bit secret
into a 32-bit seed for NumPy's Mersenne Twister (flwrlabs/flower#7522, open): a server able to try
2³² seeds could remove a mask. :func:`use_secure_masks` replaces that function, in the two Flower
modules that call it, by :func:`secure_mask`: the AES-256-CTR keystream keyed with SHA-256 of the
whole secret, reduced modulo the (power-of-two) range. Server and sites both run dpsc's apps, so
both sides use it; a test checks that the patched generator is the one SecAgg+ calls.
"""

from __future__ import annotations

import hashlib
import importlib

import numpy as np

from ..privacy import SecureRandom

DIGIT_BITS = 16
LIMBS = 64 // DIGIT_BITS
TARGET_RANGE = 2**22  # Flower's quantization_range
CLIP_RANGE = float(TARGET_RANGE // 2)  # so that digit j travels as the float j - c
MODULUS_RANGE = 2**32
MAX_SITES = TARGET_RANGE // 2**DIGIT_BITS  # sums of this many digits stay below T
#: The two Flower modules whose ``pseudo_rand_gen`` draws the SecAgg+ masks.
SECAGG_MODULES = (
    "flwr.client.mod.secure_aggregation.secaggplus_mod",
    "flwr.server.workflow.secure_aggregation.secaggplus_workflow",
)


def to_digits(values: np.ndarray) -> list[np.ndarray]:
    """Return the :data:`LIMBS` float arrays that carry ``values`` (int64) exactly through SecAgg+."""
    words = np.asarray(values, dtype=np.int64).view(np.uint64)
    mask = np.uint64(2**DIGIT_BITS - 1)
    return [
        ((words >> np.uint64(DIGIT_BITS * limb)) & mask).astype(np.float64) - CLIP_RANGE
        for limb in range(LIMBS)
    ]


def from_digit_means(means: list[np.ndarray], n_sites: int) -> np.ndarray:
    """Return the exact int64 sum over ``n_sites`` sites from SecAgg+'s per-limb means (module docstring)."""
    if not 1 <= n_sites <= MAX_SITES:
        raise ValueError(f"Secure sums support 1 to {MAX_SITES} sites, got {n_sites}.")
    total = np.zeros(np.asarray(means[0]).shape, dtype=np.uint64)
    for limb, mean in enumerate(means):
        digit_sum = np.rint(np.asarray(mean, dtype=np.float64) * n_sites + n_sites * CLIP_RANGE)
        total += digit_sum.astype(np.uint64) << np.uint64(DIGIT_BITS * limb)  # wraps modulo 2^64
    return total.view(np.int64)


def sum_digits(digits_per_site: list[list[np.ndarray]]) -> np.ndarray:
    """Return the exact int64 sum of the sites' digit arrays (plain mode, or a test of the encoding)."""
    means = [np.mean([site[limb] for site in digits_per_site], axis=0) for limb in range(LIMBS)]
    return from_digit_means(means, len(digits_per_site))


def secure_mask(seed: bytes, num_range: int, dimensions_list: list[tuple[int, ...]]) -> list[np.ndarray]:
    """Return uniform integers in ``[0, num_range)`` (AES-256-CTR keyed with SHA-256(seed)) per shape."""
    rng = SecureRandom(hashlib.sha256(b"dpsc-secagg-mask" + bytes(seed)).digest())
    out = []
    for shape in dimensions_list:
        shape = tuple(shape)
        values = rng.integers_mod(int(num_range), shape if shape else (1,))
        out.append(values if shape else np.array(values[0], dtype=np.int64))
    return out


def use_secure_masks() -> None:
    """Make Flower's SecAgg+ (both sides) draw its masks from :func:`secure_mask` (idempotent)."""
    for name in SECAGG_MODULES:  # the modules, not the functions their packages re-export
        importlib.import_module(name).pseudo_rand_gen = secure_mask


def secagg_workflow(threshold: int, timeout: float | None):
    """Flower's SecAgg+ workflow for exact sums: every site holds a share, ``threshold`` to unmask."""
    from flwr.server.workflow import SecAggPlusWorkflow

    use_secure_masks()
    return SecAggPlusWorkflow(
        num_shares=1.0,  # every site is every other site's neighbour
        reconstruction_threshold=int(threshold),
        max_weight=1.0,
        clipping_range=CLIP_RANGE,
        quantization_range=TARGET_RANGE,
        modulus_range=MODULUS_RANGE,
        timeout=timeout,
    )
