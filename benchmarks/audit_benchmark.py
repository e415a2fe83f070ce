"""Membership-inference audit of DP-DCAN on PBMC 4k: non-private vs ε = 8 vs ε = 1.

Usage (from the repo root)::

    python benchmarks/audit_benchmark.py --out benchmarks/results/audit.jsonl --seeds 0
    python benchmarks/audit_benchmark.py --report benchmarks/results/audit.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def run(
    out: Path,
    seeds: list[int],
    epsilons: list[str],
    threads: int,
    features: str,
    cluster_private_lr: float | None,
) -> None:
    import torch

    import dpsc
    from dpsc.optim import DEFAULT_PRIVATE_LRS

    torch.set_num_threads(threads)
    start_and_target = json.dumps(_start_and_target(), sort_keys=True)
    for seed in seeds:
        for eps_text in epsilons:
            eps = None if eps_text == "none" else float(eps_text)
            adata = dpsc.datasets.pbmc4k()
            start = time.perf_counter()
            table = dpsc.tl.audit(
                adata,
                epsilon=eps,
                attack="both",
                n_shadow=1,
                random_state=seed,
                features=features,
                progress_bar=False,
                **({"plan_kwargs": {"cluster_private_lr": cluster_private_lr}} if cluster_private_lr else {}),
            )
            wall = time.perf_counter() - start
            with out.open("a") as fh:
                for row in table.to_dict("records"):
                    row.update(
                        seed=seed,
                        target_epsilon=eps,
                        wall_s=wall,
                        features=features,
                        cluster_private_lr=cluster_private_lr or DEFAULT_PRIVATE_LRS["sgd"]["dpdcan_cluster"],
                        start_and_target=start_and_target,
                    )
                    fh.write(json.dumps(row) + "\n")
            print(f"seed {seed} eps {eps_text}: done in {wall:.0f} s", file=sys.stderr, flush=True)


def _start_and_target() -> dict:
    """The k-means start and DEC target options a default fit uses (recorded with each row)."""
    from dpdcan_benchmark import train_defaults

    from dpsc.model import DEFAULT_KMEANS_OPTIONS

    defaults = train_defaults()
    names = ("n_sketch_steps", "n_lloyd_rounds", "steps_per_round", "target_frequency")
    return {**{name: defaults[name] for name in names}, **DEFAULT_KMEANS_OPTIONS}


def report(path: Path) -> str:
    import pandas as pd

    from dpsc.optim import DEFAULT_PRIVATE_LRS

    df = pd.DataFrame([json.loads(x) for x in path.read_text().splitlines() if x.strip()])
    df["model"] = df.target_epsilon.map(lambda e: "non-private" if pd.isna(e) else f"ε = {e:g}")
    # rows without these fields ran with dpsc 0.1.0: cluster-stage DP learning rate 0.1, the
    # plain k-means start and the uniform DEC target
    df["cluster_private_lr"] = df.get("cluster_private_lr", pd.Series(index=df.index)).fillna(0.1)
    df["start_and_target"] = df.get("start_and_target", pd.Series(index=df.index)).fillna("")
    current = json.dumps(_start_and_target(), sort_keys=True)
    cols = ["auc", "accuracy", "tpr_at_fpr_0.01", "tpr_at_fpr_0.1", "epsilon_lower_bound"]
    out = [
        "# Membership-inference audit (PBMC 4k, DP-DCAN, scope='encoder')",
        "",
        "Cells split 2:1:2:1 (target train/test, shadow train/test), 1 shadow model, default fit "
        "settings (50 + 40 epochs), δ = 1e-5. `encoder` features are what a receiver of the shared "
        "model can compute; `encoder+decoder` adds the decoder's per-cell reconstruction loss (the "
        "decoder is not shared under scope='encoder'). Accuracy is balanced (chance = 0.5). The ε "
        "lower bound uses 95 % Clopper–Pearson bounds at a threshold chosen on the shadow model. "
        "Noise: secret (the operating system's source) for the current defaults; the dpsc 0.1.0 rows "
        "drew their DP noise from torch's generator seeded with the fit's seed. The audits ran one at "
        "a time on one thread beside another benchmark: the wall times are indicative.",
    ]
    groups = df.groupby(["start_and_target", "cluster_private_lr"], sort=False)
    for (settings, lr), group in sorted(groups, key=lambda item: item[0][0] == current, reverse=True):
        seeds = sorted(int(s) for s in group.seed.unique())
        if settings == current:
            title = "Current defaults"
        elif settings:
            title = f"k-means start and DEC target {settings}"
        else:
            title = "Plain k-means start, uniform DEC target"
        default_lr = settings == current and lr == DEFAULT_PRIVATE_LRS["sgd"]["dpdcan_cluster"]
        lr_flag = "" if default_lr else f" --cluster-private-lr {lr:g}"
        agg = group.groupby(["model", "features", "attack"])[cols].mean().reset_index()
        out += [
            "",
            f"## {title}, cluster-stage DP learning rate {lr:g}",
            "",
            f"Command: `python benchmarks/audit_benchmark.py --seeds {' '.join(map(str, seeds))}{lr_flag}`"
            + ("" if settings == current else " with dpsc 0.1.0")
            + f"; mean over seeds {seeds}.",
            "",
            "| model | features | attack | AUC | accuracy | TPR@FPR≤1% | TPR@FPR≤10% "
            "| empirical ε (lower b.) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in agg.itertuples(index=False):
            out.append(
                f"| {r.model} | {r.features} | {r.attack} | {r.auc:.3f} | {r.accuracy:.3f} | {r._5:.3f} | "
                f"{r._6:.3f} | {r.epsilon_lower_bound:.2f} |"
            )
        walls = group.groupby("model").wall_s.mean().round(0).to_dict()
        out += ["", f"Wall time per audit (2 fits + features), seconds: {walls}."]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/audit.jsonl"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--epsilons", nargs="+", default=["none", "8", "1"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--features", default="encoder+decoder")
    parser.add_argument(
        "--cluster-private-lr",
        type=float,
        default=None,
        help="cluster-stage learning rate of the DP parameters (default: the package default)",
    )
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
    else:
        run(args.out, args.seeds, args.epsilons, args.threads, args.features, args.cluster_private_lr)


if __name__ == "__main__":
    main()
