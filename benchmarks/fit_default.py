"""The default ``dpsc.tl.fit`` (proven: DP-SGD on the encoder, decoder fixed) on the six labelled files.

For each labelled count file: ``tl.fit(adata, epsilon, n_clusters=k)`` with every default
(secret noise, ``--runs`` runs per ε), the same call without privacy (``epsilon=None``, one run),
and ``tl.cluster`` at the same ε for comparison; ARI and NMI against the labels (scoring only),
the clusters the labels use, the fit's recorded guarantee, and wall time (one process, the thread
count set by ``OMP_NUM_THREADS``; one warm-up fit of each kind first). The non-private fit reads
the genes with counts (it refuses the others). No constant is chosen here, so every file is held
out.
The scanpy reference is the clustering issue's (``cluster_lofo.scanpy_reference``). Each private
call's row also holds the kNN label purity (k = 15, Euclidean; labels for scoring only) of its
embedding: the model's ``obsm["X_dpdcan"]`` for ``tl.fit``, the clustering's points
``obsm["X_dp_cluster"]`` for ``tl.cluster`` (what the fit starts from): the share of each cell's
15 nearest cells that carry its label, averaged. ``--no-baseline`` leaves out the non-private fit.
``--first-run N`` numbers the runs from N and keeps no timing: more runs appended to the file, e.g.
from two processes sharing the cores (the table's seconds come from the runs numbered from 0).

    OMP_NUM_THREADS=2 python benchmarks/fit_default.py --data ../shared/data \
        --out benchmarks/results/fit_default.jsonl
    OMP_NUM_THREADS=1 python benchmarks/fit_default.py --data ../shared/data --runs 17 --first-run 3 \
        --no-baseline --datasets pbmc paul15 cite_cbmc --out benchmarks/results/fit_default.jsonl
        # and --datasets bladder bladder_allgenes pancreas in a second process
    python benchmarks/fit_default.py --report benchmarks/results/fit_default.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from cluster_benchmark import FILES, load, score
from cluster_lofo import scanpy_reference

FILES["cite_cbmc"] = "cite_cbmc_top2000.h5"


#: Neighbours of the embeddings' kNN label purity.
PURITY_NEIGHBOURS = 15


def knn_purity(points: np.ndarray, labels: np.ndarray, k: int = PURITY_NEIGHBOURS) -> float:
    """Mean share of each cell's ``k`` nearest other cells (Euclidean) that carry its label."""
    from sklearn.neighbors import NearestNeighbors

    points = np.asarray(points, dtype=np.float64)
    _, neighbours = NearestNeighbors(n_neighbors=k + 1).fit(points).kneighbors(points)
    return float((labels[neighbours[:, 1:]] == labels[:, None]).mean())


def one_run(
    adata, k: int, epsilon: float | None, method: str, **fit_options
) -> tuple[np.ndarray, float, str, str, dict]:
    """Labels, wall time, recorded guarantee, kept partition and embeddings' purity of one call on a copy.

    ``fit_options`` go to ``tl.fit`` (e.g. its per-stage epochs).
    """
    import dpsc

    cells = adata.copy()
    if epsilon is None and method == "tl.fit":  # the non-private fit refuses genes without counts
        cells = cells[:, np.asarray(cells.X.sum(0)).ravel() > 0].copy()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if method == "tl.fit":
            dpsc.tl.fit(cells, epsilon=epsilon, n_clusters=k, progress_bar=False, **fit_options)
            key, column = "X_dpdcan", "dp_cluster"
        else:
            dpsc.tl.cluster(cells, k, epsilon=epsilon)
            key, column = "dp_cluster", "dp_cluster"
    seconds = time.perf_counter() - start
    partition = cells.uns["dpsc"][key]["params"].get("partition", "")
    embedding = cells.obsm["X_dpdcan" if method == "tl.fit" else "X_dp_cluster"]
    purity = {"purity": knn_purity(embedding, cells.obs["label"].to_numpy())} if epsilon is not None else {}
    guarantee = dpsc.privacy.get_record(cells, key)["guarantee"]
    return cells.obs[column].to_numpy(), seconds, guarantee, partition, purity


def run(args: argparse.Namespace) -> None:
    warm = load(args.data, args.datasets[0])[:300]  # imports and first-call costs, outside the timings
    one_run(warm, 3, None, "tl.fit")
    one_run(warm, 3, 8.0, "tl.fit")
    for name in args.datasets:
        adata = load(args.data, name)
        truth = adata.obs["label"].to_numpy()
        k = len(np.unique(truth))
        reference = score(truth, scanpy_reference(adata, k))["ari"]
        plan = [("tl.fit", None, 1)] if args.baseline else []
        plan += [(method, eps, args.runs) for eps in args.epsilons for method in ("tl.fit", "tl.cluster")]
        for method, epsilon, runs in plan:
            for r in range(args.first_run, args.first_run + runs):
                labels, seconds, guarantee, partition, purity = one_run(adata, k, epsilon, method)
                row = {
                    "dataset": name,
                    "method": method,
                    "epsilon": "none" if epsilon is None else epsilon,
                    "run": r,
                    **score(truth, labels),
                    "n_clusters": k,
                    "scanpy_ari": reference,
                    "seconds": seconds if args.first_run == 0 else None,
                    "guarantee": guarantee,
                    "partition": partition,
                    **purity,
                }
                with args.out.open("a") as out:
                    out.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)


