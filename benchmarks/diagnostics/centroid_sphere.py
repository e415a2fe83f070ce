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

import json
import statistics
import sys
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cluster_benchmark import FILES, load, per_file_main

FILES["cite_cbmc"] = "cite_cbmc_top2000.h5"  # the six labelled count files
VARIANTS = ("plane", "sphere", "final")


def run(data: Path, name: str, epsilons: list[float], runs: int, commit: str) -> list[dict]:
    """Rows of one file: ARI, NMI and clusters used of each variant, ε and seeded run."""
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

    adata = load(data, name)
    truth = adata.obs["label"].to_numpy()
    k = len(set(truth))
    rows = []
    _kmeans.dp_kmeans_centroids = final_on_sphere
    try:
        for epsilon in epsilons:
            for variant in VARIANTS:
                _clustering.KMEANS_PLAN.update(plan, sphere_radius=1.0 if variant == "sphere" else None)
                mode["final"] = variant == "final"
                for run_index in range(runs):
                    cells = adata.copy()
                    dpsc.tl.cluster(cells, k, epsilon=epsilon, noise_seed=20 + run_index)
                    labels = cells.obs["dp_kmeans"].to_numpy()
                    rows.append(
                        {
                            "dataset": name,
                            "epsilon": epsilon,
                            "variant": variant,
                            "run": run_index,
                            "ari": float(adjusted_rand_score(truth, labels)),
                            "nmi": float(normalized_mutual_info_score(truth, labels)),
                            "clusters_used": len(set(labels)),
                            "n_clusters": k,
                        }
                    )
    finally:
        _clustering.KMEANS_PLAN.clear()
        _clustering.KMEANS_PLAN.update(plan)
        _kmeans.dp_kmeans_centroids = shipped
    return rows


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
        for epsilon in sorted({row["epsilon"] for row in rows}, reverse=True):
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
    per_file_main(__doc__, "benchmarks/results/centroid_sphere.jsonl", report, run)


if __name__ == "__main__":
    main()
