"""Private marker genes against scanpy's non-private t-test on the same groups.

For each labelled count file and two groupings (the true labels; ``tl.cluster``'s clusters at
ε = 8), ``dpsc.tl.rank_genes_groups`` at each ε (secret noise, ``--runs`` runs) is compared with
``sc.tl.rank_genes_groups(method="t-test")`` on log1p(CP10k) of the same cells and groups: the
overlap of each group's top 10 and top 50 genes, the Spearman correlation of the scores over all
genes, and the time of the call. Groups below 2 % of the cells are reported separately; clusters
of fewer than 2 cells (which scanpy's t-test refuses) are left out of both.

    OMP_NUM_THREADS=2 python benchmarks/markers_benchmark.py --data ../shared/data --runs 5 \
        --out benchmarks/results/markers.jsonl.gz
    python benchmarks/markers_benchmark.py --report benchmarks/results/markers.jsonl.gz

``--scale N`` instead times one call on N simulated cells (``dpsc.datasets.simulate``, 2,000
genes, groups = the simulated cell types) at ε = 8 and prints a JSON row (wall time, the call's
peak RSS):

    OMP_NUM_THREADS=2 python benchmarks/markers_benchmark.py --scale 1000000 \
        >> benchmarks/results/markers_scale.jsonl

``--federated N`` instead runs the clustering with its markers (``markers=True``) centrally and
over N simulated sites (IID, secure aggregation, Flower's simulation engine; independent secret
noise), and scores each run's marker table against scanpy's t-test on that run's own clusters:

    OMP_NUM_THREADS=2 python benchmarks/markers_benchmark.py --data ../shared/data --federated 4 \
        --epsilons 8 2 --runs 2 --out benchmarks/results/markers_federated.jsonl
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import pandas as pd
from cluster_benchmark import FILES, load, per_file_parser, write_per_file
from scipy import stats

FILES["cite_cbmc"] = "cite_cbmc_top2000.h5"  # the six labelled count files
SMALL = 0.02  # groups below this share of the cells are reported apart


def reference(adata, groupby: str) -> dict[str, pd.Series]:
    """scanpy's t-test scores of every gene, per group (non-private)."""
    import scanpy as sc

    ref = adata.copy()
    sc.pp.normalize_total(ref, target_sum=1e4)
    sc.pp.log1p(ref)
    sc.tl.rank_genes_groups(ref, groupby, method="t-test", n_genes=adata.n_vars)
    result = ref.uns["rank_genes_groups"]
    return {g: pd.Series(result["scores"][g], index=result["names"][g]) for g in result["names"].dtype.names}


def compare(ours: dict, ref: dict[str, pd.Series]) -> list[dict]:
    rows = []
    for group, truth in ref.items():
        names = list(ours["names"][group])
        scores = pd.Series(ours["scores"][group], index=names)
        rho = stats.spearmanr(truth.values, scores.reindex(truth.index).values).statistic
        rows.append(
            {
                "group": group,
                "top10": len(set(names[:10]) & set(truth.index[:10])) / 10,
                "top50": len(set(names[:50]) & set(truth.index[:50])) / 50,
                "spearman": float(rho),
            }
        )
    return rows


def run(data: Path, name: str, epsilons: list[float], runs: int, commit: str) -> list[dict]:
    import dpsc

    adata = load(data, name)
    k = adata.obs["label"].nunique()
    adata.obs["labels"] = adata.obs["label"].astype("category")
    dpsc.tl.cluster(adata, k, epsilon=8.0, noise_seed=0)  # the clusters (seeded: the same groups each run)
    rows = []
    for grouping in ("labels", "dp_cluster"):
        counts = adata.obs[grouping].value_counts()
        cells = adata[adata.obs[grouping].isin(counts.index[counts >= 2])].copy()  # scanpy needs 2 a group
        cells.obs[grouping] = cells.obs[grouping].cat.remove_unused_categories()
        sizes = cells.obs[grouping].value_counts() / cells.n_obs
        ref = reference(cells, grouping)
        for epsilon in epsilons:
            for r in range(runs):
                target = cells.copy()
                start = time.perf_counter()
                dpsc.tl.rank_genes_groups(target, grouping, epsilon=epsilon, n_genes=None)
                seconds = time.perf_counter() - start
                for row in compare(target.uns["rank_genes_groups"], ref):
                    small = bool(sizes.get(row["group"], 0.0) < SMALL)
                    rows.append(
                        {
                            "dataset": name,
                            "grouping": grouping,
                            "epsilon": epsilon,
                            "run": r,
                            "small_group": small,
                            "seconds": seconds,
                            "source": commit,
                            **row,
                        }
                    )
    return rows


