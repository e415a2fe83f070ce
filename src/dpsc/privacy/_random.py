r"""A cryptographically secure random source and the samplers every DP mechanism draws from.

**Bits.** :class:`SecureRandom` is the keystream of AES-256 in counter mode (NIST SP 800-38A;
the generator of NIST SP 800-90A's CTR_DRBG), keyed with 256 bits. A secret key comes from the
operating system's CSPRNG (:func:`secure_key`); nobody who does not hold the key can predict or
reconstruct the stream, however many outputs they see (which is not true of the Mersenne Twister
or PCG64: their state can be recovered from outputs). The key is never stored or returned.

**Samplers.**

* :meth:`SecureRandom.uniform`: 53-bit uniforms in (0, 1), the input of every other sampler;
  :meth:`SecureRandom.bernoulli_mask`: independent inclusion with rate q (Poisson sampling).
* :meth:`SecureRandom.discrete_gaussian` and :meth:`SecureRandom.discrete_laplace`: the exact
  samplers of Canonne, Kamath & Steinke (2020, Alg. 2 and 3) for integer-valued noise. Their
  outputs are integers, so floating-point arithmetic can only perturb the *probabilities* of
  outcomes (by about 10⁻¹⁶ relative), never make an outcome impossible for one input and possible
  for another: the "porous" floating-point attack on the Laplace mechanism (Mironov 2012) and on
  the Gaussian (Jin et al. 2022) does not apply. The releases of :mod:`dpsc.privacy._release`
  use them on a lattice.
* :meth:`SecureRandom.gaussian_tensor`: continuous Gaussian noise for DP-SGD and for sampled
  releases, each value the sum of four Box–Muller draws divided by 2 (the mitigation of Holohan &
  Braghin 2021, §5.1, that Opacus's ``secure_mode`` uses), with the uniforms from the keystream.
"""

from __future__ import annotations

import hashlib
import math
import secrets

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

KEY_BYTES = 32
_UNIT = 2.0**-53
_CHUNK = 1 << 22  # draws per rejection round of the exact samplers


def secure_key() -> bytes:
    """Return 256 bits from the operating system's CSPRNG (the one seam tests patch)."""
    return secrets.token_bytes(KEY_BYTES)


def derive_key(*parts: object) -> bytes:
    """Return a 256-bit key derived from ``parts`` by SHA-256 (for seeded, repeatable streams)."""
    digest = hashlib.sha256(b"dpsc-noise-v2")
    for part in parts:
        encoded = str(part).encode()
        digest.update(len(encoded).to_bytes(4, "little") + encoded)
    return digest.digest()


