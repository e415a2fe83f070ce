"""The one-call private clustering on a simulated atlas: wall time and memory of ``dpsc.tl.cluster``.

Cells come from ``dpsc.datasets.simulate`` (negative-binomial model fitted on the embedded
PBMC 4k; synthetic, 2,000 genes, 8 types). One process simulates the atlas, runs a tiny
untimed warm-up clustering, then for each ε clusters the atlas with ``dpsc.tl.cluster`` (ε = 0
means ``epsilon=None``: the same design without noise, the non-private reference for the time
ratio). Before each call the kernel's peak-RSS mark is reset (``/proc/self/clear_refs``), so
``call_peak_rss_gb`` is that call's own peak including the cells it holds; ``process_peak_rss_gb``
is the whole process's (simulation included).

    OMP_NUM_THREADS=2 python benchmarks/cluster_scale.py --cells 1000000 --epsilons 8 0 \
        --out benchmarks/results/cluster_scale.jsonl
    python benchmarks/cluster_scale.py --report benchmarks/results/cluster_scale.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings

import pandas as pd
from scale import _peak_rss_gb, _peak_rss_since_reset_gb, _reset_peak_rss


def run(n_cells: int, epsilons: list[float], out: str) -> None:
    """Simulate ``n_cells`` cells and cluster them once per ε; one JSON row per call."""
    from sklearn.metrics import adjusted_rand_score

    import dpsc

    warm = dpsc.datasets.pbmc4k()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dpsc.tl.cluster(warm, n_clusters=8, epsilon=8)  # untimed: first-call costs
    start = time.perf_counter()
    adata = dpsc.datasets.simulate(n_cells, random_state=0, n_jobs=2)
    simulate_s = time.perf_counter() - start
    n_types = adata.obs["cell_type"].nunique()
    delta = min(1e-5, 0.1 / n_cells)
    for eps in epsilons:
        _reset_peak_rss()
        start = time.perf_counter()
        dpsc.tl.cluster(adata, n_clusters=n_types, epsilon=None if eps == 0 else eps, delta=delta)
        wall = time.perf_counter() - start
        row = {
            "cells": n_cells,
            "genes": adata.n_vars,
            "epsilon": None if eps == 0 else eps,
            "delta": delta,
            "wall_s": wall,
            "simulate_s": simulate_s,
            "ari": adjusted_rand_score(adata.obs["cell_type"], adata.obs["dp_cluster"]),
            "clusters_used": int(adata.obs["dp_cluster"].nunique()),
            "spent_epsilon": dpsc.privacy.get_record(adata, "dp_cluster")["epsilon"],
            "call_peak_rss_gb": _peak_rss_since_reset_gb(),
            "process_peak_rss_gb": _peak_rss_gb(),
            "cpu": platform.machine(),
            "threads": int(os.environ.get("OMP_NUM_THREADS", 2)),
        }
        with open(out, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


def report(path: str) -> str:
    """Markdown table: one row per call; time ratio against the ε = none row of the same size."""
    df = pd.read_json(path, lines=True)
    lines = [
        "# The one-call private clustering at atlas scale",
        "",
        "`dpsc.tl.cluster` on cells simulated by `dpsc.datasets.simulate` (synthetic; PBMC 4k "
        "atlas model, 2,000 genes, 8 types; no gene selection at 2,000 genes). ε = none is the same "
        "design without noise, in the same process; the DP / non-private column divides by it. "
        "Call peak RSS is the call's own (the kernel's peak mark is reset before it) and counts the "
        "cells held in memory; process peak includes the simulation. One run per row: a single run's ARI "
        "depends on its noise and its k-means path, so two rows' ARIs are not a trend.",
        "",
        f"Command: `OMP_NUM_THREADS=2 python benchmarks/cluster_scale.py --cells … --epsilons 8 0 "
        f"--out {path}`.",
        "",
        "| cells | ε | wall (s) | DP / non-private time | ARI | clusters used | call peak RSS (GB) | "
        "process peak RSS (GB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cells, group in df.groupby("cells"):
        base = group[group["epsilon"].isna()]["wall_s"].mean()
        for _, r in group.iterrows():
            eps = "none" if pd.isna(r["epsilon"]) else f"{r['epsilon']:g}"
            ratio = "–" if pd.isna(base) else f"{r['wall_s'] / base:.2f}"
            lines.append(
                f"| {int(cells):,} | {eps} | {r['wall_s']:.1f} | {ratio} | {r['ari']:.3f} | "
                f"{int(r['clusters_used'])} | {r['call_peak_rss_gb']:.2f} | {r['process_peak_rss_gb']:.2f} |"
            )
    return "\n".join(lines) + f"\n\nRan on: {df['cpu'].iloc[0]}, {int(df['threads'].iloc[0])} threads.\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=1_000_000)
    parser.add_argument("--epsilons", nargs="+", type=float, default=[8, 0], help="0 = epsilon=None")
    parser.add_argument("--out", default="benchmarks/results/cluster_scale.jsonl")
    parser.add_argument("--report")
    args = parser.parse_args()
    if args.report:
        print(report(args.report), end="")
        return
    run(args.cells, args.epsilons, args.out)


if __name__ == "__main__":
    main()
