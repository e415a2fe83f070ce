r"""Where every DP noise draw and every Poisson sample comes from.

A DP guarantee holds only against someone who cannot predict the noise. If the noise were a
function of a seed the user types (``random_state``) or a server chooses, anyone who knows
that seed would hold a deterministic function of the data, and no ε would hold against them.
So every mechanism in dpsc draws its noise and its Poisson samples from a :class:`NoiseSource`:

* by default (``noise_seed=None``) each generator is seeded with 63 fresh bits from the
  operating system's CSPRNG (:func:`secure_seed`, Python's :mod:`secrets`); the seed is never
  stored, printed or returned, so two runs with the same ``random_state`` differ;
* ``noise_seed=<int>`` is an explicit opt-in for tests and benchmarks that need repeatable
  runs. The privacy record then says the guarantee does not hold against whoever knows that
  seed.

``random_state`` keeps seeding what is not a privacy mechanism: weight initialisation,
masking augmentations, post-processing k-means.

The generators are torch's and numpy's standard ones seeded from OS entropy, not
cryptographic streams; what they protect is the secrecy of the seed (the attacker sees only
noisy aggregates, never the raw stream). Opacus's ``secure_mode`` (sum of four Gaussian draws,
against floating-point attacks on the noise) is on for secret DP-SGD noise.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np
import torch

#: Stream names: each mechanism of a run gets its own generator, so that adding a release to
#: one mechanism never shifts another's noise under a fixed ``noise_seed``.
STREAMS = ("sampling", "dpsgd", "releases", "laplace", "site", "loadings")


def secure_seed() -> int:
    """Return 63 bits from the operating system's CSPRNG (the one seam tests patch)."""
    return secrets.randbits(63)


@dataclass(frozen=True)
class NoiseSource:
    """Factory of the generators a private computation draws its noise and samples from.

    Parameters
    ----------
    noise_seed
        ``None`` (default): every generator is seeded from :func:`secure_seed`, so the noise is
        secret and differs run to run. An integer makes the noise repeatable (tests and
        benchmarks only); the guarantee then does not hold against anyone who knows it.
    """

    noise_seed: int | None = None

    @property
    def secret(self) -> bool:
        """True when the noise is seeded from OS entropy."""
        return self.noise_seed is None

    def _seed(self, stream: str, rank: int = 0) -> int:
        if stream not in STREAMS:
            raise ValueError(f"Unknown noise stream {stream!r}; one of {STREAMS}.")
        if self.noise_seed is None:
            return secure_seed()
        # each process of a data-parallel fit samples its own shard: its stream must differ
        entropy = [int(self.noise_seed), STREAMS.index(stream)] + ([int(rank)] if rank else [])
        state = np.random.SeedSequence(entropy).generate_state(2)
        return int((int(state[0]) << 31) ^ int(state[1])) & (2**63 - 1)

    def torch_generator(
        self, stream: str, device: torch.device | str = "cpu", rank: int = 0
    ) -> torch.Generator:
        """Return a fresh torch generator on ``device`` for the named stream (and process rank)."""
        return torch.Generator(device=device).manual_seed(self._seed(stream, rank))

    def numpy_rng(self, stream: str) -> np.random.Generator:
        """Return a fresh numpy generator for the named stream."""
        return np.random.default_rng(self._seed(stream))

    def describe(self) -> str:
        """One sentence for the privacy statement: where the noise came from."""
        if self.secret:
            return (
                "Noise and Poisson samples were drawn from generators seeded with OS entropy; the "
                "seed was never stored."
            )
        return (
            f"Noise and Poisson samples were drawn from a generator seeded with noise_seed="
            f"{self.noise_seed} (an opt-in for tests and benchmarks): the guarantee does NOT hold "
            "against anyone who knows that seed."
        )

    @classmethod
    def from_dict(cls, record: dict[str, object]) -> NoiseSource:
        """Inverse of :meth:`to_dict` (a record's ``noise`` field)."""
        return cls(None if record.get("secret", True) else int(record["noise_seed"]))

    def to_dict(self) -> dict[str, object]:
        """Plain record entry (``noise_seed`` is stored only when the user chose it)."""
        return {"secret": self.secret, "noise_seed": -1 if self.noise_seed is None else int(self.noise_seed)}


def poisson_mask(n: int, sample_rate: float, generator: torch.Generator) -> torch.Tensor:
    """Boolean mask including each of ``n`` items independently with probability ``sample_rate``."""
    return torch.rand(n, generator=generator, device=generator.device) < sample_rate