def difference_lines(rows: pd.DataFrame, column: str, title: str) -> list[str]:
    """``column`` of ``tl.fit`` against ``tl.cluster`` per file and ε: mean ± sd, runs, difference ± se."""
    scored = rows.dropna(subset=[column]).groupby(["dataset", "epsilon", "method"], sort=False)[column]
    table = scored.agg(["mean", "std", "count"]).unstack("method")
    lines = ["", title, ""]
    lines += [
        "| file | ε | tl.fit | tl.cluster | runs | difference ± se |",
        "|---|---|---|---|---|---|",
    ]
    for (name, eps), row in table.iterrows():
        fit, start = row[("mean", "tl.fit")], row[("mean", "tl.cluster")]
        se = np.sqrt(sum(row[("std", m)] ** 2 / row[("count", m)] for m in ("tl.fit", "tl.cluster")))
        lines.append(
            f"| {name} | {eps} | {fit:.3f} ± {row[('std', 'tl.fit')]:.3f} | {start:.3f} ± "
            f"{row[('std', 'tl.cluster')]:.3f} | {row[('count', 'tl.fit')]:.0f} / "
            f"{row[('count', 'tl.cluster')]:.0f} | {fit - start:+.3f} ± {se:.3f} |"
        )
    return lines


def report(path: Path) -> str:
    rows = pd.DataFrame([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    rows["ratio"] = rows["ari"] / rows["scanpy_ari"]
    rows["partition"] = rows.get("partition", "").fillna("") if "partition" in rows else ""
    lines = [
        "# The default `tl.fit` on the six labelled files",
        "",
        "`dpsc.tl.fit(adata, epsilon, n_clusters=k)` with every default (proven: DP-SGD on the encoder",
        "and centroids, the decoder fixed at its initialisation, 16 DP principal components in),",
        "against `tl.cluster` at the same ε. ARI / scanpy's ARI (the clustering issue's reference), mean",
        "± sd over the runs (secret noise); clusters the labels use (min–max) of k; seconds per call,",
        "2 CPU threads, one process. No constant was chosen on these files for this table. Each",
        "private call also scores its embedding's kNN label purity (below).",
        "",
        "```",
        "OMP_NUM_THREADS=2 python benchmarks/fit_default.py --data ../shared/data \\",
        "    --out benchmarks/results/fit_default.jsonl",
        "python benchmarks/fit_default.py --report benchmarks/results/fit_default.jsonl",
        "```",
        "",
        "| file | k | method | ε | ARI / scanpy | ARI | clusters used | guarantee | model kept "
        "| s per call |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = ["dataset", "method", "epsilon"]
    for (name, method, eps), group in rows.groupby(keys, sort=False):
        used = f"{group.clusters_used.min()}–{group.clusters_used.max()}"
        kept = "" if method != "tl.fit" else f"{(group.partition == 'model').sum()} of {len(group)}"
        lines.append(
            f"| {name} | {group.n_clusters.iloc[0]} | {method} | {eps} | {group.ratio.mean():.2f} ± "
            f"{group.ratio.std(ddof=0):.2f} | {group.ari.mean():.3f} | {used} | {group.guarantee.iloc[0]} | "
            f"{kept} | {group.seconds.median():.1f} |"
        )
    lines += ["", "Mean over the files (ARI / scanpy; lowest file):", ""]
    lines += ["| method | ε | mean | lowest file |", "|---|---|---|---|"]
    per_file = rows.groupby(keys, sort=False).ratio.mean().reset_index()
    for (method, eps), group in per_file.groupby(["method", "epsilon"], sort=False):
        low = group.loc[group.ratio.idxmin()]
        lines.append(f"| {method} | {eps} | {group.ratio.mean():.2f} | {low.ratio:.2f} ({low.dataset}) |")
    private = rows[rows.epsilon != "none"]
    lines += difference_lines(
        private,
        "ari",
        "ARI of the written partition, mean ± sd (the fit's clustering runs at its start share of ε):",
    )
    if "purity" in rows:
        title = (
            f"kNN label purity (k = {PURITY_NEIGHBOURS}) of the fit's `X_dpdcan` and the clustering's "
            "`X_dp_cluster`:"
        )
        lines += difference_lines(private, "purity", title)
    timing = rows[rows.method == "tl.fit"].groupby(["dataset", "epsilon"]).seconds.median().unstack()
    if "none" in timing:
        private = [c for c in timing.columns if c != "none"]
        ratios = (timing[private].div(timing["none"], axis=0)).round(2)
        lines += ["", "Seconds of a private fit / the non-private fit, same file, same run:", ""]
        lines += [ratios.to_markdown()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--datasets", nargs="*", default=list(FILES))
    parser.add_argument("--epsilons", nargs="*", type=float, default=[8.0, 4.0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--first-run",
        type=int,
        default=0,
        help="number the runs from here; above 0 the rows keep no timing (more runs, e.g. two processes)",
    )
    parser.add_argument("--no-baseline", dest="baseline", action="store_false", help="no non-private fit")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if args.report:
        print(report(args.report), end="")
        return
    run(args)


if __name__ == "__main__":
    main()
