from __future__ import annotations

import tempfile

import numpy as np
import pytest
import torch

import dpsc
from dpsc.module import DCANModule
from dpsc.privacy import PrivacyRecord

torch.set_num_threads(2)


@pytest.fixture(scope="session", autouse=True)
def session_temp_dir(tmp_path_factory):
    """The run's temporary files (SuperNode logs, Flower's) go to this session's own folder, in this
    process and the ones it starts: no test reads another run's leftovers, none are left in /tmp."""
    folder = tmp_path_factory.mktemp("tmp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(folder))
        patch.setattr(tempfile, "tempdir", str(folder))
        yield folder


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


@pytest.fixture
def fast_train():
    """``tl.fit``/``DPDCAN.train`` options for a seconds-long fit: 2 + 1 epochs on the CPU, no bar."""
    return {"instance_epochs": 2, "cluster_epochs": 1, "progress_bar": False, "accelerator": "cpu"}


@pytest.fixture
def tiny_fit(fast_train):
    """``fast_train`` with 3 clusters (the small AnnData has few cell types)."""
    return {"n_clusters": 3, **fast_train}


@pytest.fixture
def gaussian_record():
    """Builder of a proven add/remove record of ``steps`` sampled-Gaussian releases (σ, q), as the
    engine writes it: ε from Opacus' RDP accountant at ``delta``, the history for the ledger."""

    def build(sigma: float, q: float, steps: int, delta: float = 1e-5) -> PrivacyRecord:
        from dpsc.privacy import history_epsilon

        return PrivacyRecord(
            tool="fit",
            epsilon=history_epsilon([(sigma, q, steps)], delta, "rdp"),
            delta=delta,
            guarantee="proven",
            statement="",
            history=[(sigma, q, steps)],
        )

    return build


@pytest.fixture
def launch_dpsc():
    """Start ``python -m dpsc.cli ARGS`` in its own process group (log to a file); all killed at teardown."""
    import os
    import signal
    import subprocess
    import sys

    started: list[subprocess.Popen] = []

    def launch(args: list[str], log) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, "-m", "dpsc.cli", *args],
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append(process)
        return process

    yield launch
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
