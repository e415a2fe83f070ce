"""How many starts the DP k-means' reduction of its 4k Lloyd centroids to k needs (no noise).

``dpsc.tl.cluster`` with ``epsilon=None`` (the design without noise; no guarantee, a diagnostic)
on every labelled count file, ``random_state`` = run, with ``KMEANS_PLAN["reduction_starts"]``
set to each ``--starts``. Per run: ARI (labels for scoring only), the reduction's weighted
objective (scikit-learn's ``inertia_`` of the weighted k-means of the Lloyd centroids) and the
cells' k-means objective (sum of squared distances of the unit-norm k-means points to their
nearest centroid). The reduction is post-processing: its starts cost time, not privacy.

    python benchmarks/diagnostics/reduction_starts.py --data ../shared/data \\
        --out benchmarks/results/reduction_starts.jsonl --runs 10 --starts 20 100 300 1000
    python benchmarks/diagnostics/reduction_starts.py --report benchmarks/results/reduction_starts.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import adjusted_rand_score

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
DATASETS = ["pbmc", "paul15", "bladder", "bladder_allgenes", "pancreas"]


class ReductionObjective:
    """Wrap scikit-learn's KMeans so that the last weighted fit's objective can be read afterwards."""

    def __init__(self) -> None:
        import sklearn.cluster

        self.last_inertia = float("nan")
        recorder = self
        base = sklearn.cluster.KMeans

        class Recorded(base):
            def fit(self, X, y=None, sample_weight=None):
                fitted = super().fit(X, y, sample_weight)
                recorder.last_inertia = float(self.inertia_)
                return fitted

        sklearn.cluster.KMeans = Recorded  # the DP k-means imports it at call time


def cell_objective(cells, key: str) -> float:
    """Sum over cells of the squared distance of its k-means point to the nearest released centroid."""
    from dpsc.methods._clustering import MEAN_WEIGHT

    weights = np.ones(cells.obsm["X_pca"].shape[1])
    weights[0] = MEAN_WEIGHT
    points = cells.obsm["X_pca"].astype(np.float64) * weights
    points /= np.maximum(np.linalg.norm(points, axis=1, keepdims=True), 1e-12)
    centroids = np.asarray(cells.uns["dpsc"][key]["centroids"], dtype=np.float64)
    return float(((points[:, None, :] - centroids[None]) ** 2).sum(-1).min(1).sum())


def run(data: Path, out: Path, runs: int, starts: list[int], datasets: list[str]) -> None:
    from cluster_benchmark import load

    import dpsc
    from dpsc.methods._clustering import KMEANS_PLAN

    objective = ReductionObjective()
    for name in datasets:
        adata = load(data, name)
        k = adata.obs["label"].nunique()
        for n_starts in starts:
            KMEANS_PLAN["reduction_starts"] = n_starts
            for seed in range(runs):
                cells = adata.copy()
                dpsc.tl.cluster(cells, k, epsilon=None, random_state=seed)
                row = {
                    "data": name,
                    "starts": n_starts,
                    "run": seed,
                    "ari": adjusted_rand_score(cells.obs["label"], cells.obs["dp_cluster"]),
                    "reduction_objective": objective.last_inertia,
                    "cell_objective": cell_objective(cells, "dp_cluster"),
                }
                with out.open("a") as handle:
                    handle.write(json.dumps(row) + "\n")
                print(row, flush=True)


def report(path: Path) -> str:
    rows = pd.read_json(path, lines=True)
    table = rows.groupby(["data", "starts"]).agg(
        ari=("ari", "mean"),
        sd=("ari", "std"),
        lowest=("ari", "min"),
        reduction=("reduction_objective", "mean"),
        cells=("cell_objective", "mean"),
        runs=("run", "count"),
    )
    lines = [
        "| data | reduction starts | ARI | lowest run | reduction objective | cell objective | runs |",
        "|---|---|---|---|---|---|---|",
    ]
    for (name, n_starts), r in table.iterrows():
        lines.append(
            f"| {name} | {n_starts} | {r.ari:.3f} ± {r.sd:.3f} | {r.lowest:.3f} | {r.reduction:.4f} "
            f"| {r.cells:.1f} | {int(r.runs)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--starts", type=int, nargs="+", default=[20, 100, 300, 1000])
    parser.add_argument("--datasets", nargs="+", default=DATASETS)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    run(args.data, args.out, args.runs, args.starts, args.datasets)


if __name__ == "__main__":
    main()
