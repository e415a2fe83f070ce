"""Where ``dpsc.tl.cluster`` loses to the noise, and two levers that did not help.

Three questions, each on the block design (500-gene block, mean component dropped, cosine points;
what the rule of ``reads_all_genes`` picks at ε ≤ 8 on the labelled files), secret noise, labels
for scoring only:

- ``release``: the whole clustering with only one of its releases noisy (gene statistics, PCA
  second moment or k-means tables; the other releases exact), beside all three noisy;
- ``block``: the block size (250, 500, 1000 genes);
- ``shares``: the ε shares of (gene selection, PCA, k-means): ``S0`` = (0.2, 0.48, 0.32) as
  shipped, ``S1`` = (0.15, 0.6, 0.25), ``S2`` = (0.1, 0.7, 0.2), ``S3`` = (0.2, 0.6, 0.2).

Rows with an exact release are diagnostics, not guarantees.

    python benchmarks/diagnostics/cluster_costs.py --data ../shared/data --question release \\
        --datasets paul15 pbmc bladder_allgenes bladder pancreas --epsilons 8 1 --runs 5 \\
        --out benchmarks/results/cluster_costs.jsonl
    python benchmarks/diagnostics/cluster_costs.py --data ../shared/data --question block \\
        --datasets paul15 pbmc --epsilons 1 4 8 --runs 5 --out benchmarks/results/cluster_costs.jsonl
    python benchmarks/diagnostics/cluster_costs.py --data ../shared/data --question shares \\
        --datasets paul15 pbmc --epsilons 1 4 8 --runs 6 --out benchmarks/results/cluster_costs.jsonl
    python benchmarks/diagnostics/cluster_costs.py --report benchmarks/results/cluster_costs.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/diagnostics/
from cluster_design import append_fit, read_rows  # noqa: E402

RELEASES = {"all": ("genes", "pca", "kmeans"), "genes": ("genes",), "pca": ("pca",), "kmeans": ("kmeans",)}
BLOCKS = {"250": 250, "500": 500, "1000": 1000}
SHARES = {"S0": (0.2, 0.48, 0.32), "S1": (0.15, 0.6, 0.25), "S2": (0.1, 0.7, 0.2), "S3": (0.2, 0.6, 0.2)}


def use_variant(question: str, variant: str) -> None:
    """Patch the clustering of this process: block design, then the variant's change."""
    from dpsc.privacy import _clustering
    from dpsc.tl import _cluster

    original_plan = use_variant.__dict__.setdefault("plan", _clustering.plan_clustering)
    _clustering.reads_all_genes = lambda S, sigma: False
    _clustering.GENE_BLOCK = BLOCKS[variant] if question == "block" else BLOCKS["500"]
    genes, pca, kmeans = SHARES[variant] if question == "shares" else SHARES["S0"]
    _clustering.SHARES.update(genes=genes, pca=pca, kmeans=kmeans)
    noisy = RELEASES[variant] if question == "release" else RELEASES["all"]

    def plan(*args, **kwargs):
        made = original_plan(*args, **kwargs)
        sigmas = {name: (sigma if name in noisy else 0.0) for name, sigma in made.sigmas.items()}
        return dataclasses.replace(made, sigmas=sigmas)

    _cluster.plan_clustering = plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--question", choices=["release", "block", "shares"])
    parser.add_argument("--datasets", nargs="+", default=["paul15", "pbmc"])
    parser.add_argument("--epsilons", nargs="+", type=float, default=[8.0, 1.0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    from cluster_benchmark import load

    variants = {"release": RELEASES, "block": BLOCKS, "shares": SHARES}[args.question]
    for name in args.datasets:
        adata = load(args.data, name)
        for eps in args.epsilons:
            for variant in variants:
                use_variant(args.question, variant)
                for run in range(args.runs):
                    fields = {"question": args.question, "variant": variant, "dataset": name, "epsilon": eps}
                    append_fit(adata, eps, run, args.out, fields)


def report(path: Path) -> str:
    """One table per question: mean ± sd (ddof 0) ARI per data set, ε and variant."""
    rows = read_rows(path)
    out = []
    for question, group in rows.groupby("question", sort=False):
        table = group.groupby(["dataset", "epsilon", "variant"], sort=False)["ari"].agg(
            lambda a: f"{a.mean():.3f} ± {a.std(ddof=0):.3f}"
        )
        wide = table.unstack("variant")
        out += [f"**{question}** ({group['run'].nunique()} runs)", "", wide.to_markdown(), ""]
    return "\n".join(out)


if __name__ == "__main__":
    main()
