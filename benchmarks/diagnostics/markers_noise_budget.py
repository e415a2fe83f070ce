"""Where do the private markers lose against scanpy? Put the noise back one part at a time.

For each run, `dpsc.tl.rank_genes_groups` releases its table once; the exact table with the same
released centre and bounds is then computed and the noise of the release added back to one part
of it at a time (the expression sums, the squares or the counts: the noise of each part as
released), so every variant is post-processing of the same run. Variants, ranked by dpsc's
t-test and scored by the overlap of each group's top 10 genes with scanpy's t-test:

- ``exact, unclipped``: no centre, worst-case bounds (scanpy's own statistics: 1 by construction);
- ``exact, clipped``: the released centre and bounds (each cell scaled to them), no noise and no
  noise term: what the bounds alone cost;
- ``exact, noise terms``: the same ranked as if noisy (the known noise of the means under the
  t-test's root, the variances shrunk by their known noise): the noise-aware ranking applied to
  statistics without noise, which it penalises for noise they do not carry — an upper bound on
  what that ranking costs, not a ranking anyone would use on exact statistics;
- ``noisy sums`` / ``noisy squares`` / ``noisy counts``: one part's noise added back;
- ``released``: what dpsc returns.

Groups: the true labels and `tl.cluster`'s clusters at ε = 8, groups of at least 2 % of the cells,
2 runs with secret noise:

    OMP_NUM_THREADS=2 python benchmarks/diagnostics/markers_noise_budget.py --data ../shared/data \\
        --epsilons 8 2 --runs 2 --out benchmarks/results/markers_noise_budget.jsonl
    python benchmarks/diagnostics/markers_noise_budget.py \\
        --report benchmarks/results/markers_noise_budget.jsonl > benchmarks/results/markers_noise_budget.md
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cluster_benchmark import load, per_file_main
from markers_benchmark import SMALL, compare, reference

VARIANTS = (
    "exact, unclipped",
    "exact, clipped",
    "exact, noise terms",
    "noisy sums",
    "noisy squares",
    "noisy counts",
    "released",
)


def _variants(matrix, codes, released, table, release) -> dict:
    """The statistics of every variant (module docstring), from one release."""
    from dpsc.privacy import _markers

    statistics = _markers.group_statistics
    exact = _markers.group_table(matrix, codes, table).reshape(table.n_groups, table.width)
    noise = np.asarray(released).reshape(exact.shape) - exact
    G, W = table.n_genes, table.width

    def with_noise(*parts: slice):
        mask = np.zeros(W, dtype=bool)
        for part in parts:
            mask[part] = True
        return statistics((exact + noise * mask).ravel(), table, release)

    def quiet(stats):  # no noise term, no shrinkage: ranked as exact statistics
        return dataclasses.replace(stats, sum_noise_sd=0 * stats.sum_noise_sd, squares_noise_sd=None)

    plain = _markers.MarkerTable(table.n_groups, G, None)
    plain_sums = _markers.group_table(matrix, codes, plain)
    unclipped = statistics(plain_sums, plain, _markers.marker_release(plain, 0.0))
    return {
        "exact, unclipped": unclipped,
        "exact, clipped": quiet(with_noise()),
        "exact, noise terms": with_noise(),
        "noisy sums": with_noise(slice(0, G)),
        "noisy squares": with_noise(slice(G, 2 * G)),
        "noisy counts": with_noise(slice(W - 1, W)),
        "released": statistics(np.asarray(released), table, release),
    }


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
        captured["args"] = args
        return statistics_of(*args)

    rows = []
    for grouping in ("labels", "dp_kmeans"):
        sizes = adata.obs[grouping].value_counts()
        cells = adata[adata.obs[grouping].isin(sizes.index[sizes >= 2])].copy()
        cells.obs[grouping] = cells.obs[grouping].cat.remove_unused_categories()
        shares = cells.obs[grouping].value_counts() / cells.n_obs
        ref = reference(cells, grouping)
        names, genes = [str(c) for c in cells.obs[grouping].cat.categories], np.asarray(cells.var_names)
        codes = cells.obs[grouping].cat.codes.to_numpy().astype(np.int64)
        for epsilon in epsilons:
            for r in range(runs):
                _markers.group_statistics = capture
                dpsc.tl.rank_genes_groups(cells.copy(), grouping, epsilon=epsilon, n_genes=None)
                _markers.group_statistics = statistics_of
                for variant, stats in _variants(cells.X, codes, *captured["args"]).items():
                    result = _markers.rank_markers(stats)
                    ours = {
                        "names": {g: genes[result.order[k]] for k, g in enumerate(names)},
                        "scores": {g: result.scores[k][result.order[k]] for k, g in enumerate(names)},
                    }
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
        "# Where the private markers lose: the noise put back one part at a time (top-10 overlap)",
        "",
        "```",
        "OMP_NUM_THREADS=2 python benchmarks/diagnostics/markers_noise_budget.py --data ../shared/data \\",
        "    --epsilons 8 2 --runs 2 --out benchmarks/results/markers_noise_budget.jsonl",
        "```",
        "",
        "Each run's released table, its exact counterpart with the same released centre and bounds,",
        "and the release's noise added back to one part at a time (the script's docstring defines the",
        "variants); ranked by dpsc's t-test and scored by the overlap of each group's top 10 genes with",
        "scanpy's t-test. Groups: the true labels and `tl.cluster`'s clusters at ε = 8, groups of at least",
        "2 % of the cells, mean over 2 runs with secret noise.",
        "",
        "| groups | ε | file | " + " | ".join(VARIANTS) + " |",
        "|" + "---|" * (len(VARIANTS) + 3),
    ]
    for (grouping, epsilon, name), values in wide.iterrows():
        figures = " | ".join(f"{v:.2f}" for v in values)
        lines.append(f"| {grouping} | {epsilon:g} | {name} | {figures} |")
    means = wide.groupby(level=["grouping", "epsilon"]).mean()
    lines += ["", "Mean over the files:", "", "| groups | ε | " + " | ".join(VARIANTS) + " |"]
    lines.append("|" + "---|" * (len(VARIANTS) + 2))
    for (grouping, epsilon), values in means.iterrows():
        lines.append(f"| {grouping} | {epsilon:g} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    per_file_main(__doc__, "benchmarks/results/markers_noise_budget.jsonl", report, run)


if __name__ == "__main__":
    main()