def run_federated(data: Path, name: str, epsilons: list[float], runs: int, commit: str, n_sites: int):
    """Rows of the clustering's own markers, central and over ``n_sites`` sites (module docstring)."""
    import dpsc

    adata = load(data, name)
    k = adata.obs["label"].nunique()
    rows = []
    for epsilon in epsilons:
        for r in range(runs):
            for where in ("central", "federated"):
                cells = adata.copy()
                start = time.perf_counter()
                if where == "central":
                    dpsc.tl.cluster(cells, k, epsilon=epsilon, markers=True)
                else:
                    dpsc.pp.partition(cells, n_sites, random_state=r)
                    dpsc.tl.cluster_federated(cells, "site", k, epsilon=epsilon, markers=True)
                seconds = time.perf_counter() - start
                counts = cells.obs["dp_cluster"].value_counts()
                kept = cells[cells.obs["dp_cluster"].isin(counts.index[counts >= 2])].copy()
                kept.obs["dp_cluster"] = kept.obs["dp_cluster"].cat.remove_unused_categories()
                ref = reference(kept, "dp_cluster")
                ours = cells.uns["dp_cluster_markers"]
                sizes = kept.obs["dp_cluster"].value_counts() / kept.n_obs
                for row in compare(ours, ref):
                    rows.append(
                        {
                            "dataset": name,
                            "where": where,
                            "sites": n_sites if where == "federated" else 1,
                            "epsilon": epsilon,
                            "run": r,
                            "small_group": bool(sizes.get(row["group"], 0.0) < SMALL),
                            "seconds": seconds,
                            "source": commit,
                            **row,
                        }
                    )
    return rows


FEDERATED_INTRO = (
    "The clustering's own markers (`markers=True`: the marker release takes a quarter share of",
    "the ε, so its own ε is below the table's), central and federated (`--federated 4`: 4 IID",
    "sites, secure aggregation, independent secret noise, 2 runs; each run's markers against",
    "scanpy on that run's own clusters, groups of at least 2 %):",
)
SCALE_INTRO = (
    "At scale (`--scale`, simulated cells, groups = the simulated types, ε = 8, 2 CPU threads,",
    "one run):",
)


def scale_report(path: Path) -> str:
    """The ``--scale`` rows as a table."""
    lines = ["| cells × genes | groups | tables | wall (s) | call peak RSS (GB) |", "|---|---|---|---|---|"]
    for row in pd.read_json(path, lines=True).itertuples():
        size = f"{row.cells:,} × {row.genes:,}"
        focused = getattr(row, "focused", False)
        tables = "two (focused)" if pd.notna(focused) and bool(focused) else "one"
        lines.append(f"| {size} | {row.groups} | {tables} | {row.wall_s:.0f} | {row.call_peak_rss_gb:.2f} |")
    return "\n".join(lines) + "\n"


def federated_report(path: Path) -> str:
    """The central and federated markers side by side (groups of at least 2 %)."""
    table = pd.read_json(path, lines=True)
    table = table[~table.small_group]
    lines = [
        "| file | ε | top-10 central | top-10 federated | top-50 central | top-50 federated |",
        "|---|---|---|---|---|---|",
    ]
    for (name, eps), part in table.groupby(["dataset", "epsilon"], sort=False):
        mean = part.groupby("where")[["top10", "top50"]].mean()
        cells = [mean.loc[w, m] for m in ("top10", "top50") for w in ("central", "federated")]
        lines.append(f"| {name} | {eps:g} | " + " | ".join(f"{v:.2f}" for v in cells) + " |")
    return "\n".join(lines) + "\n"


