r"""The proven private clustering in one call (``dpsc.tl.cluster``) on every labelled count file.

Rows per data set and ε: ``dpsc.tl.cluster`` (secret noise, final result, labels for scoring only),
its no-noise limit (``epsilon=None``: the same design without noise, so that the cost of the design
and the cost of the noise are separate lines), and the non-private reference: scanpy's
``normalize_total`` + ``log1p`` + ``highly_variable_genes`` (2000, when there are more genes) +
``pca`` (16) + scikit-learn k-means. k is the number of labelled types (public for a benchmark).

    python benchmarks/cluster_benchmark.py --data ../shared/data \
        --out benchmarks/results/cluster.jsonl --runs 3
    python benchmarks/cluster_benchmark.py --data ../shared/data \
        --out benchmarks/results/cluster.jsonl --runs 3 --baselines
    python benchmarks/cluster_benchmark.py --report benchmarks/results/cluster.jsonl

``--baselines`` runs the two DP peers instead, on the files with at most 5,000 genes (both read a
dense genes × genes matrix and have no gene selection): Analyze Gauss (Dwork, Talwar, Thakurta &
Zhang 2014; one Gaussian release of :math:`\sum_i z_i z_i^\top` over the unit-norm log1p(CP10k)
cells, all genes, the top 16 eigenvectors with the first kept) followed by (a) the package's DP
k-means with the plan of ``shared/tools/dp_baseline.py`` (the *quick baseline*: k-means noise
multiplier 20, 4 sketch releases, 4 Lloyd rounds of 2, oversampling 3; the PCA σ the smallest that
keeps the composition in one RDP accountant within ε) or (b) diffprivlib's k-means (pure ε/2 on the
projections, bounds ±1; the PCA at ε/2 and δ; basic composition).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

warnings.filterwarnings("ignore")
FILES = {
    "pbmc": "pbmc_10x_4k_top2000.h5",
    "bladder": "mouse_bladder_top2000.h5",
    "bladder_allgenes": "mouse_bladder_2100cells_allgenes.h5",
    "paul15": "paul15_bone_marrow_counts.h5ad",
    "pancreas": "pancreas_endocrinogenesis_counts.h5ad",
}


def load(data: Path, name: str):
    import anndata as ad

    import dpsc

    path = data / FILES[name]
    if path.suffix == ".h5":
        adata = dpsc.datasets.read_h5(path)
    else:
        adata = ad.read_h5ad(path)
        adata.obs["label"] = adata.obs["cell_type"]
    adata.obs["label"] = adata.obs["label"].astype(str)
    return adata


def per_file_parser(doc: str, out: str) -> argparse.ArgumentParser:
    """The arguments of a per-file benchmark: data, files, ε grid, runs, output, report."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--datasets", nargs="+", default=list(FILES))
    parser.add_argument("--epsilons", nargs="+", type=float, default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--report", type=Path, default=None, help="Print the table of a results file.")
    parser.add_argument("--append", action="store_true", help="Append to --out instead of replacing it.")
    return parser


def per_file_main(doc: str, out: str, report, run) -> None:
    """Command line of a per-file benchmark: ``--report`` prints ``report(path)``, else runs ``run``."""
    args = per_file_parser(doc, out).parse_args()
    if args.report:
        print(report(args.report), end="")
        return
    write_per_file(args, run)


def write_per_file(args: argparse.Namespace, run) -> None:
    """Write ``run(data, name, epsilons, runs, commit)``'s rows as JSON lines, per file (``.gz``: gzip)."""
    import gzip
    import json
    import subprocess

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    commit = head.stdout.strip()
    opener = gzip.open if str(args.out).endswith(".gz") else open
    with opener(args.out, "at" if args.append else "wt") as handle:
        for name in args.datasets:
            for row in run(args.data, name, args.epsilons, args.runs, commit):
                handle.write(json.dumps(row) + "\n")
            handle.flush()
            print(f"{name} done", flush=True)


def score(truth, pred) -> dict:
    return {
        "ari": adjusted_rand_score(truth, pred),
        "nmi": normalized_mutual_info_score(truth, pred),
        "clusters_used": len(np.unique(pred)),
    }


def seeded_cluster_rows(
    adata, truth, name: str, epsilon: float, variant: str, runs: int, **extra
) -> list[dict]:
    """``tl.cluster`` with k = the number of labels and noise seeds 20, 21, …: one scored row per run."""
    import dpsc

    k = len(set(truth))
    rows = []
    for run_index in range(runs):
        cells = adata.copy()
        dpsc.tl.cluster(cells, k, epsilon=epsilon, noise_seed=20 + run_index)
        labels = cells.obs["dp_cluster"].to_numpy()
        row = {"dataset": name, "epsilon": epsilon, "variant": variant, "run": run_index}
        rows.append({**row, **score(truth, labels), "n_clusters": k, **extra})
    return rows


def variant_table_rows(rows: list[dict], variants, used_text) -> list[str]:
    """Markdown rows ``| file | k | ε | ARI / NMI (clusters used) | …`` of seeded variant runs.

    One row per file and ε (files in their order, ε decreasing), one cell per variant: the mean
    ARI and NMI over its runs and ``used_text(clusters used in each run)``.
    """
    import statistics
    from collections import defaultdict

    cells = defaultdict(list)
    for row in rows:
        cells[(row["dataset"], row["epsilon"], row["variant"])].append(row)
    lines = []
    for name in dict.fromkeys(row["dataset"] for row in rows):
        for epsilon in sorted({row["epsilon"] for row in rows}, reverse=True):
            parts = []
            for variant in variants:
                group = cells[(name, epsilon, variant)]
                ari = statistics.mean(r["ari"] for r in group)
                nmi = statistics.mean(r["nmi"] for r in group)
                parts.append(f"{ari:.3f} / {nmi:.3f} ({used_text([r['clusters_used'] for r in group])})")
            k = cells[(name, epsilon, next(iter(variants)))][0]["n_clusters"]
            lines.append(f"| {name} | {k} | {epsilon:g} | " + " | ".join(parts) + " |")
    return lines


def scanpy_reference(adata, k: int, seed: int) -> np.ndarray:
    import scanpy as sc
    from sklearn.cluster import KMeans

    cells = adata.copy()
    sc.pp.normalize_total(cells, target_sum=1e4)
    sc.pp.log1p(cells)
    if cells.n_vars > 2000:
        sc.pp.highly_variable_genes(cells, n_top_genes=2000, subset=True)
    sc.pp.pca(cells, n_comps=16, random_state=seed)
    return KMeans(k, n_init=10, random_state=seed).fit_predict(cells.obsm["X_pca"])


QUICK_KMEANS = {"n_sketch_steps": 4, "n_lloyd_rounds": 4, "steps_per_round": 2, "oversampling": 3}
QUICK_KMEANS_SIGMA = 20.0
BASELINE_COMPONENTS = 16
DELTA = 1e-5
MAX_BASELINE_GENES = 5000


def analyze_gauss(adata, sigma: float) -> np.ndarray:
    """Projections of the unit-norm cells on the top eigenvectors of one Gaussian release (all genes)."""
    from dpsc.methods import pca as _pca
    from dpsc.privacy import NoiseSource

    loadings, _, _ = _pca.released_loadings(
        adata.X, sigma, NoiseSource().stream("baseline.pca"), BASELINE_COMPONENTS, None, False
    )
    return _pca.project(adata.X, loadings).astype(np.float64)


def quick_baseline(adata, k: int, epsilon: float, seed: int) -> np.ndarray:
    """Analyze Gauss + the package's DP k-means at ``shared/tools/dp_baseline.py``'s plan."""
    import torch

    from dpsc.methods.kmeans import central_table_release, dp_kmeans_centroids, kmeans_release_steps
    from dpsc.privacy import NoiseSource, history_epsilon

    plan = QUICK_KMEANS
    steps = kmeans_release_steps(plan["n_sketch_steps"], plan["n_lloyd_rounds"], plan["steps_per_round"])
    kmeans_part = (QUICK_KMEANS_SIGMA, 1.0, steps)
    low, high = 0.2, 200.0  # the smallest PCA sigma that keeps the composition within epsilon
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (
            (mid, high) if history_epsilon([(mid, 1.0, 1), kmeans_part], DELTA) > epsilon else (low, mid)
        )
    points = torch.as_tensor(analyze_gauss(adata, high))
    noise = NoiseSource()
    centroids = dp_kmeans_centroids(
        central_table_release(
            points,
            clip_norm=1.0,
            count_scale=1.0,
            noise_multiplier=QUICK_KMEANS_SIGMA,
            draw_stream=lambda: noise.stream("baseline.kmeans"),
        ),
        k,
        points.shape[1],
        noise_multiplier=QUICK_KMEANS_SIGMA,
        clip_norm=1.0,
        random_state=seed,
        **plan,
    )
    return torch.cdist(points.float(), torch.as_tensor(centroids)).argmin(1).numpy()


def diffprivlib_baseline(adata, k: int, epsilon: float, seed: int) -> np.ndarray:
    """Analyze Gauss at (ε/2, δ) + diffprivlib's k-means at pure ε/2 (basic composition)."""
    from diffprivlib.models import KMeans as DPKMeans

    from dpsc.privacy import calibrate_noise_multiplier

    points = analyze_gauss(adata, calibrate_noise_multiplier(epsilon / 2, DELTA, 1.0, 1))
    model = DPKMeans(n_clusters=k, epsilon=epsilon / 2, bounds=(-1.0, 1.0), random_state=seed)
    return model.fit(points).predict(points)


BASELINES = {
    "quick DP baseline (Analyze Gauss + DP k-means)": quick_baseline,
    "Analyze Gauss + diffprivlib k-means": diffprivlib_baseline,
}


def baseline_rows(adata, k: int, epsilons: list[float], run: int) -> list[dict]:
    """One row per baseline and ε (secret noise; labels only score)."""
    rows = []
    for eps in epsilons:
        for method, fit in BASELINES.items():
            start = time.perf_counter()
            pred = fit(adata, k, eps, run)
            rows.append(
                {
                    "method": method,
                    "epsilon": eps,
                    **score(adata.obs["label"], pred),
                    "wall_s": time.perf_counter() - start,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--datasets", nargs="+", default=list(FILES))
    parser.add_argument("--epsilons", nargs="+", type=float, default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baselines", action="store_true", help="run the two DP peers instead")
    parser.add_argument("--report", type=Path)
    parser.add_argument("--plot", type=Path, help="with --report: write ARI against ε per data set here")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        if args.plot:
            plot(args.report, args.plot)
        return
    import torch

    import dpsc

    torch.set_num_threads(2)
    for name in args.datasets:
        adata = load(args.data, name)
        k = adata.obs["label"].nunique()
        for run in range(args.runs):
            if args.baselines:
                if adata.n_vars > MAX_BASELINE_GENES:
                    print(f"{name}: {adata.n_vars} genes; the baselines read a dense genes x genes matrix")
                    break
                write_rows(args.out, baseline_rows(adata, k, args.epsilons, run), name, run, k, adata)
                continue
            rows = []
            start = time.perf_counter()
            pred = scanpy_reference(adata, k, run)
            rows.append(
                {
                    "method": "scanpy PCA + k-means (no privacy)",
                    "epsilon": "inf",
                    **score(adata.obs["label"], pred),
                    "wall_s": time.perf_counter() - start,
                }
            )
            for eps in [*args.epsilons, None]:
                cells = adata.copy()
                start = time.perf_counter()
                dpsc.tl.cluster(cells, k, epsilon=eps, random_state=run)
                rows.append(
                    {
                        "method": "tl.cluster" if eps is not None else "tl.cluster, no noise (design limit)",
                        "epsilon": "inf" if eps is None else eps,
                        **score(cells.obs["label"], cells.obs["dp_cluster"]),
                        "wall_s": time.perf_counter() - start,
                        "epsilon_spent": float(dpsc.privacy.spent(cells).epsilon),
                    }
                )
            write_rows(args.out, rows, name, run, k, adata)


def write_rows(out_path: Path, rows: list[dict], name: str, run: int, k: int, adata) -> None:
    """Append ``rows`` (one fit each) to the JSON lines file, with the data set's keys."""
    with out_path.open("a") as out:
        for row in rows:
            row.update(dataset=name, run=run, k=k, n_obs=adata.n_obs, n_vars=adata.n_vars)
            out.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


def report(path: Path) -> str:
    rows = pd.DataFrame([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    rows["epsilon"] = rows["epsilon"].astype(str)
    table = rows.groupby(["dataset", "method", "epsilon"]).agg(
        ari=("ari", "mean"), sd=("ari", "std"), clusters=("clusters_used", "mean"), runs=("run", "count")
    )
    reference = rows[rows["method"].str.startswith("scanpy")].groupby("dataset")["ari"].mean()
    lines = [
        "| data | method | ε | ARI | ratio to scanpy | clusters used | runs |",
        "|---|---|---|---|---|---|---|",
    ]
    table = table.sort_index(key=lambda level: level.map(float) if level.name == "epsilon" else level)
    for (data, method, eps), r in table.iterrows():
        lines.append(
            f"| {data} | {method} | {eps} | {r['ari']:.3f} ± {np.nan_to_num(r['sd']):.3f} | "
            f"{r['ari'] / reference[data]:.2f} | {r['clusters']:.1f} | {int(r['runs'])} |"
        )
    ratios = table.reset_index()
    ratios = ratios[ratios["method"] == "tl.cluster"].assign(
        ratio=lambda t: t["ari"] / t["dataset"].map(reference)
    )
    mean = ratios.groupby("epsilon")["ratio"].agg(["mean", "min"])
    lines.append("")
    lines.append("Mean ratio of `tl.cluster` to scanpy over the data sets (and the lowest file):")
    for eps, r in mean.sort_index(key=lambda level: level.map(float)).iterrows():
        lines.append(f"- ε = {eps}: {r['mean']:.2f} (lowest {r['min']:.2f})")
    lines += ["", *_against_baselines(table)]
    return "\n".join(lines)


def _against_baselines(table: pd.DataFrame) -> list[str]:
    """Per data set and ε where the baselines ran: ``tl.cluster``'s mean ARI minus each baseline's."""
    ari = table["ari"].unstack("method")
    ours = ari["tl.cluster"]
    lines = ["`tl.cluster` mean ARI minus each DP peer's, per data set and ε (where the peers ran):"]
    for method in (m for m in BASELINES if m in ari):
        gap = (ours - ari[method]).dropna()
        behind = ", ".join(f"{d} ε = {e} ({g:+.3f})" for (d, e), g in gap[gap < 0].items()) or "none"
        ahead = int((gap > 0).sum())
        lines.append(f"- {method}: ahead in {ahead} of {len(gap)} (mean {gap.mean():+.3f}); behind: {behind}")
    return lines


def plot(path: Path, out: Path) -> None:
    """ARI of ``tl.cluster`` against ε per data set, with its no-noise limit and scanpy's ARI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = pd.DataFrame([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    names = sorted(rows["dataset"].unique())
    fig, axes = plt.subplots(1, len(names), figsize=(3.0 * len(names), 2.8), sharey=True)
    for ax, name in zip(np.atleast_1d(axes), names, strict=True):
        data = rows[rows["dataset"] == name]
        private = data[data["method"] == "tl.cluster"].groupby("epsilon")["ari"].agg(["mean", "std"])
        eps = private.index.astype(float)
        ax.errorbar(eps, private["mean"], yerr=private["std"], marker="o", capsize=3, label="tl.cluster")
        limit = data[data["method"].str.contains("no noise")]["ari"].mean()
        scanpy = data[data["method"].str.startswith("scanpy")]["ari"].mean()
        ax.axhline(limit, color="tab:orange", ls="--", label="same design, no noise")
        ax.axhline(scanpy, color="gray", ls=":", label="scanpy, no privacy")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(eps), [f"{e:g}" for e in sorted(eps)])
        ax.set_title(name)
        ax.set_xlabel("ε (composed)")
    np.atleast_1d(axes)[0].set_ylabel("ARI")
    np.atleast_1d(axes)[-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
