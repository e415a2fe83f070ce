"""Do the markers gain from keeping what of the released sums stands above the noise? Paired, by folds.

`dpsc.methods._markers.projected_sums` keeps the singular directions of the released groups × genes
expression sums above ``NOISE_EDGE`` times the edge of the noise's spectrum, s(√G + √K), and adds
back the residual's entries beyond each group's universal threshold (post-processing, no ε). This
ranks the same released table (one release per run) five ways: as released; the directions only;
the residual's entries beyond one threshold for the whole table, s√(2 ln KG); dpsc's; and dpsc's
with the edge scaled by 1.25. It prints the top-10 overlap with scanpy's t-test per file, ε and
grouping (the true labels; `tl.cluster`'s clusters at ε = 8), groups of at least 2 %, 3 runs with
secret noise; then leave one file out: each fold chooses the variant of the highest mean on the
other five files (both groupings, both ε) and is scored on its own file:

    OMP_NUM_THREADS=2 python benchmarks/diagnostics/markers_projection.py --data ../shared/data \
        --epsilons 8 2 --runs 3 --out benchmarks/results/markers_projection.jsonl
    python benchmarks/diagnostics/markers_projection.py --report benchmarks/results/markers_projection.jsonl \
        > benchmarks/results/markers_projection.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cluster_benchmark import per_file_main
from paired_markers import paired_rows, variant_tables

from dpsc.methods._markers import projected_sums as _SHIPPED


def _directions_only(sums: np.ndarray, noise_std: float):
    """The projection without its second step (no residual entry added back)."""
    _, projector = _SHIPPED(sums, noise_std)
    return projector @ np.asarray(sums, dtype=np.float64), projector


def _one_threshold(sums: np.ndarray, noise_std: float):
    """The residual's entries beyond one threshold for the whole table, s √(2 ln KG)."""
    sums = np.asarray(sums, dtype=np.float64)
    _, projector = _SHIPPED(sums, noise_std)
    projected = projector @ sums
    residual = sums - projected
    threshold = noise_std * np.sqrt(2.0 * np.log(sums.size))
    return projected + np.where(np.abs(residual) > threshold, residual, 0.0), projector


#: name: (NOISE_EDGE, the projection; None: the sums as released)
VARIANTS = {
    "as released": (1.0, None),
    "directions only": (1.0, _directions_only),
    "residual: one threshold": (1.0, _one_threshold),
    "residual: per group (dpsc)": (1.0, "shipped"),
    "edge × 1.25": (1.25, "shipped"),
}


def _scores(released, table, release, cells, codes) -> dict[str, np.ndarray]:
    """The released table ranked by every variant (the same release)."""
    from dpsc.methods import _markers

    edge, out = _markers.NOISE_EDGE, {}
    for variant, (scaled, projection) in VARIANTS.items():
        _markers.NOISE_EDGE = scaled
        _markers.projected_sums = _SHIPPED if projection in (None, "shipped") else projection
        stats = _markers.group_statistics(released, table, release, project=projection is not None)
        out[variant] = _markers.rank_markers(stats).scores
    _markers.NOISE_EDGE, _markers.projected_sums = edge, _SHIPPED
    return out


def run(data: Path, name: str, epsilons: list[float], runs: int, commit: str) -> list[dict]:
    """Rows of one file: the top-10 overlap per grouping, ε, run and variant (one release per run)."""
    return paired_rows(data, name, epsilons, runs, commit, _scores)


def folds(path: Path) -> list[str]:
    """Leave one file out: the variant each fold chooses on five files, and its figures on the sixth."""
    table = pd.read_json(path, lines=True)
    cells = table.groupby(["dataset", "variant"]).top10.mean().unstack("variant")
    lines = [
        "| held-out file | chosen on the other five | held out: chosen | held out: as released |",
        "|---|---|---|---|",
    ]
    for held_out in cells.index:
        chosen = cells.drop(index=held_out).mean().idxmax()
        row = cells.loc[held_out]
        lines.append(f"| {held_out} | {chosen} | {row[chosen]:.3f} | {row['as released']:.3f} |")
    return lines


def report(path: Path) -> str:
    lines = [
        "# The markers' sums projected on their directions above the noise, or not (top-10 overlap)",
        "",
        "```",
        "OMP_NUM_THREADS=2 python benchmarks/diagnostics/markers_projection.py --data ../shared/data \\",
        "    --epsilons 8 2 --runs 3 --out benchmarks/results/markers_projection.jsonl",
        "```",
        "",
        "The same released table of each run ranked five ways (`dpsc.methods._markers.projected_sums`:",
        "the singular directions of the groups × genes sums above the edge s(√G + √K) of the noise's",
        "spectrum, then the residual's entries beyond a universal threshold added back; the script's",
        "docstring names the variants). Groups: the true labels and `tl.cluster`'s clusters at ε = 8,",
        "groups of at least 2 % of the cells, mean over 3 runs with secret noise.",
        "",
        *variant_tables(path, list(VARIANTS)),
        "",
        "Leave one file out (each fold chooses on the mean over both groupings and both ε of the other",
        "five files):",
        "",
        *folds(path),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    per_file_main(__doc__, "benchmarks/results/markers_projection.jsonl", report, run)


if __name__ == "__main__":
    main()