def scale(n_cells: int) -> dict:
    """Time ``tl.rank_genes_groups`` on ``n_cells`` simulated cells (module docstring)."""
    from scale import _peak_rss_since_reset_gb, _reset_peak_rss

    import dpsc

    adata = dpsc.datasets.simulate(n_cells)
    _reset_peak_rss()
    start = time.perf_counter()
    dpsc.tl.rank_genes_groups(adata, "cell_type", epsilon=8.0)
    return {
        "cells": n_cells,
        "genes": adata.n_vars,
        "groups": int(adata.obs["cell_type"].nunique()),
        "epsilon": 8.0,
        "focused": True,  # the focused second table (rows without this key ran with one table)
        "wall_s": time.perf_counter() - start,
        "call_peak_rss_gb": _peak_rss_since_reset_gb(),
    }


def report(path: Path) -> str:
    table = pd.read_json(path, lines=True)
    runs = table.run.nunique()
    lines = [
        "# Private marker genes (`tl.rank_genes_groups`) against scanpy's t-test",
        "",
        "Overlap of each group's top 10 / top 50 genes with scanpy's non-private `rank_genes_groups`",
        f"(t-test, log1p(CP10k)) on the same cells and groups, mean over groups and {runs} runs with secret",
        "noise; Spearman correlation of the scores over all genes; groups below 2 % of the cells in their",
        "own column (n: how many). Groups: the true labels, and `tl.cluster`'s clusters at ε = 8 (the same",
        "clusters in every run; clusters of fewer than 2 cells left out of both). Six labelled count files,",
        "2 CPU threads, one process:",
        "",
        "```",
        "OMP_NUM_THREADS=2 python benchmarks/markers_benchmark.py --data ../shared/data \\",
        f"    --datasets pbmc bladder bladder_allgenes paul15 pancreas --runs {runs} \\",
        "    --out benchmarks/results/markers.jsonl.gz",
        "OMP_NUM_THREADS=2 python benchmarks/markers_benchmark.py --data ../shared/data \\",
        f"    --datasets cite_cbmc --runs {runs} --append --out benchmarks/results/markers.jsonl.gz",
        "python benchmarks/markers_benchmark.py --report benchmarks/results/markers.jsonl.gz",
        "```",
        "",
        "| file | groups | ε | top-10 | top-50 | Spearman | small groups: top-10 (n) | s per call |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (name, grouping, eps), part in table.groupby(["dataset", "grouping", "epsilon"], sort=False):
        main, small = part[~part.small_group], part[part.small_group]
        small_text = f"{small.top10.mean():.2f} ({small.group.nunique()})" if len(small) else "–"
        lines.append(
            f"| {name} | {grouping} | {eps:g} | {main.top10.mean():.2f} | {main.top50.mean():.2f} | "
            f"{main.spearman.mean():.2f} | {small_text} | {part.seconds.median():.2f} |"
        )
    lines += [
        "",
        "Mean over files (groups of at least 2 %):",
        "",
        "| groups | ε | top-10 | top-50 |",
        "|---|---|---|---|",
    ]
    main = table[~table.small_group]
    for (grouping, eps), part in main.groupby(["grouping", "epsilon"]):
        per_file = part.groupby("dataset")[["top10", "top50"]].mean()
        lines.append(f"| {grouping} | {eps:g} | {per_file.top10.mean():.2f} | {per_file.top50.mean():.2f} |")
    appendices = {
        "markers_federated.jsonl": (FEDERATED_INTRO, federated_report),
        "markers_scale.jsonl": (SCALE_INTRO, scale_report),
    }
    for name, (intro, table_of) in appendices.items():
        extra = path.with_name(name)
        if extra.exists():
            lines += ["", *intro, "", table_of(extra).rstrip("\n")]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = per_file_parser(__doc__, "benchmarks/results/markers.jsonl.gz")
    parser.add_argument("--scale", type=int, default=None, help="Time one call on this many simulated cells.")
    parser.add_argument("--federated", type=int, default=None, help="Central and over this many sites.")
    args = parser.parse_args()
    if args.report:
        print(report(args.report), end="")
        return
    warnings.filterwarnings("ignore")
    if args.scale:
        print(json.dumps(scale(args.scale)))
        return
    if args.federated:
        sites = args.federated
        write_per_file(args, lambda *a: run_federated(*a, n_sites=sites))
        return
    write_per_file(args, run)


if __name__ == "__main__":
    main()
