r"""A cryptographically secure random source and the samplers every DP mechanism draws from.

**Bits.** :class:`SecureRandom` is the keystream of AES-256 in counter mode (NIST SP 800-38A;
the generator of NIST SP 800-90A's CTR_DRBG), keyed with 256 bits. A secret key comes from the
operating system's CSPRNG (:func:`secure_key`); nobody who does not hold the key can predict or
reconstruct the stream, however many outputs they see (which is not true of the Mersenne Twister
or PCG64: their state can be recovered from outputs). The key is never stored or returned.

**Samplers.**

* :meth:`SecureRandom.uniform`: uniforms on the grid :math:`(k + 1/2)2^{-52}` in (0, 1), the input of
  every other sampler;
  :meth:`SecureRandom.bernoulli_mask`: independent inclusion with rate q (Poisson sampling).
* :meth:`SecureRandom.discrete_gaussian` and :meth:`SecureRandom.discrete_laplace`: the exact
  samplers of Canonne, Kamath & Steinke (2020, Alg. 2 and 3) for integer-valued noise. Their
  outputs are integers, so floating-point arithmetic can only perturb the *probabilities* of
  outcomes (by about 10⁻¹⁶ relative), never make an outcome impossible for one input and possible
  for another: the "porous" floating-point attack on the Laplace mechanism (Mironov 2012) and on
  the Gaussian (Jin et al. 2022) does not apply. The releases of :class:`dpsc.privacy.GaussianSum`
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
_UNIT = 2.0**-52
_CHUNK = 1 << 22  # draws per rejection round of the exact samplers
_DIRECT = 10.0  # bernoulli_exp compares one uniform with exp(-gamma) up to this gamma
_EXP_MINUS_ONE = math.exp(-1.0)
_TAIL = 20  # _geometric_exp_minus_one's inverse-CDF part stops here (e^-20 is 10^7 grid steps)


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


#: How many times any keystream of this process was read: a call that fails before this moves has
#: drawn no noise and no sample, so it released nothing (:func:`dpsc.privacy._ledger.spending`).
_DRAWS = [0]


def draws() -> int:
    """Return how many reads of any keystream this process has made so far."""
    return _DRAWS[0]


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
        _DRAWS[0] += 1
        if len(SecureRandom._zeros) < n:
            SecureRandom._zeros = bytes(max(n, 2 * len(SecureRandom._zeros)))
        out = bytearray(n + 15)  # the cipher may write up to one block more
        self._encryptor.update_into(memoryview(SecureRandom._zeros)[:n], out)
        return memoryview(out)[:n]

    def words(self, n: int) -> np.ndarray:
        """Return ``n`` uniform 64-bit words."""
        return np.frombuffer(self.random_bytes(8 * int(n)), dtype=np.uint64)

    def uniform(self, size: int | tuple[int, ...]) -> np.ndarray:
        r"""Uniform floats :math:`(k + 1/2)\,2^{-52}`, k uniform below :math:`2^{52}`: never 0 or 1.

        Every value is exact in float64 (53 significant bits), so the largest is :math:`1 - 2^{-53}`.
        """
        n = int(np.prod(size))
        u = ((self.words(n) >> np.uint64(12)).astype(np.float64) + 0.5) * _UNIT
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
    def uniform_below(self, bound: int, size: int) -> np.ndarray:
        """Uniform integers in ``[0, bound)`` (rejection from the smallest power of two above, exact)."""
        bound, size = int(bound), int(size)
        if not 1 <= bound <= 2**62:
            raise ValueError(f"bound must be in [1, 2^62], got {bound}.")
        mask = np.uint64((1 << (bound - 1).bit_length()) - 1)
        out = np.empty(size, dtype=np.int64)
        filled = 0
        while filled < size:
            draws = (self.words(2 * (size - filled) + 8) & mask).astype(np.int64)
            kept = draws[draws < bound][: size - filled]
            out[filled : filled + kept.size] = kept
            filled += kept.size
        return out

    def bernoulli_exp(self, gamma: np.ndarray) -> np.ndarray:
        r"""Bernoulli(:math:`e^{-\gamma}`) for each :math:`\gamma \ge 0`, with no truncated tail.

        For :math:`\gamma \le` :data:`_DIRECT` a 52-bit uniform is compared with
        :math:`e^{-\gamma} \ge e^{-10}` (relative error of the probability below :math:`10^{-11}`).
        Beyond, as in CKS 2020 (Alg. 1),
        :math:`e^{-\gamma} = (e^{-1})^{\lfloor\gamma\rfloor} e^{-(\gamma - \lfloor\gamma\rfloor)}`:
        :math:`\lfloor\gamma\rfloor` draws of Bernoulli(:math:`e^{-1}`) and one of the fractional
        part must all be 1, so every probability drawn is at least :math:`e^{-1}` and no outcome
        gets probability 0 however large γ is (a single comparison with :math:`e^{-\gamma}` would
        make every :math:`\gamma > 36` impossible on the 52-bit grid).
        """
        gamma = np.asarray(gamma, dtype=np.float64).reshape(-1)
        if gamma.size and not (np.isfinite(gamma).all() and gamma.min() >= 0):
            raise ValueError("bernoulli_exp needs finite gamma >= 0.")
        out = np.empty(gamma.size, dtype=bool)
        direct = gamma <= _DIRECT
        out[direct] = self.uniform(int(direct.sum())) < np.exp(-gamma[direct])
        far = np.flatnonzero(~direct)
        if far.size:
            whole = np.floor(gamma[far])
            ok = self.uniform(far.size) < np.exp(-(gamma[far] - whole))
            alive, done = np.flatnonzero(ok), 0
            while alive.size:
                hit = self.uniform(alive.size) < _EXP_MINUS_ONE
                ok[alive[~hit]] = False
                done += 1
                alive = alive[hit]
                alive = alive[whole[alive] > done]
            out[far] = ok
        return out

    def _geometric_exp_minus_one(self, size: int) -> np.ndarray:
        r"""Integers :math:`V \ge 0` with :math:`P(V \ge v) = e^{-v}`, every value possible.

        :math:`\lfloor -\ln U\rfloor` below :data:`_TAIL` (where :math:`e^{-v}` is far above the
        uniform's grid); a draw at :data:`_TAIL` or beyond is :data:`_TAIL` plus a fresh draw (the
        geometric law is memoryless), so there is no largest value.
        """
        v = np.floor(-np.log(self.uniform(int(size)))).astype(np.int64)
        tail = np.flatnonzero(v >= _TAIL)
        if tail.size:
            v[tail] = _TAIL + self._geometric_exp_minus_one(tail.size)
        return v

    def geometric(self, scale: float, size: int) -> np.ndarray:
        r"""Integers :math:`G \ge 0` with :math:`P(G \ge g) = e^{-g/s}`, :math:`s \ge` ``scale``, no tail cut.

        After CKS 2020 (Alg. 2): with :math:`T = 2^m` and the integer
        :math:`a = \lfloor T/\text{scale}\rfloor` (so :math:`s = T/a` is ``scale`` rounded up by less
        than :math:`2^{-29}` relative: never less noise than asked), draw :math:`U` uniform in
        :math:`[0, T)` (m random bits) kept with probability :math:`e^{-U/T}` and :math:`V` with
        :math:`P(V \ge v) = e^{-v}` (:meth:`_geometric_exp_minus_one`); then :math:`X = U + TV` has
        :math:`P(X \ge x) = e^{-x/T}` on the integers, and :math:`G = \lfloor X / a\rfloor`. Every
        value has a positive probability (the inverse CDF :math:`\lfloor -s\ln U\rfloor` of a
        53-bit uniform never exceeds about 37 s, which made the discrete Laplace only (ε, δ)-DP).
        """
        if not (scale > 0 and math.isfinite(scale)) or scale > 2.0**50:
            raise ValueError(f"The geometric scale must be a positive number up to 2^50, got {scale}.")
        m = min(56, max(1, 30 + math.ceil(math.log2(scale))))
        T = 1 << m
        a = max(1, math.floor(T / scale))
        size = int(size)
        out = np.empty(size, dtype=np.int64)
        filled = 0
        while filled < size:
            want = int(1.65 * (size - filled)) + 16  # about 63 % of the U are kept
            U = (self.words(want) >> np.uint64(64 - m)).astype(np.int64)
            U = U[self.uniform(want) < np.exp(-U / T)][: size - filled]
            V = self._geometric_exp_minus_one(U.size)
            G = np.empty(U.size, dtype=np.int64)
            small = V < 64  # U + T V < 2^62: exact in int64
            G[small] = (U[small] + T * V[small]) // a
            G[~small] = [(int(u) + T * int(v)) // a for u, v in zip(U[~small], V[~small], strict=True)]
            out[filled : filled + U.size] = G
            filled += U.size
        return out

    def discrete_laplace(self, scale: float, size: int) -> np.ndarray:
        r"""Integers with :math:`P(Y = y) \propto e^{-|y|/s}`, :math:`s \ge` ``scale`` (CKS 2020, Alg. 2).

        A magnitude :math:`G` from :meth:`geometric` and a sign bit; a negative zero is redrawn.
        """
        if not scale > 0:
            raise ValueError(f"The discrete Laplace scale must be > 0, got {scale}.")
        size = int(size)
        out = np.empty(size, dtype=np.int64)
        filled = 0
        while filled < size:
            want = int(1.1 * (size - filled)) + 16
            magnitude = self.geometric(scale, want)
            negative = (np.frombuffer(self.random_bytes(want), dtype=np.uint8) & 1).astype(bool)
            keep = ~(negative & (magnitude == 0))
            kept = np.where(negative, -magnitude, magnitude)[keep][: size - filled]
            out[filled : filled + kept.size] = kept
            filled += kept.size
        return out

    def discrete_gaussian(self, sigma: float, size: int) -> np.ndarray:
        r"""Integers with :math:`P(Y = y) \propto e^{-y^2 / (2\sigma^2)}` (CKS 2020, Alg. 3).

        Rejection sampling from the discrete Laplace of scale :math:`t = \lfloor\sigma\rfloor + 1`
        (an integer: no rounding of the proposal): a draw :math:`Y` is kept with probability
        :math:`\exp(-(|Y| - \sigma^2/t)^2 / (2\sigma^2))`, drawn by :meth:`bernoulli_exp` (no
        truncated tail); about 70–85 % are kept.
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
            accept = self.bernoulli_exp((np.abs(y) - sigma**2 / t) ** 2 / (2.0 * sigma**2))
            kept = y[accept][: size - filled]
            out[filled : filled + kept.size] = kept
            filled += kept.size
        return out
