"""The two settings of ``dpsc.tl.cluster``'s residual PCA, and what each data set's cells look like.

Variants (secret noise, labels for scoring only):

- ``W1`` / ``W0.5`` / ``W0``: the weight of the mean direction's coordinate in the k-means points
  (``_clustering.MEAN_WEIGHT``; 0.5 ships), cell-sum share 0.1;
- ``S0.05``: the cell sum's ε share 0.05 instead of 0.1 (the residual PCA's share grows by the
  difference), weight 0.5.

``--geometry`` prints, per data set and without noise, the share of the unit-norm cells' squared
norm that lies along the mean direction (``‖z̄‖²``) and the quantiles of ``z_i·u``: what the
residual release and the weight are about (reads the cells: a diagnostic, not a release).

    python benchmarks/diagnostics/cluster_residual.py --data ../shared/data \\
        --out benchmarks/results/cluster_residual.jsonl --variants W1 W0.5 W0 --epsilons 1 4 8 inf
    python benchmarks/diagnostics/cluster_residual.py --data ../shared/data \\
        --out benchmarks/results/cluster_residual.jsonl --variants S0.05 --epsilons 1 4 8
    python benchmarks/diagnostics/cluster_residual.py --data ../shared/data --geometry
    python benchmarks/diagnostics/cluster_residual.py --report benchmarks/results/cluster_residual.jsonl
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
VARIANTS = {"W1": (1.0, 0.1), "W0.5": (0.5, 0.1), "W0": (0.0, 0.1), "S0.05": (0.5, 0.05)}


def use_variant(name: str) -> None:
    """Set the mean weight and the cell sum's share of this process's clustering."""
    from dpsc.methods import _clustering

    weight, share = VARIANTS[name]
    shipped = use_variant.__dict__.setdefault("shares", dict(_clustering.SHARES))
    _clustering.MEAN_WEIGHT = weight
    _clustering.SHARES.update(sum=share, pca=shipped["pca"] + shipped["sum"] - share)


def append_fit(adata, epsilon: float | None, run: int, out: Path, fields: dict) -> None:
    """Append one ``dpsc.tl.cluster`` call's ARI (k = the number of labelled types) to ``out``."""
    import dpsc

    cells = adata.copy()
    dpsc.tl.cluster(cells, adata.obs["label"].nunique(), epsilon=epsilon, random_state=run)
    row = {**fields, "run": run, "ari": adjusted_rand_score(adata.obs["label"], cells.obs["dp_cluster"])}
    with out.open("a") as handle:
        handle.write(json.dumps(row) + "\n")


def geometry(adata) -> dict:
    """``‖z̄‖²`` and the quantiles of ``z_i·u`` of the unit-norm cells on the genes the PCA reads."""
    from dpsc.methods import _pca

    X = adata.X
    if X.shape[1] > 2000:  # the 2000 genes of largest (exact) second moment, as the selection aims
        Z = _pca.unit_rows(X)
        second = np.asarray(Z.multiply(Z).sum(0) if hasattr(Z, "multiply") else (Z**2).sum(0)).ravel()
        X = X[:, np.sort(np.argsort(second)[::-1][:2000])]
    Z = _pca.unit_rows(X)
    mean = np.asarray(Z.mean(0)).ravel()
    along = np.asarray(Z @ (mean / np.linalg.norm(mean))).ravel()
    quantiles = np.quantile(along, [0.05, 0.5, 0.95])
    return {
        "mean_share": float(mean @ mean),
        **{f"q{q}": float(v) for q, v in zip((5, 50, 95), quantiles, strict=True)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--datasets", nargs="+", default=DATASETS)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--epsilons", nargs="+", default=["1", "4", "8", "inf"], help="'inf': no noise")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--geometry", action="store_true")
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    from cluster_benchmark import load

    for name in args.datasets:
        adata = load(args.data, name)
        if args.geometry:
            print(name, {k: round(v, 3) for k, v in geometry(adata).items()})
            continue
        for variant in args.variants:
            use_variant(variant)
            for eps in [None if e == "inf" else float(e) for e in args.epsilons]:
                for run in range(args.runs):
                    fields = {"dataset": name, "variant": variant, "epsilon": "inf" if eps is None else eps}
                    append_fit(adata, eps, run, args.out, fields)


def report(path: Path) -> str:
    """Mean ± sd (ddof 0) ARI per data set and variant (rows) and ε (columns)."""
    rows = pd.DataFrame([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    rows["epsilon"] = rows["epsilon"].astype(str)
    table = rows.groupby(["dataset", "variant", "epsilon"], sort=False)["ari"].agg(
        lambda a: f"{a.mean():.3f} ± {a.std(ddof=0):.3f}"
    )
    wide = table.unstack("epsilon").fillna("–")
    return f"{rows['run'].nunique()} runs per cell\n\n" + wide.to_markdown()


if __name__ == "__main__":
    main()
