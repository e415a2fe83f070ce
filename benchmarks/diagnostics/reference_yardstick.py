"""Two no-noise diagnostics of the reference / private pairs (no release, labels for scoring only).

``--part yardstick``: the spread of the scanpy yardstick itself. The recipe of
``cluster_lofo.scanpy_reference`` (``filter_genes``, ``normalize_total``, ``log1p``, 2,000 variable
genes, ``scale``, PCA 32) on each pair's private cells, then ``KMeans(k, n_init=10)`` with seeds
0–4 (the benchmarks use seed 0): each seed's ARI.

``--part genes``: how many reference genes a representation needs. The reference's
``highly_variable_genes(flavor="seurat")`` at 1,000 / 2,000 / 4,000 / 8,000 genes, the reference's
gene means and standard deviations (clipped at 10), its 16 principal components and the 0.9
radius, as ``dpsc.methods._public_basis`` maps a cell; the private cells' points clustered by
``KMeans(k, n_init=10)`` with seeds 0–2 (mean ARI).

    OMP_NUM_THREADS=1 python benchmarks/diagnostics/reference_yardstick.py --data ../shared/data \\
        --part yardstick
    OMP_NUM_THREADS=1 python benchmarks/diagnostics/reference_yardstick.py --data ../shared/data \\
        --part genes --only "endocrinogenesis→baron" "baron m1→m2" "baron m2→m1"
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cluster_lofo import scanpy_reference
from reference_pairs import pairs


def _dense(matrix) -> np.ndarray:
    return matrix.toarray() if hasattr(matrix, "toarray") else np.asarray(matrix)


def yardstick(private, truth: np.ndarray, k: int) -> str:
    """Each k-means seed's ARI on scanpy's recipe (``cluster_lofo.scanpy_reference``)."""
    from sklearn.metrics import adjusted_rand_score

    scores = [adjusted_rand_score(truth, scanpy_reference(private, k, seed)) for seed in range(5)]
    return f"ARI {np.round(scores, 3).tolist()} (mean {np.mean(scores):.3f})"


def genes(reference, private, truth: np.ndarray, k: int) -> str:
    """Mean ARI of the reference-basis points at each number of reference genes."""
    import scanpy as sc
    from sklearn.cluster import KMeans
    from sklearn.decomposition import PCA
    from sklearn.metrics import adjusted_rand_score

    def logged(cells):
        cells = cells.copy()
        sc.pp.normalize_total(cells, target_sum=1e4)
        sc.pp.log1p(cells)
        return cells

    shared = reference[:, reference.var_names.isin(private.var_names)].copy()
    ref, own = logged(shared), logged(private[:, shared.var_names].copy())
    scores = {}
    for n_genes in (1000, 2000, 4000, 8000):
        ranked = ref.copy()
        sc.pp.highly_variable_genes(ranked, n_top_genes=min(n_genes, ranked.n_vars - 1), flavor="seurat")
        chosen = ranked.var_names[ranked.var["highly_variable"]]
        values = _dense(ranked[:, chosen].X)
        mean, sd = values.mean(0), np.maximum(values.std(0), 1e-6)
        scaled = np.clip((values - mean) / sd, -10, 10)
        pca = PCA(16, random_state=0).fit(scaled)
        radius = np.quantile(np.linalg.norm(pca.transform(scaled), axis=1), 0.9)
        points = pca.transform(np.clip((_dense(own[:, chosen].X) - mean) / sd, -10, 10)) / radius
        points /= np.maximum(np.linalg.norm(points, axis=1, keepdims=True), 1.0)
        runs = [KMeans(k, n_init=10, random_state=s).fit_predict(points) for s in range(3)]
        scores[n_genes] = round(float(np.mean([adjusted_rand_score(truth, r) for r in runs])), 3)
    return f"mean ARI by reference genes {scores}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--part", choices=("yardstick", "genes"), required=True)
    parser.add_argument("--only", nargs="*", default=None, help="pair names to run")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    for name, reference, private in pairs(args.data):
        if args.only and name not in args.only:
            continue
        truth = private.obs["label"].astype(str).to_numpy()
        k = len(np.unique(truth))
        if args.part == "yardstick":
            line = yardstick(private, truth, k)
        else:
            line = genes(reference, private, truth, k)
        print(f"{name}: {line}", flush=True)


if __name__ == "__main__":
    main()
