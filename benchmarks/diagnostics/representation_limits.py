"""Where `tl.cluster`'s no-noise limit loses to scanpy; what closing it costs under noise.

Two parts, six labelled files, labels for scoring only.

``--part ablation`` (no noise, no release: a diagnostic). The clustering issue's scanpy reference
(``filter_genes``, ``normalize_total``, ``log1p``, seurat ``highly_variable_genes``, ``scale``,
PCA 32, ``KMeans(k, n_init=10)``), then one change at a time toward what dpsc computes, each
clustered by scikit-learn's k-means (10 starts, seeds 0–2, mean ARI):

- ``counts per 10^4``: scanpy's steps with each cell's counts scaled to 10^4 (dpsc's public
  constant) instead of the median total; every row below keeps 10^4 unless it says otherwise;
- ``dpsc genes``: the 2,000 genes of largest second moment of the unit-norm log1p(CP10k) cells (the
  statistic ``tl.cluster``'s gene selection ranks by) instead of scanpy's variable genes;
- ``seurat-like genes``: the same statistics ranked by the log dispersion var/mean z-scored within
  20 mean bins (what the seurat flavour does, from means and variances a release gives);
- ``unit rows``: each cell's log1p(CP10k) scaled to unit norm before centring and scaling;
- ``no gene scale``: centred, not scaled;
- ``16 components``; ``cosine``: the PCs scaled to unit norm before k-means;
- ``clip c``: each centred, scaled cell clipped to c times the root-mean-square norm (the bound a
  release of its second moment needs);
- ``dpsc representation``: ``tl.cluster``'s points computed exactly (unit rows, the mean direction
  and 15 residual components, the mean coordinate weighted 0.5, cosine), also with counts per 10^3;
- ``scaled, clip c``: unit rows, seurat-like genes, centred, scaled, clipped to c, 16 components.

``--part noise``: ``tl.cluster`` (``unit``, secret noise) against the scaled representation with
clip c = 1, 2, 3 (``scaled c``) at ε = 1, 2, 4, 8, 32 and without noise (3 runs; 1 without noise):
the gene statistics released at ``tl.cluster``'s σ give each gene's mean and variance (centre,
scale) and the seurat-like ranking of the genes; each cell's scaled row, clipped to c·√G and
divided by it (norm ≤ 1), enters one release of the second moment at the PCA's σ; its top 16
eigenvectors; the projections (norm ≤ 1) go to the same DP k-means plan (euclidean). The prototype
draws seeded numpy noise of the plan's σ (a diagnostic, not a release; the cell sum's share is
left unused).

    OMP_NUM_THREADS=1 python benchmarks/diagnostics/representation_limits.py --part ablation \
        --files pbmc bladder bladder_allgenes --out benchmarks/results/representation_limits.jsonl
    OMP_NUM_THREADS=1 python benchmarks/diagnostics/representation_limits.py --part ablation \
        --files paul15 pancreas cite_cbmc --out benchmarks/results/representation_limits.jsonl
    (the same two with --part noise)
    python benchmarks/diagnostics/representation_limits.py \
        --report benchmarks/results/representation_limits.jsonl > benchmarks/results/representation_limits.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cluster_benchmark import FILES, load, score
from cluster_lofo import scanpy_reference

FILES["cite_cbmc"] = "cite_cbmc_top2000.h5"  # the six labelled count files
MAX_GENES = 2000
EPSILONS = (1.0, 2.0, 4.0, 8.0, 32.0, None)
ABLATIONS = {  # name: (genes, unit rows, gene scale, clip c, components, cosine)
    "counts per 10^4": ("hvg", False, True, 0.0, 32, False),
    "dpsc genes": ("second moment", False, True, 0.0, 32, False),
    "seurat-like genes": ("seurat-like", False, True, 0.0, 32, False),
    "unit rows": ("hvg", True, True, 0.0, 32, False),
    "no gene scale": ("hvg", False, False, 0.0, 32, False),
    "16 components": ("hvg", False, True, 0.0, 16, False),
    "cosine": ("hvg", False, True, 0.0, 32, True),
    "clip 1": ("hvg", False, True, 1.0, 32, False),
    "clip 2": ("hvg", False, True, 2.0, 32, False),
    "clip 3": ("hvg", False, True, 3.0, 32, False),
    "scaled, clip 1": ("seurat-like", True, True, 1.0, 16, False),
    "scaled, clip 2": ("seurat-like", True, True, 2.0, 16, False),
    "scaled, clip 3": ("seurat-like", True, True, 3.0, 16, False),
}


def unit(rows: np.ndarray) -> np.ndarray:
    """Rows scaled to unit norm (a row of zeros stays zero)."""
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def seurat_like(means: np.ndarray, variances: np.ndarray, n_bins: int = 20) -> np.ndarray:
    """Log dispersion log(var/mean) z-scored within ``n_bins`` quantile bins of the log mean."""
    log_mean = np.log(np.maximum(means, 1e-12))
    dispersion = np.log(np.maximum(variances, 1e-12) / np.maximum(means, 1e-12))
    edges = np.quantile(log_mean, np.linspace(0, 1, n_bins + 1))
    bins = np.clip(np.searchsorted(edges, log_mean, side="right") - 1, 0, n_bins - 1)
    scores = np.zeros_like(dispersion)
    for b in range(n_bins):
        members = bins == b
        if members.sum() > 1:
            spread = max(float(dispersion[members].std()), 1e-12)
            scores[members] = (dispersion[members] - dispersion[members].mean()) / spread
    return scores


def log_normalised(adata, target: float = 1e4) -> tuple[np.ndarray, np.ndarray]:
    """log1p of each cell's counts per ``target`` (dense), and scanpy's variable genes of it."""
    import scanpy as sc

    cells = adata.copy()
    sc.pp.filter_genes(cells, min_counts=1)
    sc.pp.normalize_total(cells, target_sum=target)
    sc.pp.log1p(cells)
    variable = cells.copy()
    sc.pp.highly_variable_genes(variable, n_top_genes=min(MAX_GENES, variable.n_vars))
    values = cells.X.toarray() if sp.issparse(cells.X) else np.asarray(cells.X)
    return values.astype(np.float64), variable.var["highly_variable"].to_numpy()


def gene_sets(values: np.ndarray, variable: np.ndarray) -> dict[str, np.ndarray]:
    """The three gene sets of the ablation (each sorted)."""
    rows = unit(values)
    means, variances = rows.mean(0), rows.var(0)
    count = min(MAX_GENES, values.shape[1])
    ranked = {"second moment": variances + means**2, "seurat-like": seurat_like(means, variances)}
    sets = {name: np.sort(np.argsort(score)[::-1][:count]) for name, score in ranked.items()}
    sets["hvg"] = np.flatnonzero(variable)
    return sets


def ablation_points(values, genes, unit_rows, gene_scale, clip, n_comps, cosine) -> np.ndarray:
    """The exact k-means points of one ablation (module docstring)."""
    rows = values[:, genes]
    rows = unit(rows) if unit_rows else rows
    rows = rows - rows.mean(0)
    if gene_scale:
        rows = rows / np.maximum(rows.std(0), 1e-8)
    if clip:
        norms = np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        rows = rows * np.minimum(1.0, clip * np.sqrt((norms**2).mean()) / norms)
    left, singular, _ = np.linalg.svd(rows, full_matrices=False)
    points = left[:, :n_comps] * singular[:n_comps]
    return unit(points) if cosine else points


def dpsc_points(values: np.ndarray, genes: np.ndarray) -> np.ndarray:
    """``tl.cluster``'s k-means points without noise: mean direction, 15 residual PCs, weight 0.5, cosine."""
    from dpsc.methods import _clustering

    rows = unit(values[:, genes])
    direction = unit(rows.sum(0)[None])[0]
    residuals = unit(rows - np.outer(rows @ direction, direction))
    eigenvalues, vectors = np.linalg.eigh(residuals.T @ residuals)
    top = vectors[:, np.argsort(eigenvalues)[::-1][: _clustering.N_COMPS - 1]]
    return unit(np.column_stack([_clustering.MEAN_WEIGHT * (rows @ direction), rows @ top]))


