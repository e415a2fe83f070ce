"""FedSC benchmark on Flower: PBMC 4k (2 types per site) and mouse bladder (4 types per site), K = 4.

Every method runs in Flower's simulation engine (one SuperNode per site). ``centralized`` trains
the same BYOL network on all cells for rounds × local epochs; ``PCA+KMeans`` is scanpy's
log1p(CP10k) → 32 PCs → k-means. ``<method> + gene z-score`` runs ``fit_federated(...,
scale_genes=True)`` (genes z-scored with statistics pooled over the sites; the default of
``fit_federated`` without ``epsilon``), the plain method names run it with ``scale_genes=False``;
``centralized + gene z-score`` z-scores with the statistics of all cells. ARI/NMI against the
labels; silhouette of the embedding under the predicted clusters.

Usage (from the repo root)::

    python benchmarks/federated_benchmark.py --data ../shared/data --seeds 0 1 2 \
        --out benchmarks/results/federated.jsonl
    python benchmarks/federated_benchmark.py --report benchmarks/results/federated.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

DATASETS = {"pbmc": ("pbmc_10x_4k_top2000.h5", 2), "bladder": ("mouse_bladder_top2000.h5", 4)}
METHODS = ["fedsc", "fedbyol", "fedsimsiam", "fedsimclr", "fedmoco", "fedmocov2", "centralized", "PCA+KMeans"]
DP_METHODS = {  # client-level DP: (method, ε per site, update rule on the noisy gradient)
    "fedsc DP ε=8 sgd": ("fedsc", 8.0, "sgd"),
    "fedsc DP ε=8 dpsignadam": ("fedsc", 8.0, "dpsignadam"),
    "fedsc DP ε=2 dpsignadam": ("fedsc", 2.0, "dpsignadam"),
}
SCALED_METHODS = {  # scale_genes=True: sites z-score genes with statistics pooled over the sites
    "fedsc + gene z-score": "fedsc",
    "fedbyol + gene z-score": "fedbyol",
    "fedsimsiam + gene z-score": "fedsimsiam",
    "fedsimclr + gene z-score": "fedsimclr",
    "fedmoco + gene z-score": "fedmoco",
    "fedmocov2 + gene z-score": "fedmocov2",
}
CENTRALIZED_SCALED = "centralized + gene z-score"  # z-scored with the statistics of all cells
PAPER = {  # FedSC paper, Table 1: ARI / NMI / silhouette (×100)
    ("pbmc", "fedsc"): "62.57 / 68.35 / 54.70",
    ("bladder", "fedsc"): "34.35 / 57.84 / 29.58",
    ("pbmc", "fedbyol"): "59.70 / 69.27 / 53.12",
    ("bladder", "fedbyol"): "29.24 / 56.21 / 27.56",
}


def run(args: argparse.Namespace) -> None:
    import scanpy as sc
    import torch
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score, silhouette_score

    import dpsc
    from dpsc.federated import SSLConfig
    from dpsc.federated._scaling import apply_scaling, pooled_scaling, site_sums
    from dpsc.federated._ssl import SSLNet, embed, local_train
    from dpsc.tl._federated import represent

    for name in args.datasets:
        file, types_per_site = DATASETS[name]
        base = dpsc.datasets.read_h5(Path(args.data) / file)
        sc.pp.filter_genes(base, min_counts=1)
        k = base.obs["label"].nunique()
        truth = base.obs["label"].astype(str).to_numpy()
        for seed in args.seeds:
            for method in args.methods:
                adata = base.copy()
                start = time.perf_counter()
                row = {
                    "dataset": name,
                    "method": method,
                    "seed": seed,
                    "rounds": args.rounds,
                    "local_epochs": args.local_epochs,
                }
                if method == "PCA+KMeans":
                    sc.pp.normalize_total(adata, target_sum=1e4)
                    sc.pp.log1p(adata)
                    sc.pp.pca(adata, n_comps=32, random_state=seed)
                    Z = adata.obsm["X_pca"]
                    pred = KMeans(k, n_init=10, random_state=seed).fit_predict(Z)
                elif method in ("centralized", CENTRALIZED_SCALED):
                    X = represent(adata.X, "zinb")
                    if method == CENTRALIZED_SCALED:
                        X = apply_scaling(X, *pooled_scaling([site_sums(X)]))
                    torch.manual_seed(seed)
                    net = SSLNet(X.shape[1], SSLConfig(method="fedbyol"))
                    local_train(net, X, args.rounds * args.local_epochs, random_state=seed)
                    Z = embed(net, X)
                    pred = KMeans(k, n_init=10, random_state=seed).fit_predict(Z)
                else:
                    dpsc.pp.partition(
                        adata, 4, label_key="label", types_per_site=types_per_site, random_state=seed
                    )
                    plain = SCALED_METHODS.get(method, method)
                    base_method, eps, opt = DP_METHODS.get(method, (plain, None, "sgd"))
                    dpsc.tl.fit_federated(
                        adata,
                        method=base_method,
                        n_clusters=k,
                        rounds=args.rounds,
                        local_epochs=args.local_epochs,
                        random_state=seed,
                        noise_seed=seed,  # repeatable tables: no guarantee against this seed
                        epsilon=eps,
                        optimizer=opt,
                        scale_genes=method in SCALED_METHODS,
                    )
                    rec = adata.uns["dpsc"]["X_fedsc"]  # the record and the run's figures (in place)
                    if eps is not None:
                        row["epsilon_spent_max_site"] = rec["privacy"]["epsilon"]
                    Z = adata.obsm["X_fedsc"]
                    pred = adata.obs["dp_cluster"].astype(int).to_numpy()
                    loss = list(rec["loss"])  # empty under DP: the sites send no loss
                    row.update(
                        seconds_per_round=rec["seconds_per_round"], final_loss=loss[-1] if loss else None
                    )
                row.update(
                    wall_s=time.perf_counter() - start,
                    ari=float(adjusted_rand_score(truth, pred)),
                    nmi=float(normalized_mutual_info_score(truth, pred)),
                    silhouette=float(silhouette_score(Z, pred)) if len(set(pred)) > 1 else float("nan"),
                )
                with open(args.out, "a") as fh:
                    fh.write(json.dumps(row) + "\n")
                print(
                    f"{name} seed={seed} {method:12s} ARI={row['ari']:.3f} NMI={row['nmi']:.3f} "
                    f"t={row['wall_s']:.0f}s",
                    file=sys.stderr,
                    flush=True,
                )


def report(path: Path) -> str:
    import pandas as pd

    df = pd.DataFrame([json.loads(x) for x in path.read_text().splitlines() if x.strip()])
    out = [
        "# FedSC benchmark (Flower simulation, K = 4 sites)",
        "",
        "Command: `python benchmarks/federated_benchmark.py --data ../shared/data --seeds "
        f"{' '.join(str(int(s)) for s in sorted(df.seed.unique()))} --rounds R --local-epochs E` "
        'with R × E as in the column "rounds × epochs". Mean ± sd over seeds; the paper trains '
        "300 rounds × 5 local epochs. Non-IID split: PBMC 2 cell types per site, bladder 4.",
        "",
    ]
    for name, group in df.groupby("dataset", sort=False):
        out += [
            f"## {name}",
            "",
            "| method | rounds × epochs | ARI | NMI | silhouette | s / round | n | paper ARI / NMI / sil. |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for method in [*METHODS, *SCALED_METHODS, CENTRALIZED_SCALED, *DP_METHODS]:
            rows = group[group.method == method]
            for (rounds, epochs), g in rows.groupby(["rounds", "local_epochs"], dropna=False):
                out.append(_row(name, method, rounds, epochs, g))
        out.append("")
    return "\n".join(out)


def _row(name: str, method: str, rounds, epochs, g) -> str:
    """One table row: a method at one training length, mean ± sd over its seeds."""
    import pandas as pd

    no_training = pd.isna(rounds) or method == "PCA+KMeans"
    length = "—" if no_training else f"{int(rounds)} × {int(epochs)}"
    cells = [
        f"{g[m].mean():.3f} ± {g[m].std():.3f}" if len(g) > 1 else f"{g[m].mean():.3f}"
        for m in ("ari", "nmi", "silhouette")
    ]
    has_rounds = "seconds_per_round" in g and g.seconds_per_round.notna().any()
    spr = f"{g.seconds_per_round.mean():.1f}" if has_rounds else ""
    paper = PAPER.get((name, SCALED_METHODS.get(method, method)), "")
    return f"| {method} | {length} | " + " | ".join(cells) + f" | {spr} | {len(g)} | {paper} |"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=250)  # fit_federated's defaults
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/federated.jsonl")
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
    else:
        run(args)


if __name__ == "__main__":
    main()
