"""How far any representation of a reference's genes can go on a pair, and what the other genes add.

The cross-study pair of ``reference_pairs.py`` (the developing-pancreas reference of adult Baron
cells) is the one pair below 0.8 of scanpy. This diagnostic asks whether any lever on the
clustering could lift it, without noise first (labels score only; k-means: scikit-learn, 10
starts, k = the number of labels):

- ``reference basis``: the shipped public map (the reference's variable genes, scales and 16
  components, :mod:`dpsc.methods._public_basis`), no release: the ceiling of every
  reference-guided start and k-means on that pair;
- ``+ residual, unit rows``: the same points beside 8 principal components of the private cells'
  genes the reference lacks, in the representation the private releases use (unit-norm
  log1p(CP10k) rows, genes ranked by their second moment: :mod:`dpsc.methods._pca`), exact;
- ``+ residual, scaled``: the same with scanpy's representation of those genes (2,000 genes by
  normalised dispersion, each scaled to unit variance, clipped at 10, rows in the ball of the
  0.9 quantile of their norms), exact and with Gaussian noise of sd σ on the second-moment
  matrix the components come from (σ = 0.5, 1: the PCA release's scale at ε = 8 is about 1);
- the top eigenvalues of that second moment beside the noise's spectral norm, about 2σ√G.

``--part seeds``: the shipped gated clustering against ``tl.cluster`` without a reference on the
same pair, ε = 8 and 2, noise seeds 20–31 (12 runs): whether the ε = 2 gap of the 3-run table
is more than run-to-run noise.

    OMP_NUM_THREADS=2 python benchmarks/diagnostics/reference_gene_ceiling.py --data ../shared/data \\
        --part ceiling > /tmp/ceiling.md
    OMP_NUM_THREADS=1 python benchmarks/diagnostics/reference_gene_ceiling.py --data ../shared/data \\
        --part seeds > /tmp/seeds.md
    cat /tmp/ceiling.md /tmp/seeds.md > benchmarks/results/reference_gene_ceiling.md
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference_pairs import pairs

CROSS = "endocrinogenesis→baron"
SEEDS = tuple(range(20, 32))


def _kmeans_ari(points: np.ndarray, truth: np.ndarray) -> float:
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score

    k = len(np.unique(truth))
    return float(adjusted_rand_score(truth, KMeans(k, n_init=10, random_state=0).fit_predict(points)))


def _ball(rows: np.ndarray) -> np.ndarray:
    from dpsc.methods._public_basis import to_ball

    return to_ball(rows, float(np.quantile(np.linalg.norm(rows, axis=1), 0.9)))


def _noisy_components(second: np.ndarray, sigma: float, n_comps: int, seed: int) -> np.ndarray:
    """Top eigenvectors of the second moment with symmetric Gaussian noise of sd ``sigma`` added."""
    noise = np.triu(np.random.default_rng(seed).normal(0.0, sigma, second.shape))
    _, vectors = np.linalg.eigh(second + noise + np.triu(noise, 1).T)
    return vectors[:, ::-1][:, :n_comps]


def _scaled_rows(counts: np.ndarray, n_genes: int) -> np.ndarray:
    """Scanpy's representation of ``counts``: log1p(CP10k), top genes by dispersion, scaled and clipped."""
    logged = np.log1p(counts / np.maximum(counts.sum(1, keepdims=True), 1.0) * 1e4)
    mean = logged.mean(0)
    variance = np.maximum((logged**2).mean(0) - mean**2, 1e-3)
    top = np.argsort(np.where(mean > 0.01, variance / np.maximum(mean, 1e-3), -1.0))[::-1][:n_genes]
    return _ball(np.clip((logged[:, top] - mean[top]) / np.sqrt(variance[top]), -10, 10))


