"""Marker genes of the private clusters, ``tl.cluster(markers=True)`` with and without a reference.

On the reference / private pairs of ``reference_pairs.py``, ``dpsc.tl.cluster(markers=True)`` at
ε = 8 and 2 (secret noise, ``--runs`` runs), with ``reference=`` (the markers measured from the
reference's mean, no centre release: all of ε goes to the k-means and the marker tables) and
without one. Each run is scored against scanpy's non-private t-test on the same private cells
grouped by the clusters that run released (``markers_benchmark.compare``: each cluster's top-10
and top-50 overlap), and by its ARI against the labels. Clusters of fewer than 2 cells (which
scanpy refuses) are left out of the marker score. No constant is chosen here.

    OMP_NUM_THREADS=1 python benchmarks/reference_cluster_markers.py --data ../shared/data \
        --out benchmarks/results/reference_cluster_markers.jsonl
    python benchmarks/reference_cluster_markers.py \
        --report benchmarks/results/reference_cluster_markers.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from markers_benchmark import compare
from markers_benchmark import reference as scanpy_markers
from reference_pairs import pairs
from sklearn.metrics import adjusted_rand_score

EPSILONS = (8.0, 2.0)
VARIANTS = ("no reference", "reference")


def run_pair(name: str, reference, private, runs: int, out) -> None:
    """Append one row per (variant, ε, run) of this pair to ``out``."""
    import dpsc

    k = private.obs["label"].nunique()
    for variant in VARIANTS:
        given = {"reference": reference} if variant == "reference" else {}
        for epsilon in EPSILONS:
            for run in range(runs):
                cells = private.copy()
                start = time.perf_counter()
                dpsc.tl.cluster(cells, k, epsilon=epsilon, markers=True, **given)
                seconds = time.perf_counter() - start
                counts = cells.obs["dp_cluster"].value_counts()
                kept = cells[cells.obs["dp_cluster"].isin(counts.index[counts >= 2])].copy()
                kept.obs["dp_cluster"] = kept.obs["dp_cluster"].cat.remove_unused_categories()
                scores = compare(_table(cells.uns["dp_cluster_markers"]), scanpy_markers(kept, "dp_cluster"))
                row = {
                    "pair": name,
                    "variant": variant,
                    "epsilon": epsilon,
                    "run": run,
                    "seconds": seconds,
                    "ari": float(adjusted_rand_score(cells.obs["label"], cells.obs["dp_cluster"])),
                    "top10": float(np.mean([s["top10"] for s in scores])),
                    "top50": float(np.mean([s["top50"] for s in scores])),
                }
                out.write(json.dumps(row) + "\n")
                out.flush()


def _table(markers) -> dict:
    """The names and scores of dpsc's marker table (scanpy's record arrays), per cluster."""
    groups = markers["names"].dtype.names
    return {
        "names": {g: list(markers["names"][g]) for g in groups},
        "scores": {g: list(markers["scores"][g]) for g in groups},
    }


def report(path: Path) -> str:
    """Markdown: mean top-10 / top-50 overlap and ARI per pair, variant and ε."""
    rows = pd.read_json(path, lines=True)
    lines = [
        "# Marker genes of the private clusters, with and without a public reference",
        "",
        "`tl.cluster(markers=True)` at each ε, mean of the runs: each released cluster's top-10 / top-50",
        "overlap with scanpy's non-private t-test on the same cells and clusters, and the ARI of the",
        "clusters against the labels. With `reference=` the markers are measured from the reference's",
        "mean (no centre release). Command: module docstring of",
        "`benchmarks/reference_cluster_markers.py`.",
        "",
    ]
    for epsilon in sorted(rows["epsilon"].unique(), reverse=True):
        part = rows[rows["epsilon"] == epsilon]
        table = part.groupby(["pair", "variant"])[["top10", "top50", "ari"]].mean().unstack("variant")
        header = " | ".join(f"{v}: top-10 / top-50 (ARI)" for v in VARIANTS)
        lines += [f"## ε = {epsilon:g}", "", f"| pair | {header} |", "|---" * (len(VARIANTS) + 1) + "|"]
        for pair in table.index:
            cells = [_cell(table.loc[pair], v) for v in VARIANTS]
            lines.append(f"| {pair} | " + " | ".join(cells) + " |")
        means = table.mean()
        lines += ["| mean over pairs | " + " | ".join(f"**{_cell(means, v)}**" for v in VARIANTS) + " |", ""]
    return "\n".join(lines)


def _cell(values: pd.Series, variant: str) -> str:
    top10, top50, ari = (values[(score, variant)] for score in ("top10", "top50", "ari"))
    return f"{top10:.2f} / {top50:.2f} ({ari:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/reference_cluster_markers.jsonl")
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None, help="pair names to run")
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args()
    if args.report is not None:
        print(report(args.report))
        return
    warnings.filterwarnings("ignore")
    with open(args.out, "a") as out:
        for name, reference, private in pairs(args.data):
            if args.only and name not in args.only:
                continue
            run_pair(name, reference, private, args.runs, out)
            print(name, "done", flush=True)


if __name__ == "__main__":
    main()
