"""Do the markers gain from shrinking each group's noisy variances toward their trend? Look, paired.

`dpsc.methods._markers.shrunk_variances` moves each gene's noisy variance in a group toward the
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

import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cluster_benchmark import per_file_main
from paired_markers import paired_rows, variant_tables

#: name: TREND_BINS (None: no shrinkage)
VARIANTS = {"no shrinkage": None, "10 bins": 10, "20 bins (dpsc)": 20, "40 bins": 40}


def _scores(released, table, release, cells, codes) -> dict[str, np.ndarray]:
    """The released statistics ranked by every variant (the same release)."""
    from dpsc.methods import _markers

    statistics, shipped, out = _markers.group_statistics(released, table, release), _markers.TREND_BINS, {}
    for variant, bins in VARIANTS.items():
        stats = statistics if bins else dataclasses.replace(statistics, squares_noise_sd=None)
        _markers.TREND_BINS = bins or shipped
        out[variant] = _markers.rank_markers(stats).scores
    _markers.TREND_BINS = shipped
    return out


def run(data: Path, name: str, epsilons: list[float], runs: int, commit: str) -> list[dict]:
    """Rows of one file: the top-10 overlap per grouping, ε, run and variant (one release per run)."""
    return paired_rows(data, name, epsilons, runs, commit, _scores)


def report(path: Path) -> str:
    lines = [
        "# The markers' noisy variances, shrunk toward their trend or not (top-10 overlap with scanpy)",
        "",
        "```",
        "OMP_NUM_THREADS=2 python benchmarks/diagnostics/markers_variances.py --data ../shared/data \\",
        "    --epsilons 8 2 --runs 3 --out benchmarks/results/markers_variances.jsonl",
        "```",
        "",
        "The same released table of each run ranked four ways (`dpsc.methods._markers.shrunk_variances`;",
        "no shrinkage: the noisy variances clipped at 0). Groups: the true labels and `tl.cluster`'s",
        "clusters at ε = 8, groups of at least 2 % of the cells, mean over 3 runs with secret noise.",
        "",
        *variant_tables(path, list(VARIANTS)),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    per_file_main(__doc__, "benchmarks/results/markers_variances.jsonl", report, run)


if __name__ == "__main__":
    main()