def ceiling(reference, private, name: str) -> list[dict]:
    """The no-noise ceilings of the module docstring for one pair."""
    from dpsc.methods._pca import unit_rows
    from dpsc.methods._public_basis import basis_from_reference, top_components

    truth = private.obs["label"].to_numpy()
    genes = reference.var_names.intersection(private.var_names)
    basis = basis_from_reference(
        reference.X,
        reference.var_names.get_indexer(genes),
        private.var_names.get_indexer(genes),
        2000,
        16,
    )
    public = np.asarray(basis.points(private.X))
    row = {"pair": name, "shared genes": len(genes)}
    rows = [{**row, "representation": "reference basis", "σ": 0.0, "ARI": _kmeans_ari(public, truth)}]
    other = np.flatnonzero(~private.var_names.isin(genes))
    if len(other) < 100:
        return rows
    counts = private.X[:, other]
    counts = counts.toarray() if hasattr(counts, "toarray") else np.asarray(counts, dtype=float)
    unit = unit_rows(counts)
    unit = unit.toarray() if hasattr(unit, "toarray") else unit
    top = np.argsort((unit**2).sum(0))[::-1][:2000]
    unit = unit[:, top] / np.maximum(np.linalg.norm(unit[:, top], axis=1, keepdims=True), 1e-12)
    residual = _ball(unit @ top_components(unit, 8))
    both = np.hstack([public, residual]) / np.sqrt(2)
    rows.append({**row, "representation": "+ residual, unit rows", "σ": 0.0, "ARI": _kmeans_ari(both, truth)})
    scaled = _scaled_rows(counts, 2000)
    second = scaled.T @ scaled
    eigen = np.linalg.eigvalsh(second)[::-1]
    for sigma in (0.0, 0.5, 1.0):
        residual = _ball(scaled @ _noisy_components(second, sigma, 8, seed=1))
        rows.append(
            {
                **row,
                "representation": "+ residual, scaled",
                "σ": sigma,
                "ARI": _kmeans_ari(np.hstack([public, residual]) / np.sqrt(2), truth),
                "top eigenvalues": ", ".join(f"{v:.0f}" for v in eigen[:4]),
                "noise norm ≈ 2σ√G": f"{2 * sigma * np.sqrt(scaled.shape[1]):.0f}",
            }
        )
    return rows


def seeds(reference, private) -> pd.DataFrame:
    """The gated clustering and the one without a reference, 12 noise seeds each, both ε."""
    from sklearn.metrics import adjusted_rand_score

    import dpsc

    truth = private.obs["label"].to_numpy()
    k = len(np.unique(truth))
    shared = reference[:, reference.var_names.isin(private.var_names)]
    rows = []
    for epsilon in (8.0, 2.0):
        for seed in SEEDS:
            alone, guided = private.copy(), private.copy()
            dpsc.tl.cluster(alone, k, epsilon=epsilon, noise_seed=seed)
            dpsc.tl.cluster(
                guided, k, epsilon=epsilon, reference=shared, reference_key="label", noise_seed=seed
            )
            rows.append(
                {
                    "ε": epsilon,
                    "seed": seed,
                    "no reference": adjusted_rand_score(truth, alone.obs["dp_cluster"]),
                    "reference": adjusted_rand_score(truth, guided.obs["dp_cluster"]),
                    "pca σ": alone.uns["dpsc"]["dp_cluster"]["privacy"]["noise_multipliers"]["pca"],
                }
            )
    return pd.DataFrame(rows)


def _seeds_report(table: pd.DataFrame) -> str:
    lines = [
        "",
        f"## `{CROSS}`: the reference against none over {len(SEEDS)} noise seeds",
        "",
        "| ε | no reference | reference (gated) | paired difference ± se | PCA σ, no reference |",
        "|---|---|---|---|---|",
    ]
    for epsilon, runs in table.groupby("ε", sort=False):
        difference = runs["reference"] - runs["no reference"]
        se = difference.std(ddof=1) / np.sqrt(len(difference))
        lines.append(
            f"| {epsilon:g} | {runs['no reference'].mean():.3f} | {runs['reference'].mean():.3f} | "
            f"{difference.mean():+.3f} ± {se:.3f} | {runs['pca σ'].mean():.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--part", choices=("ceiling", "seeds"), required=True)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.part == "seeds":
        for name, reference, private in pairs(args.data):
            if name == CROSS:
                print(_seeds_report(seeds(reference, private)))
        return
    rows = [row for name, reference, private in pairs(args.data) for row in ceiling(reference, private, name)]
    print("# What a reference's genes allow: no-noise ceilings, and the private genes beside them\n")
    print("k-means (10 starts) ARI on the private cells without any noise unless σ says; labels score only.")
    print("Command and representations: `benchmarks/diagnostics/reference_gene_ceiling.py`.\n")
    print(pd.DataFrame(rows).fillna("").to_markdown(index=False, floatfmt=".2f"))


if __name__ == "__main__":
    main()