def ablation_rows(adata, truth, name: str) -> list[dict]:
    from sklearn.cluster import KMeans

    k = len(set(truth))
    values, variable = log_normalised(adata)
    sets = gene_sets(values, variable)
    configs = {name: (sets[g], *rest) for name, (g, *rest) in ABLATIONS.items()}
    rows = []
    per_thousand, _ = log_normalised(adata, 1e3)
    exact = {
        "dpsc representation": dpsc_points(values, sets["second moment"]),
        "dpsc representation, per 10^3": dpsc_points(
            per_thousand, gene_sets(per_thousand, variable)["second moment"]
        ),
    }
    for config, args in [*configs.items(), *dict.fromkeys(exact).items()]:
        points = exact[config] if args is None else ablation_points(values, *args)
        aris = [
            score(truth, KMeans(k, n_init=10, random_state=s).fit_predict(points))["ari"] for s in range(3)
        ]
        rows.append(
            {
                "part": "ablation",
                "file": name,
                "variant": config,
                "epsilon": None,
                "ari": float(np.mean(aris)),
            }
        )
    return rows


def scaled_labels(matrix, k: int, epsilon: float | None, clip: float, rng: np.random.Generator) -> np.ndarray:
    """The scaled representation's DP clustering (module docstring), seeded noise of the plan's σ."""
    from dpsc.methods import _clustering, _hvg, _kmeans, _pca

    n, n_vars = matrix.shape
    plan = _clustering.kmeans_plan()
    steps = _clustering.kmeans_steps(plan)
    private = epsilon is not None
    sigma = _clustering._split(epsilon, 1e-5, _clustering.KINDS, steps, "rdp") if private else {}
    n_genes = _clustering.genes_for(n, sigma["pca"], n_vars) if private else min(n_vars, MAX_GENES)
    release = _hvg.gene_statistics_release(n_vars, sigma.get("genes", 0.0))
    sums = _hvg.gene_sums(matrix, True, _hvg.DEFAULT_SQUARE_CLIP)
    if private:
        sums = sums + rng.normal(0.0, release.noise_std, sums.shape)
    means, variances, eligible, _ = _hvg.rank_genes(
        sums, release, _hvg.DEFAULT_SQUARE_CLIP, 3.0, "second_moment"
    )
    floor = max(2 * _hvg.DEFAULT_SQUARE_CLIP * release.noise_std / max(float(sums[-1]), 1.0), 1e-6)
    order = np.lexsort((-seurat_like(np.maximum(means, 1e-9), np.maximum(variances, floor)), ~eligible))
    genes = np.sort(order[:n_genes])
    scale = np.sqrt(np.maximum(variances[genes], floor))
    rows = _pca.unit_rows(matrix[:, genes], True)
    rows = (np.asarray(rows.todense()) if sp.issparse(rows) else np.asarray(rows)) - means[genes]
    rows = rows / scale
    bound = clip * np.sqrt(n_genes)  # each scaled gene has released variance 1: RMS norm sqrt(G)
    norms = np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    rows = rows * np.minimum(1.0, bound / norms) / bound
    second = rows.T @ rows
    if private:
        noise = rng.normal(0.0, sigma["pca"], second.shape)
        second = second + np.triu(noise) + np.triu(noise, 1).T
    eigenvalues, vectors = np.linalg.eigh(second)
    points = rows @ vectors[:, np.argsort(eigenvalues)[::-1][:16]]

    def release_table(assignment):
        table = _kmeans.kmeans_table(points, assignment, 1.0, plan["count_scale"])
        if private:
            spread = sigma["kmeans"] * _kmeans.table_sensitivity(1.0, plan["count_scale"])
            table = table + rng.normal(0.0, spread, table.shape)
        return _kmeans.split_table(table, assignment.n_rows, points.shape[1], 1.0, plan["count_scale"])

    centroids = _kmeans.dp_kmeans_centroids(
        release_table, k, points.shape[1], noise_multiplier=sigma.get("kmeans", 1e-9), clip_norm=1.0, **plan
    )
    return _kmeans._nearest(points, centroids)


