"""The federated private clustering (``dpsc.tl.cluster_federated``) beside the central one.

Each row is one final run (secret noise, no label-based choice; labels only score it): a data set
split over K sites (IID, or non-IID with 2 cell types per site as in the FedSC paper), the
federated pipeline in ``secure`` mode (SecAgg+, threshold K: the central mechanism's noise) or
``plain`` mode (each site adds the full noise), and the central ``dpsc.tl.cluster`` on the same
cells at the same ε. Flower's simulation engine runs the sites on this machine.

    python benchmarks/federated_pipeline.py --data ../shared/data \\
        --out benchmarks/results/federated_pipeline_residual.jsonl \\
        --datasets pbmc paul --sites 4 --splits iid noniid --epsilons 8 --runs 3
    python benchmarks/federated_pipeline.py --report benchmarks/results/federated_pipeline_residual.jsonl

``--noise paired`` gives the federated and the central run of one row the same benchmark-only noise
seed (``10000 + run``; no guarantee holds against a known seed): the two then draw the same noise,
so their gap is what the federation itself changes (aggregation round-off), not the spread of
independent noise. Each paired row records the largest centroid difference and the share of cells
labelled differently.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from cluster_benchmark import score

warnings.filterwarnings("ignore")
DATASETS = {
    "pbmc": "pbmc_10x_4k_top2000.h5",
    "bladder": "mouse_bladder_top2000.h5",
    "paul": "paul15_bone_marrow_counts.h5ad",
    "pancreas": "pancreas_endocrinogenesis_counts.h5ad",
}
PAIRED_SEED = 10_000  # + run: the benchmark-only noise seed of a paired row


def load(data: Path, name: str):
    import anndata as ad

    import dpsc

    file = data / DATASETS[name]
    if file.suffix == ".h5ad":
        adata = ad.read_h5ad(file)
        adata.obs["label"] = adata.obs.pop("cell_type")
    else:
        adata = dpsc.datasets.read_h5(file)
    adata.obs["label"] = adata.obs["label"].astype(str)
    return adata


def run_one(adata, dataset, n_sites, split, mode, eps, run, noise="secret") -> list[dict]:
    import dpsc

    noise_seed = PAIRED_SEED + run if noise == "paired" else None
    cells = adata.copy()
    types = 2 if split == "noniid" else None
    n_types = cells.obs["label"].nunique()
    if types is not None and n_sites * types < n_types:
        types = -(-n_types // n_sites)
    dpsc.pp.partition(cells, n_sites, label_key="label", types_per_site=types, random_state=run)
    k = cells.obs["label"].nunique()
    common = {"dataset": dataset, "sites": n_sites, "split": split, "epsilon": eps, "run": run, "k": k}
    common["noise"] = noise
    rows = []
    start = time.perf_counter()
    fed = cells.copy()
    dpsc.tl.cluster_federated(fed, "site", k, epsilon=eps, mode=mode, random_state=run, noise_seed=noise_seed)
    record = fed.uns["dpsc"]["dp_cluster"]
    rows.append(
        {
            **common,
            "method": f"federated pipeline ({mode})",
            **score(fed.obs["label"], fed.obs["dp_cluster"]),
            "wall_s": time.perf_counter() - start,
            "bytes_per_site": int(sum(record["releases"]["bytes_per_site"])),
            "rounds": len(record["releases"]["bytes_per_site"]) + 2,
            "epsilon_spent": dpsc.privacy.spent(fed)[0],
        }
    )
    if mode == "secure":
        start = time.perf_counter()
        central = cells.copy()
        dpsc.tl.cluster(central, k, epsilon=eps, random_state=run, noise_seed=noise_seed)
        if noise == "paired":
            centroids = [np.asarray(a.uns["dpsc"]["dp_cluster"]["centroids"]) for a in (fed, central)]
            rows[0]["centroid_max_diff"] = float(np.abs(centroids[0] - centroids[1]).max())
            rows[0]["labels_differ"] = float((fed.obs["dp_cluster"] != central.obs["dp_cluster"]).mean())
        rows.append(
            {
                **common,
                "method": "central pipeline",
                **score(central.obs["label"], central.obs["dp_cluster"]),
                "wall_s": time.perf_counter() - start,
                "epsilon_spent": dpsc.privacy.spent(central)[0],
            }
        )
    return rows


def report(path: Path) -> str:
    rows = pd.DataFrame([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    rows["noise"] = rows.get("noise", pd.Series(index=rows.index, dtype=object)).fillna("secret")
    return "\n\n".join(_report_table(group, noise) for noise, group in rows.groupby("noise", sort=False))


def _report_table(rows: pd.DataFrame, noise: str) -> str:
    keys = ["dataset", "split", "sites", "epsilon", "method"]
    table = rows.groupby(keys).agg(
        ari=("ari", "mean"),
        ari_sd=("ari", "std"),
        nmi=("nmi", "mean"),
        clusters=("clusters_used", "mean"),
        wall_s=("wall_s", "mean"),
        mbytes=("bytes_per_site", lambda b: b.mean() / 1e6),
        runs=("run", "count"),
    )
    lines = [
        "## "
        + ("Paired noise (one benchmark seed per run for both)" if noise == "paired" else "Secret noise"),
        "",
        "| data | split | sites | ε | method | ARI | NMI | clusters used | wall s | MB per site | runs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (data, split, sites, eps, method), r in table.iterrows():
        mb = "" if np.isnan(r["mbytes"]) else f"{r['mbytes']:.1f}"
        lines.append(
            f"| {data} | {split} | {sites} | {eps:g} | {method} "
            f"| {r['ari']:.3f} ± {np.nan_to_num(r['ari_sd']):.3f} "
            f"| {r['nmi']:.3f} | {r['clusters']:.1f} | {r['wall_s']:.1f} | {mb} | {int(r['runs'])} |"
        )
    lines.append("")
    lines.append(_gap_summary(table))
    if noise == "paired":
        fed = rows[rows["method"] == "federated pipeline (secure)"]
        lines.append(
            f"Paired runs ({len(fed)}): largest centroid difference {fed['centroid_max_diff'].max():.2g}, "
            f"largest share of cells labelled differently {fed['labels_differ'].max():.4f}."
        )
    return "\n".join(lines)


def _gap_summary(table: pd.DataFrame) -> str:
    r"""Secure federated minus central mean ARI per configuration, beside the runs' own noise.

    Per configuration the gap's standard error is :math:`\sqrt{s_f^2/n_f + s_c^2/n_c}` (the runs'
    sd over their number); over :math:`N` configurations the mean gap's is
    :math:`\sqrt{\sum_c \mathrm{se}_c^2}/N` (independent noise in every run).
    """
    secure = table.xs("federated pipeline (secure)", level="method")
    central = table.xs("central pipeline", level="method")
    gap = (secure["ari"] - central["ari"]).dropna()
    se = np.sqrt(
        np.nan_to_num(secure["ari_sd"]) ** 2 / secure["runs"]
        + np.nan_to_num(central["ari_sd"]) ** 2 / central["runs"]
    ).reindex(gap.index)
    within = int((gap.abs() <= 2 * se).sum())
    pooled = float(np.sqrt((se**2).sum()) / len(gap))
    groups = "; ".join(
        f"by {name}: "
        + ", ".join(
            f"{key:g} {g.mean():+.3f} ({len(g)})" if name == "ε" else f"{key} {g.mean():+.3f} ({len(g)})"
            for key, g in gap.groupby(level=level)
        )
        for name, level in (
            ("number of sites", "sites"),
            ("split", "split"),
            ("data set", "dataset"),
            ("ε", "epsilon"),
        )
    )
    return (
        f"Secure federated minus central, mean ARI per configuration: mean {gap.mean():+.3f} "
        f"(95 % interval ± {1.96 * pooled:.3f}), largest |gap| {gap.abs().max():.3f} over {len(gap)} "
        f"configurations; {within} of {len(gap)} gaps within two standard errors of their runs' noise. "
        f"Mean gap (configurations) {groups}."
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument("--sites", nargs="+", type=int, default=[2, 4, 8])
    parser.add_argument("--splits", nargs="+", default=["iid", "noniid"])
    parser.add_argument("--modes", nargs="+", default=["secure"])
    parser.add_argument("--epsilons", nargs="+", type=float, default=[8.0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--noise", choices=["secret", "paired"], default="secret")
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    import torch

    torch.set_num_threads(2)
    for dataset in args.datasets:
        adata = load(args.data, dataset)
        for n_sites in args.sites:
            for split in args.splits:
                for eps in args.epsilons:
                    for mode in args.modes:
                        for run in range(args.runs):
                            rows = run_one(adata, dataset, n_sites, split, mode, eps, run, args.noise)
                            for row in rows:
                                row["machine"] = f"{platform.machine()}, 2 CPU threads"
                                with args.out.open("a") as out:
                                    out.write(json.dumps(row) + "\n")
                                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
