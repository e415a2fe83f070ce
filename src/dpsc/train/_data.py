"""Poisson-sampled mini-batches from an AnnData, as the privacy accountant assumes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp
import torch
from lightning.pytorch import LightningDataModule
from scvi import REGISTRY_KEYS
from scvi.data import AnnDataManager
from torch.utils.data import DataLoader

from ..privacy import PoissonSampling, world


class PoissonDataSplitter(LightningDataModule):
    r"""Training data module whose batches are the fit's Poisson sample (each cell with rate ``q``).

    The batches are drawn by the one sampler, :class:`~dpsc.privacy.PoissonSampling` (the
    accountant's assumption is stated there). Batches are read by scvi-tools'
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
    sampling
        The fit's Poisson sampler (its rate q and secret streams).
    steps_per_epoch
        Number of batches per epoch (``round(1/q)``: one pass in expectation).
    """

    def __init__(self, adata_manager: AnnDataManager, sampling: PoissonSampling, steps_per_epoch: int):
        super().__init__()
        self.adata_manager = adata_manager
        self.sampling = sampling
        self.steps_per_epoch = steps_per_epoch
        self.n_train = adata_manager.adata.n_obs
        self.n_val = 0
        self.train_idx = np.arange(self.n_train)
        self.val_idx = np.array([], dtype=int)
        self.test_idx = np.array([], dtype=int)
        self._release_rows: Callable[[int], list[int]] | None = None

    def train_dataloader(self) -> DataLoader:
        """Loader yielding ``{"X": (batch, genes) float32}`` dicts, one per Poisson draw."""
        rank, world_size = world()
        shard = self.train_idx[rank::world_size]
        dataset = self.adata_manager.create_torch_dataset(
            indices=shard, data_and_attributes={REGISTRY_KEYS.X_KEY: np.float32}
        )
        sampler = self.sampling.batches(len(shard), self.steps_per_epoch, rank)
        return DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=0, collate_fn=_collate)

    def sample_batch(self) -> dict[str, torch.Tensor]:
        """Return one Poisson batch of all cells outside the training loop (DP k-means, frequencies)."""
        if self._release_rows is None:
            self._release_rows = self.sampling.release_rows()
        dataset = self.adata_manager.create_torch_dataset(
            indices=self.train_idx, data_and_attributes={REGISTRY_KEYS.X_KEY: np.float32}
        )
        return _collate(dataset[self._release_rows(self.n_train)])


def _collate(batch: dict) -> dict[str, torch.Tensor]:
    return {k: as_tensor(v) for k, v in batch.items()}


def as_tensor(values) -> torch.Tensor:
    """Return a batch's array as a tensor (a sparse block, such as a Dask chunk of CSR rows, densified)."""
    if isinstance(values, torch.Tensor):
        return values
    return torch.as_tensor(values.toarray() if sp.issparse(values) else np.asarray(values))
