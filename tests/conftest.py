from __future__ import annotations

import numpy as np
import pytest
import torch

import dpsc
from dpsc.module import DCANModule

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def pbmc_full():
    return dpsc.datasets.pbmc4k()


@pytest.fixture
def small_adata(pbmc_full):
    """300 real PBMC cells × the 200 genes with most counts (every gene and cell non-zero)."""
    rng = np.random.default_rng(0)
    cells = np.sort(rng.choice(pbmc_full.n_obs, 300, replace=False))
    totals = np.asarray(pbmc_full.X.sum(0)).ravel()
    genes = np.sort(np.argsort(-totals)[:200])
    adata = pbmc_full[cells, genes].copy()
    keep = np.asarray(adata.X.sum(1)).ravel() > 0
    return adata[keep].copy()


@pytest.fixture
def tiny_module(small_adata):
    torch.manual_seed(0)
    module = DCANModule(n_input=small_adata.n_vars, n_clusters=3, n_latent=4, n_hidden=(16, 8))
    with torch.no_grad():
        module.clustering.centroids.normal_()
    return module


@pytest.fixture
def counts(small_adata):
    return torch.as_tensor(small_adata.X[:6].toarray(), dtype=torch.float32)


FAST = {"instance_epochs": 2, "cluster_epochs": 1, "progress_bar": False, "accelerator": "cpu"}
