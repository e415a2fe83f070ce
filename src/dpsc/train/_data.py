"""Poisson-sampled mini-batches from an AnnData, as the privacy accountant assumes."""

from __future__ import annotations

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from scvi import REGISTRY_KEYS
from scvi.data import AnnDataManager
from torch.utils.data import DataLoader

from ..privacy import NoiseSource, world


class PoissonDataSplitter(LightningDataModule):
    r"""Training data module whose batches include each cell independently with rate ``q``.

    The RDP analysis of the sampled Gaussian mechanism assumes exactly this (Mironov et al.
    2019): batch sizes vary and a batch may be empty. Batches are read by scvi-tools'
    ``AnnTorchDataset`` (``adata_manager.create_torch_dataset``), so sparse and backed
    AnnData stream without densifying the whole matrix. There is no validation split: every
    cell is a training cell, and nothing is selected by a validation score.

    Under data parallelism (Lightning's DDP strategy) rank :math:`r` of :math:`W` reads only its
    shard, cells :math:`r, r+W, \dots`, and includes each with the same rate ``q`` from its own
    generator, so the ranks' batches together are one Poisson sample of all cells; every rank
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
        Source of the sampling generator: secret (OS entropy) unless a ``noise_seed`` was opted
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
        self.generator = noise.torch_generator("sampling")
        self.n_train = adata_manager.adata.n_obs
        self.n_val = 0
        self.train_idx = np.arange(self.n_train)
        self.val_idx = np.array([], dtype=int)
        self.test_idx = np.array([], dtype=int)

    def train_dataloader(self) -> DataLoader:
        """Loader yielding ``{"X": (batch, genes) float32}`` dicts, one per Poisson draw."""
        rank, world_size = world()
        shard = self.train_idx[rank::world_size]
        if world_size > 1:  # the process group exists only once Lightning has set it up
            self.generator = self.noise.torch_generator("sampling", rank=rank)
        dataset = self.adata_manager.create_torch_dataset(
            indices=shard, data_and_attributes={REGISTRY_KEYS.X_KEY: np.float32}
        )
        sampler = UniformWithReplacementSampler(
            num_samples=len(shard),
            sample_rate=self.sample_rate,
            generator=self.generator,
            steps=self.steps_per_epoch,
        )
        return DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=0)

    def sample_batch(self) -> dict[str, torch.Tensor]:
        """One Poisson batch outside the training loop (used by the DP k-means releases)."""
        dataset = self.adata_manager.create_torch_dataset(
            indices=self.train_idx, data_and_attributes={REGISTRY_KEYS.X_KEY: np.float32}
        )
        mask = torch.rand(self.n_train, generator=self.generator) < self.sample_rate
        batch = dataset[mask.nonzero().reshape(-1).tolist()]
        return {k: torch.as_tensor(v) for k, v in batch.items()}