def noise_rows(adata, truth, name: str, runs: int) -> list[dict]:
    import dpsc

    k = len(set(truth))
    rows = []
    for epsilon in EPSILONS:
        for variant in ("unit", "scaled 1", "scaled 2", "scaled 3"):
            for run in range(1 if epsilon is None else runs):
                if variant == "unit":
                    cells = adata.copy()
                    dpsc.tl.cluster(cells, k, epsilon=epsilon, random_state=run)
                    labels = cells.obs["dp_cluster"].to_numpy()
                else:
                    clip = float(variant.split()[1])
                    labels = scaled_labels(adata.X, k, epsilon, clip, np.random.default_rng(100 + run))
                scores = score(truth, labels)
                rows.append(
                    {
                        "part": "noise",
                        "file": name,
                        "variant": variant,
                        "epsilon": epsilon,
                        "run": run,
                        "ari": scores["ari"],
                        "nmi": scores["nmi"],
                    }
                )
    return rows


def report(path: Path) -> str:
    table = pd.read_json(path, lines=True)
    reference = table[table["variant"] == "scanpy reference"].groupby("file")["ari"].first()
    table = table[table["variant"] != "scanpy reference"].copy()
    table["ratio"] = table["ari"] / table["file"].map(reference)
    files = list(dict.fromkeys(table["file"]))
    lines = [
        "# `tl.cluster`'s no-noise limit: where it loses to scanpy, and the price of closing it",
        "",
        "Made by `benchmarks/diagnostics/representation_limits.py` (its docstring states every variant",
        "and the commands) with the dpsc package of commit "
        + ", ".join(sorted(set(table["commit"])))
        + ". Cells: ARI / the scanpy",
        "reference's ARI (`KMeans(random_state=0)`, the clustering issue's ratio).",
        "",
        "## No noise, one change at a time from scanpy (scikit-learn k-means, mean of seeds 0–2)",
        "",
        "| variant | " + " | ".join(files) + " |",
        "|---|" + "---|" * len(files),
    ]
    ablation = table[table["part"] == "ablation"].pivot_table(index="variant", columns="file", values="ratio")
    order = [*ABLATIONS, "dpsc representation", "dpsc representation, per 10^3"]
    for variant in [v for v in order if v in ablation.index]:
        lines.append(f"| {variant} | " + " | ".join(f"{ablation.loc[variant, f]:.2f}" for f in files) + " |")
    noise = table[table["part"] == "noise"].copy()
    if noise.empty:
        return "\n".join(lines) + "\n"
    noise["epsilon"] = noise["epsilon"].fillna(np.inf)
    mean = noise.groupby(["file", "variant", "epsilon"], sort=False)["ratio"].mean().reset_index()
    epsilons = sorted(mean["epsilon"].unique())
    head = " | ".join("no noise" if e == np.inf else f"ε = {e:g}" for e in epsilons)
    lines += [
        "",
        "## Under noise: `tl.cluster` (unit) against the scaled representation (3 runs; 1 without noise)",
        "",
        "| file | variant | " + head + " |",
        "|---|---|" + "---|" * len(epsilons),
    ]
    for (file, variant), group in mean.groupby(["file", "variant"], sort=False):
        cells = group.set_index("epsilon")["ratio"]
        lines.append(
            f"| {file} | {variant} | " + " | ".join(f"{cells.get(e, np.nan):.2f}" for e in epsilons) + " |"
        )
    overall = mean.groupby(["variant", "epsilon"])["ratio"].mean().unstack()
    lines += ["", "Mean over the files:", "", "| variant | " + head + " |", "|---|" + "---|" * len(epsilons)]
    for variant, values in overall.iterrows():
        lines.append(f"| {variant} | " + " | ".join(f"{values.get(e, np.nan):.2f}" for e in epsilons) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--part", choices=("ablation", "noise"), default="ablation")
    parser.add_argument("--files", nargs="+", default=list(FILES))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if args.report:
        print(report(args.report), end="")
        return
    warnings.filterwarnings("ignore")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    for name in args.files:
        adata = load(args.data, name)
        truth = adata.obs["label"].to_numpy()
        reference = score(truth, scanpy_reference(adata, len(set(truth))))["ari"]
        rows = [
            {
                "part": args.part,
                "file": name,
                "variant": "scanpy reference",
                "epsilon": None,
                "ari": reference,
            }
        ]
        rows += (
            ablation_rows(adata, truth, name)
            if args.part == "ablation"
            else noise_rows(adata, truth, name, args.runs)
        )
        with args.out.open("a") as handle:
            for row in rows:
                handle.write(json.dumps({**row, "commit": commit}) + "\n")
        print(f"{name}: {len(rows)} rows", flush=True)


if __name__ == "__main__":
    main()
