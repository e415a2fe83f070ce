"""Does a lower k-means objective score a higher ARI? Single-start k-means on scanpy's reference PCA.

Per labelled count file: scanpy's reference representation of ``cluster_benchmark.py``
(``normalize_total`` + ``log1p`` + 2,000 highly variable genes when there are more + ``pca`` (16),
no privacy), then ``--starts`` runs of scikit-learn's k-means with one start each
(``random_state`` = run), k = the number of labelled types. Reported: the correlation of the
objective (inertia) with ARI over the runs, and the mean ARI and NMI of the tenth of runs with
the lowest objective against the third with the highest. Where the correlation is positive, a
k-means that gets closer to its optimum scores a lower ARI on that file, so a private k-means
whose noise shrinks as ε grows need not be monotone in ARI there. ``--private-epsilons`` also
runs ``dpsc.tl.cluster`` (secret noise, ``--private-runs`` runs, ``epsilon=None`` written ``inf``:
no noise) and scores its partition by the same objective in the same reference space (the sum of
squared distances of the cells to their cluster's mean), so that its distance to the optimum can
be read against ε. Labels for scoring only.

    python benchmarks/diagnostics/kmeans_optima.py --data ../shared/data \\
        --out benchmarks/results/kmeans_optima.jsonl --starts 100 \\
        --private-epsilons 4 8 16 32 inf --private-runs 6
    python benchmarks/diagnostics/kmeans_optima.py --report benchmarks/results/kmeans_optima.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
DATASETS = ["pbmc", "paul15", "bladder", "bladder_allgenes", "pancreas"]


def reference_pca(adata) -> np.ndarray:
    """scanpy's reference representation of ``cluster_benchmark.scanpy_reference`` (no k-means)."""
    import scanpy as sc

    cells = adata.copy()
    sc.pp.normalize_total(cells, target_sum=1e4)
    sc.pp.log1p(cells)
    if cells.n_vars > 2000:
        sc.pp.highly_variable_genes(cells, n_top_genes=2000, subset=True)
    sc.pp.pca(cells, n_comps=16, random_state=0)
    return cells.obsm["X_pca"]


def partition_objective(points: np.ndarray, labels) -> float:
    r"""k-means objective of a partition: :math:`\sum_c \sum_{i \in c} \lVert x_i - \bar x_c\rVert^2`."""
    labels = np.asarray(labels)
    return float(
        sum(((points[labels == c] - points[labels == c].mean(0)) ** 2).sum() for c in np.unique(labels))
    )


def private_rows(adata, points: np.ndarray, name: str, epsilons: list[float], runs: int):
    """``dpsc.tl.cluster``'s partitions scored by the reference-space objective, ARI and NMI."""
    import dpsc

    k, truth = adata.obs["label"].nunique(), adata.obs["label"].values
    for epsilon in epsilons:
        for seed in range(runs):
            cells = adata.copy()
            dpsc.tl.cluster(cells, k, epsilon=None if np.isinf(epsilon) else epsilon, random_state=seed)
            labels = cells.obs["dp_kmeans"].values
            yield {
                "data": name,
                "method": "tl.cluster",
                "epsilon": epsilon,
                "run": seed,
                "inertia": partition_objective(points, labels),
                "ari": adjusted_rand_score(truth, labels),
                "nmi": normalized_mutual_info_score(truth, labels),
            }


def run(
    data: Path, out: Path, starts: int, datasets: list[str], epsilons: list[float], private_runs: int
) -> None:
    from cluster_benchmark import load
    from sklearn.cluster import KMeans

    for name in datasets:
        adata = load(data, name)
        k, truth = adata.obs["label"].nunique(), adata.obs["label"].values
        points = reference_pca(adata)
        for seed in range(starts):
            fit = KMeans(k, n_init=1, random_state=seed).fit(points)
            row = {
                "data": name,
                "method": "k-means, one start",
                "run": seed,
                "inertia": float(fit.inertia_),
                "ari": adjusted_rand_score(truth, fit.labels_),
                "nmi": normalized_mutual_info_score(truth, fit.labels_),
            }
            with out.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
        for row in private_rows(adata, points, name, epsilons, private_runs):
            with out.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
        print(name, "done", flush=True)


def report(path: Path) -> str:
    every = pd.read_json(path, lines=True)
    rows = every[every["method"] == "k-means, one start"]
    lines = [
        "| data | runs | corr(objective, ARI) | ARI, lowest-objective tenth | ARI, highest-objective third "
        "| NMI, lowest tenth | NMI, highest third | ARI range |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, group in rows.groupby("data", sort=False):
        ordered = group.sort_values("inertia")
        best = ordered.head(max(len(ordered) // 10, 1))
        worst = ordered.tail(max(len(ordered) // 3, 1))
        corr = np.corrcoef(group["inertia"], group["ari"])[0, 1]
        lines.append(
            f"| {name} | {len(group)} | {corr:+.2f} | {best.ari.mean():.3f} | {worst.ari.mean():.3f} "
            f"| {best.nmi.mean():.3f} | {worst.nmi.mean():.3f} "
            f"| {group.ari.min():.3f}–{group.ari.max():.3f} |"
        )
    private = every[every["method"] == "tl.cluster"]
    if len(private):
        lines += [
            "",
            "| data | tl.cluster ε | objective (reference space) | ARI | NMI | runs |",
            "|---|---|---|---|---|---|",
        ]
        optimum = rows.groupby("data")["inertia"].min()
        for (name, epsilon), group in private.groupby(["data", "epsilon"], sort=False):
            excess = group.inertia.mean() / optimum[name] - 1
            lines.append(
                f"| {name} | {epsilon:g} | +{100 * excess:.1f} % over the best single start "
                f"| {group.ari.mean():.3f} ± {group.ari.std():.3f} | {group.nmi.mean():.3f} | {len(group)} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--starts", type=int, default=100)
    parser.add_argument("--datasets", nargs="+", default=DATASETS)
    parser.add_argument("--private-epsilons", type=float, nargs="*", default=[])
    parser.add_argument("--private-runs", type=int, default=6)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    run(args.data, args.out, args.starts, args.datasets, args.private_epsilons, args.private_runs)


if __name__ == "__main__":
    main()
