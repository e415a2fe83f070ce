"""Diagnostic (#98): why ``obsm["X_dpdcan"]`` has lower kNN label purity than ``obsm["X_dp_cluster"]``.

``probe FILE``: one ``tl.fit(epsilon=8)`` and one ``tl.cluster(epsilon=8)`` at ``noise_seed=3`` (repeatable
for the diagnostic only); the kNN label purity (``fit_default.knn_purity``, k = 15) of the model's
input (the unit-norm clustering points it reads), of ``X_dpdcan``, of ``X_dp_cluster`` and of
``X_dp_cluster`` scaled to unit norm. ``residual``: the default fit on every file, 3 runs of secret
noise, with the PC model's encoder made identity + MLP (its last layer zero at start), the lever
tried; purity and ARI per run. Labels for scoring only.

    OMP_NUM_THREADS=2 python benchmarks/embedding_purity_probe.py probe pbmc
    OMP_NUM_THREADS=2 python benchmarks/embedding_purity_probe.py residual > residual.jsonl
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from cluster_benchmark import FILES, load, score
from fit_default import knn_purity

import dpsc
from dpsc.module import _dcan

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
FILES["cite_cbmc"] = "cite_cbmc_top2000.h5"


def probe(name: str) -> dict:
    adata = load(DATA, name)
    truth = adata.obs["label"].to_numpy()
    k = len(np.unique(truth))
    cells, clustered = adata.copy(), adata.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = dpsc.tl.fit(
            cells, epsilon=8, n_clusters=k, progress_bar=False, return_model=True, noise_seed=3
        )
        dpsc.tl.cluster(clustered, k, epsilon=8, noise_seed=3)
    matrix = model.adata_manager.get_from_registry("X")
    x = torch.as_tensor(matrix.toarray() if hasattr(matrix, "toarray") else matrix, dtype=torch.float32)
    with torch.no_grad():
        rep = model.module.represent(_dcan.clean_input(x, model.module.likelihood)).numpy()
    points = clustered.obsm["X_dp_cluster"]
    unit = points / np.linalg.norm(points, axis=1, keepdims=True).clip(1e-12)
    return {
        "dataset": name,
        "model_input": knn_purity(rep, truth),
        "X_dpdcan": knn_purity(cells.obsm["X_dpdcan"], truth),
        "X_dp_cluster": knn_purity(points, truth),
        "X_dp_cluster_unit_norm": knn_purity(unit, truth),
    }


def residual_encoder() -> None:
    """Make the PC model's encoder identity + MLP, the MLP's last layer zero at start."""
    init, plain = _dcan.DCANModule.__init__, _dcan.DCANModule.encode

    def start(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.residual_ = self.input_pcs is not None and self.input_pcs == self.n_latent
        if self.residual_:
            last = [m for m in self.encoder if isinstance(m, torch.nn.Linear)][-1]
            torch.nn.init.zeros_(last.weight)
            torch.nn.init.zeros_(last.bias)

    def encode(self, rep):
        if not getattr(self, "residual_", False):
            return plain(self, rep)
        h = rep + self.encoder(rep)
        return (
            h if self.latent_scale is None else self.latent_scale * torch.nn.functional.normalize(h, dim=-1)
        )

    _dcan.DCANModule.__init__, _dcan.DCANModule.encode = start, encode


def residual_runs() -> None:
    residual_encoder()
    for name in FILES:
        adata = load(DATA, name)
        truth = adata.obs["label"].to_numpy()
        k = len(np.unique(truth))
        for run in range(3):
            cells = adata.copy()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dpsc.tl.fit(cells, epsilon=8, n_clusters=k, progress_bar=False)
            labels = cells.obs["dp_cluster"].to_numpy()
            row = {"dataset": name, "run": run, **score(truth, labels)}
            row["purity"] = knn_purity(cells.obsm["X_dpdcan"], truth)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "probe":
        print(json.dumps(probe(sys.argv[2])))
    else:
        residual_runs()
