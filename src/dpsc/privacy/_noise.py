r"""Where every DP noise draw and every Poisson sample comes from.

A DP guarantee holds only against someone who cannot predict the noise. If the noise were a
function of a seed the user types (``random_state``) or a server chooses, anyone who knows
that seed would hold a deterministic function of the data, and no ε would hold against them.
So every mechanism in dpsc draws its noise and its Poisson samples from a stream of a
:class:`NoiseSource`, a :class:`~dpsc.privacy._random.SecureRandom` (AES-256-CTR keystream):

* by default (``noise_seed=None``) every stream is keyed with 256 fresh bits from the operating
  system's CSPRNG (:func:`~dpsc.privacy._random.secure_key`); the key is never stored, printed
  or returned, so two runs with the same ``random_state`` differ, and no output reveals the key;
* ``noise_seed=<int>`` is an explicit opt-in for tests and benchmarks that need repeatable
  runs: each stream's key is derived from the seed, the stream's name and a counter
  (:func:`~dpsc.privacy._random.derive_key`), so every release of a run draws *independent*
  noise (two releases never share a stream), yet the run repeats. The privacy record then says
  the guarantee does not hold against whoever knows that seed.

``random_state`` keeps seeding what is not a privacy mechanism: weight initialisation,
masking augmentations, post-processing k-means, data-independent projections.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from . import _random
from ._random import SecureRandom, derive_key


@dataclass(frozen=True)
class NoiseSource:
    """Factory of the secure streams a private computation draws its noise and samples from.

    Parameters
    ----------
    noise_seed
        ``None`` (default): every stream is keyed from OS entropy, so the noise is secret and
        differs run to run. An integer makes the noise repeatable (tests and benchmarks only);
        the guarantee then does not hold against anyone who knows it.
    shared_key
        The processes of one data-parallel fit (:func:`~dpsc.privacy.shared_noise_source`): 32
        secret bytes drawn from OS entropy by the first process and sent to the others over their
        process group, never stored; every stream is derived from it, so the processes draw the
        same noise for the same release (one release, made alike on every process) and their
        rank-indexed streams (each process's Poisson sample) stay independent.
    """

    noise_seed: int | None = None
    shared_key: bytes | None = field(default=None, compare=False, repr=False)
    _issued: Counter = field(default_factory=Counter, compare=False, repr=False)

    @property
    def secret(self) -> bool:
        """True when the noise is keyed from OS entropy."""
        return self.noise_seed is None

    def stream(self, name: str, *index: int) -> SecureRandom:
        """Return a fresh stream for the release ``name`` (and an index, e.g. a round or a rank).

        Every call returns a stream independent of every other: secret streams get their own OS
        key; seeded and shared-key streams a key derived from (seed or shared key, name, index,
        how many such streams this source issued before).
        """
        if self.noise_seed is None and self.shared_key is None:
            return SecureRandom(_random.secure_key())
        key = (name, *map(int, index))
        count = self._issued[key]
        self._issued[key] += 1
        root = self.shared_key.hex() if self.shared_key is not None else int(self.noise_seed)
        return SecureRandom(derive_key(root, *key, count))

    def describe(self) -> str:
        """One sentence for the privacy statement: where the noise came from."""
        if self.shared_key is not None:
            return (
                "Noise and Poisson samples were drawn from AES-256-CTR keystreams derived from one key "
                "drawn from OS entropy by the first process and shared with the fit's other processes "
                "over their process group; it was never stored."
            )
        if self.secret:
            return (
                "Noise and Poisson samples were drawn from AES-256-CTR keystreams keyed with OS "
                "entropy; the keys were never stored."
            )
        return (
            f"Noise and Poisson samples were drawn from keystreams derived from noise_seed="
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
