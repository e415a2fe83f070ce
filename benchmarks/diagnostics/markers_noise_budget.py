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
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cluster_benchmark import per_file_main
from paired_markers import paired_rows, variant_tables

VARIANTS = (
    "exact, unclipped",
    "exact, clipped",
    "exact, noise terms",
    "noisy sums",
    "noisy squares",
    "noisy counts",
    "released",
)


def _variants(released, table, release, cells, codes) -> dict[str, np.ndarray]:
    """The scores of every variant (module docstring), from one release."""
    from dpsc.methods import _markers

    statistics = _markers.group_statistics
    exact = _markers.group_table(cells.X, codes, table).reshape(table.n_groups, table.width)
    noise = np.asarray(released).reshape(exact.shape) - exact
    G, W = table.n_genes, table.width

    def with_noise(*parts: slice):
        mask = np.zeros(W, dtype=bool)
        for part in parts:
            mask[part] = True
        projected = any(part.start == 0 for part in parts)  # the exact sums: no direction to drop
        return statistics((exact + noise * mask).ravel(), table, release, project=projected)

    def quiet(stats):  # no noise term, no shrinkage: ranked as exact statistics
        return dataclasses.replace(stats, sum_noise_sd=0 * stats.sum_noise_sd, squares_noise_sd=None)

    plain = _markers.MarkerTable(table.n_groups, G, None)
    plain_sums = _markers.group_table(cells.X, codes, plain)
    unclipped = statistics(plain_sums, plain, _markers.marker_release(plain, 0.0))
    variants = {
        "exact, unclipped": unclipped,
        "exact, clipped": quiet(with_noise()),
        "exact, noise terms": with_noise(),
        "noisy sums": with_noise(slice(0, G)),
        "noisy squares": with_noise(slice(G, 2 * G)),
        "noisy counts": with_noise(slice(W - 1, W)),
        "released": statistics(np.asarray(released), table, release),
    }
    return {variant: _markers.rank_markers(stats).scores for variant, stats in variants.items()}


def run(data: Path, name: str, epsilons: list[float], runs: int, commit: str) -> list[dict]:
    """Rows of one file: the top-10 overlap per grouping, ε, run and variant (one release per run)."""
    return paired_rows(data, name, epsilons, runs, commit, _variants)


def report(path: Path) -> str:
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
        *variant_tables(path, list(VARIANTS), digits=2),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    per_file_main(__doc__, "benchmarks/results/markers_noise_budget.jsonl", report, run)


if __name__ == "__main__":
    main()
