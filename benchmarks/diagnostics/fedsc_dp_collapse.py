"""Why private FedSC puts every cell in one cluster: the embedding's geometry and its DP k-means.

Runs ``dpsc.tl.fit_federated`` as ``federated_benchmark.py``'s "fedsc DP ε=… sgd" rows do (PBMC
4k, 4 non-IID sites, ``noise_seed`` = seed: repeatable, no guarantee against the seed), then reads
the global embedding Z (label-free unless said):

- its geometry: mean row norm, the norm of the mean of the unit-norm rows (1: every cell points
  the same way; the final federated DP k-means clusters these unit rows), effective rank;
- ARI of the federated DP k-means labels and how many cells each cluster holds;
- non-private k-means (scikit-learn, 10 starts) of Z and of its unit rows: the signal the
  embedding carries (labels for scoring only; a diagnostic, not a release);
- an ablation (non-private: the mean direction is computed from the cells): the same central DP
  k-means (``KMEANS_PLAN``, noise multiplier √(Σ σ_k²) of the sites' k-means σ, as the summed
  site tables have) on the unit rows as they are, and on the unit rows with their coordinate
  along the exact mean direction weighted w (``tl.cluster``'s ``MEAN_WEIGHT`` is 0.5; 0 centres
  them on the sphere), then scaled to unit norm.

    python benchmarks/diagnostics/fedsc_dp_collapse.py --data ../shared/data --seed 0 --rounds 50 \\
        --local-epochs 5 --epsilon 8 --out benchmarks/results/fedsc_dp_collapse.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/


def effective_rank(Z: np.ndarray) -> float:
    """exp of the entropy of the normalised singular values of the centred rows."""
    s = np.linalg.svd(Z - Z.mean(0), compute_uv=False)
    p = s / s.sum()
    return float(np.exp(-(p * np.log(p + 1e-12)).sum()))


def weighted_unit_rows(unit: np.ndarray, weight: float) -> np.ndarray:
    r"""Rows :math:`(w\,(x^\top u)\,u + x - (x^\top u)\,u) / \lVert\cdot\rVert` (u: exact mean direction)."""
    u = unit.mean(0)
    u /= np.linalg.norm(u)
    along = unit @ u
    rows = weight * along[:, None] * u[None] + (unit - along[:, None] * u[None])
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def central_dp_kmeans(points: np.ndarray, k: int, sigma: float, seed: int) -> np.ndarray:
    """Labels of the central DP k-means at ``KMEANS_PLAN`` and noise multiplier ``sigma`` (secret noise)."""
    import torch

    from dpsc.privacy import NoiseSource
    from dpsc.privacy._clustering import CLIP_NORM, KMEANS_PLAN
    from dpsc.privacy._kmeans import central_table_release, dp_kmeans_centroids, nearest_centroid

    noise = NoiseSource()
    draws = itertools.count()
    release = central_table_release(
        torch.as_tensor(points),
        clip_norm=CLIP_NORM,
        count_scale=KMEANS_PLAN["count_scale"],
        noise_multiplier=sigma,
        draw_stream=lambda: noise.stream("diagnostic.kmeans", next(draws)),
    )
    centroids = dp_kmeans_centroids(
        release,
        k,
        points.shape[1],
        noise_multiplier=sigma,
        clip_norm=CLIP_NORM,
        random_state=seed,
        **KMEANS_PLAN,
    )
    return nearest_centroid(points, centroids, "cosine")


def summed_kmeans_sigma(adata, epsilon: float, rounds: int, local_epochs: int) -> float:
    """√(Σ σ_k²) of the sites' k-means noise multipliers, as ``fit_federated`` plans them."""
    from dpsc.federated import dp_schedule
    from dpsc.federated._fedsc_site import fedsc_noise
    from dpsc.federated._ssl import SSLConfig

    sigmas = []
    for size in adata.obs["site"].value_counts().to_numpy():
        q, per_epoch = dp_schedule(int(size), SSLConfig().batch_size)
        sigmas.append(fedsc_noise(epsilon, 1e-5, q, rounds * local_epochs * per_epoch)[1])
    return float(np.sqrt(np.sum(np.square(sigmas))))


def main() -> None:
    import scanpy as sc

    import dpsc

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--local-epochs", type=int, default=5)
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    adata = dpsc.datasets.read_h5(args.data / "pbmc_10x_4k_top2000.h5")
    sc.pp.filter_genes(adata, min_counts=1)
    k, truth = adata.obs["label"].nunique(), adata.obs["label"].astype(str).to_numpy()
    dpsc.pp.partition(adata, 4, label_key="label", types_per_site=2, random_state=args.seed)
    start = time.perf_counter()
    dpsc.tl.fit_federated(
        adata,
        method="fedsc",
        n_clusters=k,
        rounds=args.rounds,
        local_epochs=args.local_epochs,
        random_state=args.seed,
        noise_seed=args.seed,
        epsilon=args.epsilon,
        optimizer="sgd",
    )
    Z = np.asarray(adata.obsm["X_fedsc"], dtype=np.float64)
    unit = Z / np.maximum(np.linalg.norm(Z, axis=1, keepdims=True), 1e-12)
    labels = adata.obs["fed_cluster"].astype(int).to_numpy()
    sigma = summed_kmeans_sigma(adata, args.epsilon, args.rounds, args.local_epochs)
    row = {
        "seed": args.seed,
        "rounds": args.rounds,
        "local_epochs": args.local_epochs,
        "epsilon": args.epsilon,
        "fit_s": time.perf_counter() - start,
        "row_norm": float(np.linalg.norm(Z, axis=1).mean()),
        "mean_unit_norm": float(np.linalg.norm(unit.mean(0))),
        "effective_rank": effective_rank(Z),
        "fedsc_ari": adjusted_rand_score(truth, labels),
        "fedsc_cluster_sizes": np.bincount(labels, minlength=k).tolist(),
        "kmeans_ari_Z": adjusted_rand_score(truth, KMeans(k, n_init=10, random_state=0).fit_predict(Z)),
        "kmeans_ari_unit": adjusted_rand_score(truth, KMeans(k, n_init=10, random_state=0).fit_predict(unit)),
        "summed_kmeans_sigma": sigma,
    }
    for name, points in [
        ("unit", unit),
        ("w0.5", weighted_unit_rows(unit, 0.5)),
        ("w0", weighted_unit_rows(unit, 0.0)),
    ]:
        pred = central_dp_kmeans(points, k, sigma, args.seed)
        row[f"dp_kmeans_ari_{name}"] = adjusted_rand_score(truth, pred)
        row[f"dp_kmeans_used_{name}"] = len(np.unique(pred))
    print(json.dumps(row), flush=True)
    if args.out:
        with args.out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
