"""Poisson-sampled mini-batches from an AnnData, as the privacy accountant assumes."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from scvi import REGISTRY_KEYS
from scvi.data import AnnDataManager
from torch.utils.data import DataLoader, Sampler

from ..privacy import NoiseSource, SecureRandom, world


class PoissonBatchSampler(Sampler[list[int]]):
    """``steps`` batches, each holding every index independently with probability ``q``.

    The draws come from a secure stream (:class:`~dpsc.privacy.SecureRandom`); an empty batch is
    yielded as an empty list (the training step then takes a pure-noise step).
    """

    def __init__(self, n: int, sample_rate: float, steps: int, rng: SecureRandom) -> None:
        self.n, self.sample_rate, self.steps, self.rng = int(n), float(sample_rate), int(steps), rng

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            yield np.flatnonzero(self.rng.bernoulli_mask(self.n, self.sample_rate)).tolist()


class PoissonDataSplitter(LightningDataModule):
    r"""Training data module whose batches include each cell independently with rate ``q``.

    The RDP analysis of the sampled Gaussian mechanism assumes exactly this (Mironov et al.
    2019): batch sizes vary and a batch may be empty. Batches are read by scvi-tools'
    ``AnnTorchDataset`` (``adata_manager.create_torch_dataset``), so sparse and backed
    AnnData stream without densifying the whole matrix. There is no validation split: every
    cell is a training cell, and nothing is selected by a validation score.

    Under data parallelism (Lightning's DDP strategy) rank :math:`r` of :math:`W` reads only its
    shard, cells :math:`r, r+W, \dots`, and includes each with the same rate ``q`` from its own
    stream, so the ranks' batches together are one Poisson sample of all cells; every rank
    yields ``steps_per_epoch`` batches, empty ones included, so the ranks stay in step.

    Parameters
    ----------
    adata_manager
        Manager of the registered AnnData.
    sample_rate
        Poisson rate q.
    steps_per_epoch
        Number of batches per epoch (``round(1/q)``: one pass in expectation).
    noise
        Source of the sampling streams: secret (OS entropy) unless a ``noise_seed`` was opted
        into. Never ``random_state``: who knows the sample knows whose cells shaped each step.
    """

    def __init__(
        self, adata_manager: AnnDataManager, sample_rate: float, steps_per_epoch: int, noise: NoiseSource
    ):
        super().__init__()
        self.adata_manager = adata_manager
        self.sample_rate = sample_rate
        self.steps_per_epoch = steps_per_epoch
        self.noise = noise
        self.n_train = adata_manager.adata.n_obs
        self.n_val = 0
        self.train_idx = np.arange(self.n_train)
        self.val_idx = np.array([], dtype=int)
        self.test_idx = np.array([], dtype=int)
        self._release_rng: SecureRandom | None = None

    def train_dataloader(self) -> DataLoader:
        """Loader yielding ``{"X": (batch, genes) float32}`` dicts, one per Poisson draw."""
        rank, world_size = world()
        shard = self.train_idx[rank::world_size]
        dataset = self.adata_manager.create_torch_dataset(
            indices=shard, data_and_attributes={REGISTRY_KEYS.X_KEY: np.float32}
        )
        sampler = PoissonBatchSampler(
            len(shard), self.sample_rate, self.steps_per_epoch, self.noise.stream("sampling", rank)
        )
        return DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=0, collate_fn=_collate)

    def sample_batch(self) -> dict[str, torch.Tensor]:
        """Return one Poisson batch of all cells outside the training loop (DP k-means, frequencies)."""
        if self._release_rng is None:
            self._release_rng = self.noise.stream("sampling-releases")
        dataset = self.adata_manager.create_torch_dataset(
            indices=self.train_idx, data_and_attributes={REGISTRY_KEYS.X_KEY: np.float32}
        )
        index = np.flatnonzero(self._release_rng.bernoulli_mask(self.n_train, self.sample_rate)).tolist()
        return _collate(dataset[index])


def _collate(batch: dict) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(v) for k, v in batch.items()}
