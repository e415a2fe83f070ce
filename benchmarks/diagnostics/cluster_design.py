"""Design variants of ``dpsc.tl.cluster``: the gene block, the mean component and the k-means metric.

Separates what the design costs (ε = ∞, ``epsilon=None``) from what the noise costs, for five
variants of the loadings and the points k-means reads (secret noise, 3 runs, labels for scoring):

- ``D0``: 500-gene block (largest noisy second moments), first component dropped, cosine points
  (the shipped design);
- ``D1``: all genes, first component kept, cosine points;
- ``D2``: 500-gene block, first component kept, cosine points;
- ``D3``: all genes, first component dropped, Euclidean points (the projections as they are);
- ``D4``: all genes, first component kept, Euclidean points;
- ``D5``: all genes, first component dropped, cosine points.

    python benchmarks/diagnostics/cluster_design.py --data ../shared/data \\
        --out benchmarks/results/cluster_design.jsonl --datasets pbmc paul15
    python benchmarks/diagnostics/cluster_design.py --report benchmarks/results/cluster_design.jsonl
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
VARIANTS = {
    "D0": (500, True, "cosine"),
    "D1": (10**9, False, "cosine"),
    "D2": (500, False, "cosine"),
    "D3": (10**9, True, "euclidean"),
    "D4": (10**9, False, "euclidean"),
    "D5": (10**9, True, "cosine"),
}


def use_variant(block: int, drop: bool, metric: str) -> None:
    """Patch the clustering's gene block, mean-component rule and k-means points (this process only)."""
    from dpsc.privacy import _clustering, _pca

    original_loadings = use_variant.__dict__.setdefault("loadings", _pca.loadings)
    original_points = use_variant.__dict__.setdefault("points", _clustering.cell_points)
    _clustering.GENE_BLOCK = block
    _clustering.reads_all_genes = lambda S, sigma: False  # the variant fixes the genes, not the rule
    _pca.loadings = lambda S, comps, genes, _drop: original_loadings(S, comps, genes, drop)
    if metric == "cosine":
        _clustering.cell_points = original_points
    else:
        _clustering.cell_points = lambda m, g, L: _pca.project(m, L, True, columns=g).astype(np.float64)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--datasets", nargs="+", default=["pbmc", "paul15"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--epsilons", nargs="+", default=["8", "4", "1", "inf"], help="'inf': no noise")
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    from cluster_benchmark import load

    for name in args.datasets:
        adata = load(args.data, name)
        for variant in args.variants:
            use_variant(*VARIANTS[variant])
            for eps in [None if e == "inf" else float(e) for e in args.epsilons]:
                for run in range(args.runs):
                    fields = {"dataset": name, "variant": variant, "epsilon": "inf" if eps is None else eps}
                    append_fit(adata, eps, run, args.out, fields)


def append_fit(adata, epsilon: float | None, run: int, out: Path, fields: dict) -> None:
    """Append one ``dpsc.tl.cluster`` call's ARI to ``out`` (a JSON line with ``fields`` and the run).

    The call runs on a copy of ``adata`` with k = its number of labelled types.
    """
    import dpsc

    cells = adata.copy()
    dpsc.tl.cluster(cells, adata.obs["label"].nunique(), epsilon=epsilon, random_state=run)
    row = {**fields, "run": run, "ari": adjusted_rand_score(adata.obs["label"], cells.obs["dp_kmeans"])}
    with out.open("a") as handle:
        handle.write(json.dumps(row) + "\n")


def read_rows(path: Path) -> pd.DataFrame:
    """Return the rows of a JSON lines results file."""
    return pd.DataFrame([json.loads(line) for line in path.read_text().splitlines() if line.strip()])


def report(path: Path) -> str:
    rows = read_rows(path)
    rows["epsilon"] = rows["epsilon"].astype(str)
    table = rows.groupby(["dataset", "variant", "epsilon"])["ari"].agg(["mean", "std"]).unstack("epsilon")
    columns = sorted(table["mean"].columns, key=float)
    lines = [
        "| data | variant | " + " | ".join(f"ε = {c}" for c in columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for (data, variant), r in table.iterrows():
        cells = [
            "–" if np.isnan(r[("mean", c)]) else f"{r[('mean', c)]:.3f} ± {np.nan_to_num(r[('std', c)]):.3f}"
            for c in columns
        ]
        lines.append(f"| {data} | {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