class SecureRandom:
    """Random draws from the AES-256-CTR keystream of one key.

    Parameters
    ----------
    key
        32 bytes; :func:`secure_key` for secret noise.
    """

    _zeros = bytes(1 << 16)  # plaintext of the keystream (grown on demand, never written)

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"A SecureRandom key has {KEY_BYTES} bytes, got {len(key)}.")
        self._encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()

    # -- bits ------------------------------------------------------------------------------------
    def random_bytes(self, n: int) -> memoryview:
        """Return the next ``n`` bytes of the keystream (a writable buffer)."""
        n = int(n)
        if len(SecureRandom._zeros) < n:
            SecureRandom._zeros = bytes(max(n, 2 * len(SecureRandom._zeros)))
        out = bytearray(n + 15)  # the cipher may write up to one block more
        self._encryptor.update_into(memoryview(SecureRandom._zeros)[:n], out)
        return memoryview(out)[:n]

    def words(self, n: int) -> np.ndarray:
        """Return ``n`` uniform 64-bit words."""
        return np.frombuffer(self.random_bytes(8 * int(n)), dtype=np.uint64)

    def uniform(self, size: int | tuple[int, ...]) -> np.ndarray:
        """Uniform floats in (0, 1) with 53 random bits each (never exactly 0 or 1)."""
        n = int(np.prod(size))
        u = ((self.words(n) >> np.uint64(11)).astype(np.float64) + 0.5) * _UNIT
        return u.reshape(size)

    def bernoulli_mask(self, n: int, p: float) -> np.ndarray:
        """Boolean mask including each of ``n`` items independently with probability ``p``."""
        return self.uniform(n) < p

    def integers_mod(self, modulus: int, size: tuple[int, ...]) -> np.ndarray:
        """Uniform integers in ``[0, modulus)`` for a power-of-two ``modulus`` ≤ 2⁶³ (int64)."""
        if modulus <= 0 or modulus & (modulus - 1) or modulus > 2**63:
            raise ValueError(f"modulus must be a power of two in (0, 2^63], got {modulus}.")
        n = int(np.prod(size)) if size else 1
        return (self.words(n) & np.uint64(modulus - 1)).astype(np.int64).reshape(size)

    # -- continuous Gaussian ---------------------------------------------------------------------
    def standard_normal(self, n: int) -> np.ndarray:
        """``n`` standard normal float64 draws (Box–Muller on keystream uniforms)."""
        half = (int(n) + 1) // 2
        u = self.uniform(2 * half)
        radius = np.sqrt(-2.0 * np.log(u[:half]))
        angle = 2.0 * np.pi * u[half:]
        return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[: int(n)]

    def normal(self, std: float, size: int | tuple[int, ...]) -> np.ndarray:
        """N(0, std²) float64 values, each the sum of four draws divided by 2 (module docstring)."""
        n = int(np.prod(size))
        if std == 0 or n == 0:
            return np.zeros(size)
        draws = self.standard_normal(4 * n).reshape(4, n).sum(0) / 2.0
        return (std * draws).reshape(size)

    def gaussian_tensor(self, std: float, shape: tuple[int, ...], device: str = "cpu"):
        """Float32 tensor of N(0, std²) noise for DP-SGD: four Box–Muller draws summed, divided by 2.

        The arithmetic is float32, as Opacus's own sampler; on 2 CPU threads it costs what
        ``torch.normal`` does (about 17 ms for 2.1 million draws). Returns a torch tensor.
        """
        import torch

        n = int(np.prod(tuple(shape))) if len(shape) else 1
        if std == 0 or n == 0:
            return torch.zeros(shape, device=device)
        raw = torch.frombuffer(self.random_bytes(16 * n), dtype=torch.int32).view(2, 2 * n)
        # the top 23 bits as (k + 1/2) / 2^23, k in [0, 2^23): exact in float32, never 0 or 1
        u = ((raw >> 9) + 2**22).to(torch.float32).add_(0.5).mul_(2.0**-23)
        radius = torch.sqrt(-2.0 * torch.log(u[0]))
        angle = u[1].mul_(2.0 * math.pi)
        draws = torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)]).view(4, n)
        return (draws.sum(0) * (std / 2.0)).view(shape).to(device)

    def gamma(self, shape: int, scale: float) -> float:
        """Return a Gamma(shape, scale) draw for an integer ``shape``: the sum of ``shape`` exponentials."""
        if isinstance(shape, bool) or int(shape) != shape or shape < 1:
            raise ValueError(f"gamma needs an integer shape >= 1, got {shape}.")
        return float(-scale * np.log(self.uniform(int(shape))).sum())

    def seed(self) -> int:
        """Return a 31-bit integer for seeding post-processing samplers (e.g. a posterior sampler)."""
        return int(self.words(1)[0] >> np.uint64(33))

    # -- exact integer samplers (Canonne, Kamath & Steinke 2020) ---------------------------------
    def geometric(self, scale: float, size: int) -> np.ndarray:
        r"""Integers :math:`G \ge 0` with :math:`P(G \ge g) = e^{-g/\text{scale}}` (inverse CDF).

        :math:`G = \lfloor -\text{scale}\,\ln U\rfloor`; with 53-bit uniforms the largest value is
        about 36.7 × scale, so the tail beyond it (probability below 10⁻¹⁵) is never drawn.
        """
        return np.floor(-scale * np.log(self.uniform(int(size)))).astype(np.int64)

    def discrete_laplace(self, scale: float, size: int) -> np.ndarray:
        r"""Integers with :math:`P(Y = y) \propto e^{-|y|/\text{scale}}` (difference of two geometrics)."""
        if not scale > 0:
            raise ValueError(f"The discrete Laplace scale must be > 0, got {scale}.")
        return self.geometric(scale, size) - self.geometric(scale, size)

    def discrete_gaussian(self, sigma: float, size: int) -> np.ndarray:
        r"""Integers with :math:`P(Y = y) \propto e^{-y^2 / (2\sigma^2)}` (CKS 2020, Alg. 3).

        Rejection sampling from the discrete Laplace of scale :math:`t = \lfloor\sigma\rfloor + 1`:
        a draw :math:`Y` is kept with probability
        :math:`\exp(-(|Y| - \sigma^2/t)^2 / (2\sigma^2))`; about 70–85 % are kept.
        """
        size = int(size)
        if sigma == 0:
            return np.zeros(size, dtype=np.int64)
        if not sigma > 0:
            raise ValueError(f"The discrete Gaussian sigma must be >= 0, got {sigma}.")
        t = math.floor(sigma) + 1.0
        out = np.empty(size, dtype=np.int64)
        filled = 0
        while filled < size:
            want = min(_CHUNK, int(1.3 * (size - filled)) + 16)
            y = self.discrete_laplace(t, want)
            accept = self.uniform(want) < np.exp(-((np.abs(y) - sigma**2 / t) ** 2) / (2.0 * sigma**2))
            kept = y[accept][: size - filled]
            out[filled : filled + kept.size] = kept
            filled += kept.size
        return out
