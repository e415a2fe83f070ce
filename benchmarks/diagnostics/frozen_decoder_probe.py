"""Probe: a proven encoder-only DP-DCAN (decoder frozen at its data-independent start) against the rest.

The default-fit issue's item 1: under ``scope="encoder"`` the decoder trains on the cells without
noise (heuristic). Frozen at its initialisation (a seeded map that reads no cell), it is a public
function, and DP-SGD on the encoder and the centroids is the whole fit: proven, and Opacus still
privatizes only encoder modules. The probe patches the training plan's module split so that the
proven scope's model (``tl.fit(scope="full")``: 16 DP PCs in, 64 hidden, 16 latent) trains that
way, and compares, at each ε, on the six labelled files (3 runs, secret noise, one thread each):
``frozen`` (encoder + centroids private, decoder frozen), ``full`` (every parameter private),
``frozen_norec`` (frozen, reconstruction weight 0), and ``tl.cluster``.

    OMP_NUM_THREADS=2 python benchmarks/diagnostics/frozen_decoder_probe.py --data ../shared/data \
        --out benchmarks/results/frozen_decoder_probe.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cluster_benchmark import FILES, load, score
from cluster_lofo import scanpy_reference

FILES["cite_cbmc"] = "cite_cbmc_top2000.h5"


def frozen_split(self):
    """The module split of a proven encoder-only fit: the decoder frozen, never trained."""
    used = [self.module.encoder] if self.train_encoder else []
    if self.stage == "cluster":
        used.append(self.module.clustering)
    for module in self.module.public_decoder_modules():
        module.requires_grad_(False)
    return used, []


def run_variant(adata, k: int, epsilon: float, variant: str) -> np.ndarray:
    import dpsc
    from dpsc.train import _plan

    cells = adata.copy()
    original = _plan.DCANTrainingPlan._split_modules
    if variant.startswith("frozen"):
        _plan.DCANTrainingPlan._split_modules = frozen_split
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if variant == "tl.cluster":
                dpsc.tl.cluster(cells, k, epsilon=epsilon)
                return cells.obs["dp_kmeans"].to_numpy()
            extra = {"plan_kwargs": {"rho": 0.0}} if variant == "frozen_norec" else {}
            dpsc.tl.fit(cells, epsilon=epsilon, n_clusters=k, scope="full", progress_bar=False, **extra)
            return cells.obs["dp_cluster"].to_numpy()
    finally:
        _plan.DCANTrainingPlan._split_modules = original


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--files", nargs="*", default=list(FILES))
    parser.add_argument("--epsilons", nargs="*", type=float, default=[8.0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variants", default="frozen,full,frozen_norec,tl.cluster")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    for name in args.files:
        adata = load(args.data, name)
        truth = adata.obs["label"].to_numpy()
        k = len(np.unique(truth))
        reference = score(truth, scanpy_reference(adata, k))["ari"]
        for epsilon in args.epsilons:
            for variant in args.variants.split(","):
                for run in range(args.runs):
                    start = time.perf_counter()
                    row = score(truth, run_variant(adata, k, epsilon, variant))
                    row = {"dataset": name, "variant": variant, "epsilon": epsilon, "run": run, **row}
                    row |= {"scanpy_ari": reference, "seconds": time.perf_counter() - start}
                    with args.out.open("a") as out:
                        out.write(json.dumps(row) + "\n")
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
