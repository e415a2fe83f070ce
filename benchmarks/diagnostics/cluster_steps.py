"""Which release of ``dpsc.tl.cluster`` loses at a given ε, and how many genes its PCA should read.

Per data set, ε and run (secret noise, k = the number of labelled types, labels for scoring only):

- ``private``: the whole plan, as ``dpsc.tl.cluster`` runs it;
- ``exact k-means``: the plan's noisy gene selection, cell sum and residual PCA, then a
  non-private k-means (scikit-learn, 10 starts) of the same unit-norm k-means points — the ceiling
  the DP k-means works toward;
- ``exact PCA``: gene selection, cell sum and residual PCA without noise, then the DP k-means
  at the plan's σ — what the k-means release alone costs.

Both ablations read the cells without noise: a diagnostic, never a release. ``--genes G`` fixes
the number of genes the PCA reads (selected privately when the file has more; default: the
plan's rule, :func:`dpsc.methods._clustering.genes_for`); ``--shares`` changes the ε shares.

    python benchmarks/diagnostics/cluster_steps.py --data ../shared/data \\
        --out benchmarks/results/cluster_steps.jsonl --epsilons 1 4
    python benchmarks/diagnostics/cluster_steps.py --report benchmarks/results/cluster_steps.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import adjusted_rand_score

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
DATASETS = ["pbmc", "paul15", "bladder", "bladder_allgenes", "pancreas"]
VARIANTS = ("private", "exact k-means", "exact PCA")


def noisy_except(matrix, noise, exact_kinds: set[str]):
    """``release_sum`` that adds the plan's noise to every release but those of ``exact_kinds``."""
    from dpsc.methods import _clustering

    noisy = _clustering.central_release_sum(matrix, noise, prefix="diagnostic")

    def release(request):
        if request.kind in exact_kinds:
            return _clustering.contribution(request, matrix)
        return noisy(request)

    return release


def labels(adata, epsilon: float, run: int, variant: str, n_genes: int | None = None) -> np.ndarray:
    """One variant's cluster labels (module docstring); ``n_genes``: a fixed number of genes."""
    from sklearn.cluster import KMeans

    from dpsc.methods import _clustering
    from dpsc.privacy import NoiseSource

    matrix = adata.X
    k = adata.obs["label"].nunique()
    plan = _clustering.plan_clustering(
        epsilon, 1e-5, n_vars=adata.n_vars, n_clusters=k, n_obs=adata.n_obs, n_genes=n_genes, random_state=run
    )
    exact = {"genes", "sum", "pca"} if variant == "exact PCA" else set()
    result = _clustering.run_clustering(plan, noisy_except(matrix, NoiseSource(None), exact))
    if variant != "exact k-means":
        return result.labels(matrix)
    points = _clustering.cell_points(matrix, result.genes, result.loadings)
    return KMeans(k, n_init=10, random_state=run).fit_predict(points)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--datasets", nargs="+", default=DATASETS)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--epsilons", nargs="+", type=float, default=[1.0, 4.0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--shares", default="", help="e.g. pca=0.5,kmeans=0.2: ε shares to try")
    parser.add_argument("--genes", type=int, help="a fixed number of genes (default: the plan's rule)")
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    from cluster_benchmark import load

    from dpsc.methods import _clustering

    shares = {k: float(v) for k, v in (item.split("=") for item in args.shares.split(",") if item)}
    _clustering.SHARES.update(shares)
    for name in args.datasets:
        adata = load(args.data, name)
        for eps in args.epsilons:
            for variant in args.variants:
                for run in range(args.runs):
                    found = labels(adata, eps, run, variant, args.genes and min(args.genes, adata.n_vars))
                    ari = adjusted_rand_score(adata.obs["label"], found)
                    row = {"dataset": name, "epsilon": eps, "variant": variant, "run": run, "ari": ari}
                    row["shares"] = dict(_clustering.SHARES)
                    row["genes"] = args.genes or "rule"
                    print(json.dumps(row), flush=True)
                    with args.out.open("a") as handle:
                        handle.write(json.dumps(row) + "\n")


def report(path: Path) -> str:
    """Mean ± sd (ddof 0) ARI per data set and variant (rows) and ε (columns)."""
    rows = pd.DataFrame([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    shares = rows["shares"].map(
        lambda s: "" if s["pca"] == 0.38 else f", PCA/k-means {s['pca']}/{s['kmeans']}"
    )
    rows["variant"] = rows["variant"] + " (" + rows["genes"].astype(str) + " genes" + shares + ")"
    table = rows.groupby(["dataset", "variant", "epsilon"], sort=False)["ari"].agg(
        lambda a: f"{a.mean():.3f} ± {a.std(ddof=0):.3f}"
    )
    wide = table.unstack("epsilon").fillna("–")
    wide.columns = [f"ε = {e:g}" for e in wide.columns]
    return f"{rows['run'].nunique()} runs per cell\n\n" + wide.reset_index().to_markdown(index=False)


if __name__ == "__main__":
    main()
