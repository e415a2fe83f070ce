"""Does a last Lloyd round of the k reduced centroids help `tl.cluster`'s DP k-means?

The shipped DP k-means (``KMEANS_PLAN``) releases one sketch and two Lloyd tables of m = 4k
centroids, then reduces the m noisy centroids to k by a weighted k-means (post-processing). The
``refine`` variant adds one Lloyd release of the k reduced centroids (``refine_rounds=1`` of
:func:`dpsc.privacy.dp_kmeans_centroids`, one more release in the plan, so every k-means σ is
calibrated for four releases instead of three): each final centroid becomes the noisy mean of the
cells nearest to it. Seeded noise (the same seeds for both variants), ARI / NMI against the labels
and the clusters the labels use.

    OMP_NUM_THREADS=2 python benchmarks/diagnostics/kmeans_refine.py --data ../shared/data --runs 6 \
        --out benchmarks/results/kmeans_refine.jsonl
    python benchmarks/diagnostics/kmeans_refine.py --report benchmarks/results/kmeans_refine.jsonl \
        > benchmarks/results/kmeans_refine.md
"""

from __future__ import annotations

import json
import statistics
import sys
import warnings
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cluster_benchmark import FILES, load, per_file_main

FILES["cite_cbmc"] = "cite_cbmc_top2000.h5"  # the six labelled count files
VARIANTS = {"shipped": {}, "refine": {"n_lloyd_rounds": 3, "refine_rounds": 1}}


def run(data: Path, name: str, epsilons: list[float], runs: int, commit: str) -> list[dict]:
    """Rows of one file: ARI, NMI and clusters used of each variant, ε and seeded run."""
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    import dpsc
    from dpsc.privacy import _clustering

    warnings.filterwarnings("ignore")
    shipped = dict(_clustering.KMEANS_PLAN)
    adata = load(data, name)
    truth = adata.obs["label"].to_numpy()
    k = len(set(truth))
    rows = []
    try:
        for epsilon in epsilons:
            for variant, change in VARIANTS.items():
                _clustering.KMEANS_PLAN.update(shipped, **change)
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
                            "source": commit,
                        }
                    )
    finally:
        _clustering.KMEANS_PLAN.clear()
        _clustering.KMEANS_PLAN.update(shipped)
    return rows


def report(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    cells = defaultdict(list)
    for row in rows:
        cells[(row["dataset"], row["epsilon"], row["variant"])].append(row)
    files = list(dict.fromkeys(row["dataset"] for row in rows))
    epsilons = sorted({row["epsilon"] for row in rows}, reverse=True)
    runs = len(cells[(files[0], epsilons[0], "shipped")])
    lines = [
        "# A last Lloyd round of the k reduced centroids in `tl.cluster`'s DP k-means (probe)",
        "",
        "```",
        "OMP_NUM_THREADS=2 python benchmarks/diagnostics/kmeans_refine.py --data ../shared/data --runs 6 \\",
        "    --out benchmarks/results/kmeans_refine.jsonl",
        "```",
        "",
        f"ARI / NMI, mean of {runs} seeded runs (the same noise seeds for both variants), and the",
        "clusters the labels use (min–max). `shipped`: one sketch and two Lloyd releases of 4k centroids",
        "reduced to k; `refine`: the same, then one Lloyd release of the k reduced centroids (four",
        "k-means releases instead of three under the same ε). The script's docstring states both.",
        "",
        "| file | k | ε | shipped | refine |",
        "|---|---|---|---|---|",
    ]
    for name in files:
        for epsilon in epsilons:
            parts = []
            for variant in VARIANTS:
                group = cells[(name, epsilon, variant)]
                ari = statistics.mean(r["ari"] for r in group)
                nmi = statistics.mean(r["nmi"] for r in group)
                used = [r["clusters_used"] for r in group]
                parts.append(f"{ari:.3f} / {nmi:.3f} ({min(used)}–{max(used)})")
            k = cells[(name, epsilon, "shipped")][0]["n_clusters"]
            lines.append(f"| {name} | {k} | {epsilon:g} | " + " | ".join(parts) + " |")
    lines += ["", "Mean over the files (ARI / NMI):", "", "| ε | shipped | refine |", "|---|---|---|"]
    for epsilon in epsilons:
        parts = []
        for variant in VARIANTS:
            ari = statistics.mean(
                statistics.mean(r["ari"] for r in cells[(n, epsilon, variant)]) for n in files
            )
            nmi = statistics.mean(
                statistics.mean(r["nmi"] for r in cells[(n, epsilon, variant)]) for n in files
            )
            parts.append(f"{ari:.3f} / {nmi:.3f}")
        lines.append(f"| {epsilon:g} | " + " | ".join(parts) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    per_file_main(__doc__, "benchmarks/results/kmeans_refine.jsonl", report, run)


if __name__ == "__main__":
    main()
