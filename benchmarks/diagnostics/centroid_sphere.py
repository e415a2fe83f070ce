"""Why `tl.cluster`'s labels use fewer clusters than its released counts say, and two tried fixes.

The cells' k-means points lie on the unit sphere, but the DP k-means centroids are noisy means:
shrunk toward the origin where the noisy count is high, pushed outward where it is low. A
centroid off the sphere is nearest to no cell, so the labels use fewer clusters than
``clusters_in_use`` (from the released counts) reports. Variants, seeded noise (the same draws for
every variant), ARI / NMI against the labels and the clusters the labels use:

- ``plane``: `tl.cluster` as shipped (euclidean means);
- ``sphere``: every noisy mean projected onto the unit sphere during the Lloyd rounds and the
  reduction (spherical k-means, ``sphere_radius=1``);
- ``final``: only the final centroids projected onto the unit sphere (labels by direction).

    OMP_NUM_THREADS=2 python benchmarks/diagnostics/centroid_sphere.py --data ../shared/data \
        --out benchmarks/results/centroid_sphere.jsonl
    python benchmarks/diagnostics/centroid_sphere.py --report benchmarks/results/centroid_sphere.jsonl \
        > benchmarks/results/centroid_sphere.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cluster_benchmark import load
from markers_benchmark import FILES

VARIANTS = ("plane", "sphere", "final")
EPSILONS = (8.0, 4.0, 2.0, 1.0)


def run(data: Path, names: list[str], out: Path, runs: int = 3) -> None:
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    import dpsc
    from dpsc.privacy import _clustering, _kmeans

    warnings.filterwarnings("ignore")
    shipped, plan = _kmeans.dp_kmeans_centroids, dict(_clustering.KMEANS_PLAN)
    mode = {"final": False}

    def final_on_sphere(*args, **kwargs):
        centroids, in_use = shipped(*args, **kwargs)
        if mode["final"]:
            centroids = centroids / np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)
        return centroids, in_use

    _kmeans.dp_kmeans_centroids = final_on_sphere
    with out.open("w") as sink:
        for name in names:
            adata = load(data, name)
            truth = adata.obs["label"].to_numpy()
            k = len(set(truth))
            for epsilon in EPSILONS:
                for variant in VARIANTS:
                    _clustering.KMEANS_PLAN.clear()
                    _clustering.KMEANS_PLAN.update(
                        plan, **({"sphere_radius": 1.0} if variant == "sphere" else {})
                    )
                    mode["final"] = variant == "final"
                    for run_index in range(runs):
                        cells = adata.copy()
                        dpsc.tl.cluster(cells, k, epsilon=epsilon, noise_seed=20 + run_index)
                        labels = cells.obs["dp_kmeans"].to_numpy()
                        row = {
                            "dataset": name,
                            "epsilon": epsilon,
                            "variant": variant,
                            "run": run_index,
                            "ari": float(adjusted_rand_score(truth, labels)),
                            "nmi": float(normalized_mutual_info_score(truth, labels)),
                            "clusters_used": len(set(labels)),
                            "n_clusters": k,
                        }
                        sink.write(json.dumps(row) + "\n")
    _clustering.KMEANS_PLAN.clear()
    _clustering.KMEANS_PLAN.update(plan)
    _kmeans.dp_kmeans_centroids = shipped


def report(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    cells = defaultdict(list)
    for row in rows:
        cells[(row["dataset"], row["epsilon"], row["variant"])].append(row)
    lines = [
        "# DP k-means centroids off the unit sphere: two tried fixes (probe)",
        "",
        "```",
        "OMP_NUM_THREADS=2 python benchmarks/diagnostics/centroid_sphere.py --data ../shared/data \\",
        "    --out benchmarks/results/centroid_sphere.jsonl",
        "```",
        "",
        "ARI / NMI (mean of 3 seeded runs, the same noise for each variant) and the clusters the labels",
        "use (each run). `plane`: as shipped; `sphere`: spherical k-means; `final`: the final centroids",
        "projected onto the unit sphere (the script's docstring).",
        "",
        "| file | k | ε | " + " | ".join(VARIANTS) + " |",
        "|" + "---|" * (len(VARIANTS) + 3),
    ]
    for name in dict.fromkeys(row["dataset"] for row in rows):
        for epsilon in EPSILONS:
            parts = []
            for variant in VARIANTS:
                group = cells[(name, epsilon, variant)]
                ari = statistics.mean(r["ari"] for r in group)
                nmi = statistics.mean(r["nmi"] for r in group)
                used = ", ".join(str(r["clusters_used"]) for r in group)
                parts.append(f"{ari:.3f} / {nmi:.3f} ({used})")
            k = cells[(name, epsilon, VARIANTS[0])][0]["n_clusters"]
            lines.append(f"| {name} | {k} | {epsilon:g} | " + " | ".join(parts) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--datasets", nargs="*", default=list(FILES))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if args.report:
        print(report(args.report), end="")
    else:
        run(args.data, args.datasets, args.out)


if __name__ == "__main__":
    main()
