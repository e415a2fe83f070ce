"""How many cells does private clustering need? DP-DCAN and the DP pipeline on subsamples.

For each data set, size n and seed: a random subsample of n cells (seeded), then a default
DP-DCAN fit (``dpsc.tl.fit``, ``n_clusters`` = number of labelled types) and the DP pipeline of
``benchmarks/dp_pipeline.py`` (``pp.pca`` + ``tl.kmeans``), both at the same total ε. The final
results are scored against the labels (ARI) and by the number of clusters used. The rule behind
the small-data warning of ``dpsc.tl.fit`` is read from these rows (``results/small_data.md``).

Usage (from the repo root)::

    python benchmarks/diagnostics/small_data.py --data ../shared/data --datasets pbmc bladder \\
        --sizes 250 500 1000 2000 --seeds 0 1 --epsilon 8 --out benchmarks/results/small_data.jsonl
    python benchmarks/diagnostics/small_data.py --report benchmarks/results/small_data.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # benchmarks/
import dp_pipeline
from dp_pipeline import fit_pipeline, noise_seed
from dpdcan_benchmark import load


def one(
    dataset: str, data: Path, n: int, seed: int, epsilon: float, methods=("dpdcan", "pipeline")
) -> list[dict]:
    """The private methods on one subsample of ``n`` cells: ``"dpdcan"`` (default fit, encoder
    scope), ``"full"`` (default fit, ``scope="full"``) and ``"pipeline"``."""
    import scanpy as sc
    from sklearn.metrics import adjusted_rand_score

    import dpsc

    full = load(dataset, data)
    cells = np.sort(np.random.default_rng(seed).choice(full.n_obs, size=min(n, full.n_obs), replace=False))
    adata = full[cells].copy()
    sc.pp.filter_genes(adata, min_counts=1)  # as the benchmarks' loader does (not covered by ε)
    k = adata.obs["label"].nunique()
    rows = []
    for method, scope in (("dpdcan", "encoder"), ("full", "full")):
        if method not in methods:
            continue
        start = time.perf_counter()
        fitted = adata.copy()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dpsc.tl.fit(
                fitted,
                epsilon=epsilon,
                n_clusters=k,
                scope=scope,
                random_state=seed,
                noise_seed=noise_seed(seed),
                progress_bar=False,
            )
        name = "DP-DCAN (default)" if scope == "encoder" else "DP-DCAN scope=full (default)"
        record = dpsc.privacy.get_record(fitted, "X_dpdcan")
        plan = {"noise_multiplier": record["noise_multiplier"], "sample_rate": record["sample_rate"]}
        rows.append((name, fitted.obs["dp_cluster"], time.perf_counter() - start, plan))
    if "pipeline" in methods:
        start = time.perf_counter()
        piped = adata.copy()
        fit_pipeline(piped, epsilon, seed)
        rows.append(("DP pipeline", piped.obs["dp_cluster"], time.perf_counter() - start, {}))
    truth = adata.obs["label"].astype(str)
    return [
        {
            "dataset": dataset,
            "n_obs": adata.n_obs,
            "seed": seed,
            "epsilon": epsilon,
            "method": method,
            "ari": adjusted_rand_score(truth, pred.astype(str)),
            "clusters_used": int(pred.nunique()),
            "k": k,
            "wall_s": wall,
            "noise": "seeded" if dp_pipeline.SEEDED_NOISE["on"] else "secret",
            **plan,
        }
        for method, pred, wall, plan in rows
    ]


def report(path: Path) -> str:
    import pandas as pd

    df = pd.read_json(path, lines=True)
    out = [
        "| data set | ε | method | cells | ARI mean ± sd | per seed | clusters used (of k) |",
        "|---|---|---|---|---|---|---|",
    ]
    for (dataset, eps, method, n), g in df.groupby(["dataset", "epsilon", "method", "n_obs"], sort=True):
        out.append(
            f"| {dataset} | {eps:g} | {method} | {n} | {g.ari.mean():.3f} ± {g.ari.std(ddof=0):.3f} | "
            f"{', '.join(f'{a:.3f}' for a in g.ari)} | {', '.join(map(str, g.clusters_used))} "
            f"(of {g.k.iloc[0]}) |"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--datasets", nargs="+", default=["pbmc", "bladder"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[250, 500, 1000, 2000])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/small_data.jsonl")
    methods = ["dpdcan", "full", "pipeline"]
    parser.add_argument("--methods", nargs="+", default=["dpdcan", "pipeline"], choices=methods)
    parser.add_argument("--report")
    parser.add_argument("--noise", choices=["secret", "seeded"], default="secret")
    args = parser.parse_args()
    dp_pipeline.SEEDED_NOISE["on"] = args.noise == "seeded"
    if args.report:
        print(report(Path(args.report)))
        return
    import torch

    torch.set_num_threads(args.threads)
    for dataset in args.datasets:
        for n in args.sizes:
            for seed in args.seeds:
                rows = one(dataset, Path(args.data), n, seed, args.epsilon, args.methods)
                with open(args.out, "a") as fh:
                    fh.writelines(json.dumps(r) + "\n" for r in rows)
                print(dataset, n, seed, [(r["method"], round(r["ari"], 3), r["clusters_used"]) for r in rows])


if __name__ == "__main__":
    main()
