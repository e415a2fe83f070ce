"""Do the markers gain from shrinking each group's noisy variances toward their trend? Look, paired.

`dpsc.privacy._markers.shrunk_variances` moves each gene's noisy variance in a group toward the
mean of the variances of the genes with similar noisy means (``TREND_BINS`` bins), by its known
noise: post-processing, no ε. This ranks the same released table (one release per run) four ways,
without the shrinkage (the noisy variances clipped at 0, dpsc's ranking before it) and with 10,
20 (dpsc's) and 40 bins, and prints the top-10 overlap with scanpy's t-test per file, ε and
grouping (the true labels; `tl.cluster`'s clusters at ε = 8), groups of at least 2 %, 3 runs with
secret noise:

    OMP_NUM_THREADS=2 python benchmarks/diagnostics/markers_variances.py --data ../shared/data \
        --epsilons 8 2 --runs 3 --out benchmarks/results/markers_variances.jsonl
    python benchmarks/diagnostics/markers_variances.py --report benchmarks/results/markers_variances.jsonl \
        > benchmarks/results/markers_variances.md
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cluster_benchmark import load, per_file_main
from markers_benchmark import SMALL, compare, reference

#: name: TREND_BINS (None: no shrinkage)
VARIANTS = {"no shrinkage": None, "10 bins": 10, "20 bins (dpsc)": 20, "40 bins": 40}


def _rankings(statistics, names: list[str], genes: np.ndarray) -> dict[str, dict]:
    """The released statistics ranked by every variant, in the shape ``compare`` reads."""
    import dataclasses

    from dpsc.privacy import _markers

    shipped, out = _markers.TREND_BINS, {}
    for variant, bins in VARIANTS.items():
        stats = statistics if bins else dataclasses.replace(statistics, squares_noise_sd=None)
        _markers.TREND_BINS = bins or shipped
        result = _markers.rank_markers(stats)
        out[variant] = {
            "names": {g: genes[result.order[k]] for k, g in enumerate(names)},
            "scores": {g: result.scores[k][result.order[k]] for k, g in enumerate(names)},
        }
    _markers.TREND_BINS = shipped
    return out


def run(data: Path, name: str, epsilons: list[float], runs: int, commit: str) -> list[dict]:
    """Rows of one file: the top-10 overlap per grouping, ε, run and variant (one release per run)."""
    import dpsc
    from dpsc.privacy import _markers

    warnings.filterwarnings("ignore")
    adata = load(data, name)
    adata.obs["labels"] = adata.obs["label"].astype("category")
    dpsc.tl.cluster(adata, adata.obs["label"].nunique(), epsilon=8.0, noise_seed=0)
    captured, statistics_of = {}, _markers.group_statistics

    def capture(*args):
        captured["stats"] = statistics_of(*args)
        return captured["stats"]

    rows = []
    for grouping in ("labels", "dp_kmeans"):
        sizes = adata.obs[grouping].value_counts()
        cells = adata[adata.obs[grouping].isin(sizes.index[sizes >= 2])].copy()
        cells.obs[grouping] = cells.obs[grouping].cat.remove_unused_categories()
        shares = cells.obs[grouping].value_counts() / cells.n_obs
        ref = reference(cells, grouping)
        names = [str(c) for c in cells.obs[grouping].cat.categories]
        for epsilon in epsilons:
            for r in range(runs):
                _markers.group_statistics = capture
                dpsc.tl.rank_genes_groups(cells.copy(), grouping, epsilon=epsilon, n_genes=None)
                _markers.group_statistics = statistics_of
                for variant, ours in _rankings(captured["stats"], names, np.asarray(cells.var_names)).items():
                    kept = [row for row in compare(ours, ref) if shares.get(row["group"], 0.0) >= SMALL]
                    rows.append(
                        {
                            "dataset": name,
                            "grouping": grouping,
                            "epsilon": epsilon,
                            "run": r,
                            "variant": variant,
                            "top10": float(np.mean([row["top10"] for row in kept])),
                            "source": commit,
                        }
                    )
    return rows


def report(path: Path) -> str:
    table = pd.read_json(path, lines=True)
    cells = table.groupby(["grouping", "epsilon", "dataset", "variant"], sort=False).top10.mean()
    wide = cells.unstack("variant")[list(VARIANTS)]
    lines = [
        "# The markers' noisy variances, shrunk toward their trend or not (top-10 overlap with scanpy)",
        "",
        "```",
        "OMP_NUM_THREADS=2 python benchmarks/diagnostics/markers_variances.py --data ../shared/data \\",
        "    --epsilons 8 2 --runs 3 --out benchmarks/results/markers_variances.jsonl",
        "```",
        "",
        "The same released table of each run ranked four ways (`dpsc.privacy._markers.shrunk_variances`;",
        "no shrinkage: the noisy variances clipped at 0). Groups: the true labels and `tl.cluster`'s",
        "clusters at ε = 8, groups of at least 2 % of the cells, mean over 3 runs with secret noise.",
        "",
        "| groups | ε | file | " + " | ".join(VARIANTS) + " |",
        "|" + "---|" * (len(VARIANTS) + 3),
    ]
    for (grouping, epsilon, name), values in wide.iterrows():
        figures = " | ".join(f"{v:.3f}" for v in values)
        lines.append(f"| {grouping} | {epsilon:g} | {name} | {figures} |")
    means = wide.groupby(level=["grouping", "epsilon"]).mean()
    lines += ["", "Mean over the files:", "", "| groups | ε | " + " | ".join(VARIANTS) + " |"]
    lines.append("|" + "---|" * (len(VARIANTS) + 2))
    for (grouping, epsilon), values in means.iterrows():
        lines.append(f"| {grouping} | {epsilon:g} | " + " | ".join(f"{v:.3f}" for v in values) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    per_file_main(__doc__, "benchmarks/results/markers_variances.jsonl", report, run)


if __name__ == "__main__":
    main()
